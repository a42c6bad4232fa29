import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// How an item is marked "do not back up" on disk (the backup layer sets and honours the marks;
/// `DataProtectionBackup.BackupExclusionAttribute` is the public face): known here so that every
/// copy and conversion keeps the mark, as it keeps the class.
package enum BackupMark {
    /// The extended attribute (freedesktop's `user.xdg.robots.backup`).
    package static let attribute = "user.xdg.robots.backup"
    /// A cache directory tag's name.
    package static let cacheDirectoryTagName = "CACHEDIR.TAG"
    /// The first 43 bytes every cache directory tag starts with (MD5 of ".IsCacheDirectory").
    package static let cacheDirectoryTagSignature = "Signature: 8a477f597d28d172789f06886806bc55"

    /// Whether `path` is a cache directory tag: named `CACHEDIR.TAG`, a regular file (not a link),
    /// starting with the signature. Such a file stays plaintext wherever it goes: `tar`, `restic`
    /// and `borg` read it to leave the directory out (`--exclude-caches`), and it holds nothing.
    package static func isCacheDirectoryTag(_ path: String) -> Bool {
        guard path.split(separator: "/").last.map(String.init) == cacheDirectoryTagName,
            let st = POSIXFile.linkStatus(path), st.st_mode & S_IFMT == S_IFREG,
            let fd = try? POSIXFile.openRegularFile(path)
        else { return false }
        defer { try? fd.close() }
        let signature = Array(cacheDirectoryTagSignature.utf8)
        var prefix = [UInt8](repeating: 0, count: signature.count)
        let n = prefix.withUnsafeMutableBytes { pread(fd.rawValue, $0.baseAddress, signature.count, 0) }
        return n == signature.count && prefix == signature
    }

    /// Gives `destination` the mark `source` carries (nothing when it carries none).
    package static func copy(from source: String, to destination: String) throws {
        guard let value = try POSIXFile.getAttribute(attribute, path: source) else { return }
        try POSIXFile.setAttribute(attribute, value, path: destination)
    }
}
