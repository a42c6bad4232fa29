import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// Tells an SQLCipher database from other files without its key, by what its format shows: a
/// first page that is all salt and ciphertext. SQLCipher encrypts every page, header included, so
/// the file is a whole number of pages (512 bytes at least, a power of two), starts without
/// SQLite's magic or ours, and its first kilobyte is indistinguishable from random bytes.
///
/// A guess, never a proof: a random file of a page multiple looks the same. Used to keep tools
/// from treating an encrypted database as a plain file (`dpctl ls`, the audit's fixes).
public enum SQLCipherFileProbe {
    /// The fewest distinct byte values in the first 1024 bytes of a file taken for ciphertext
    /// (random bytes give about 250; text, a SQLite page or a binary format far fewer).
    static let distinctByteThreshold = 200

    /// Whether the regular file at `path` (never followed if a link) looks like an SQLCipher database.
    public static func looksLikeSQLCipher(atPath path: String) -> Bool {
        guard let st = POSIXFile.linkStatus(path), st.st_mode & S_IFMT == S_IFREG,
            st.st_size >= 1024, st.st_size % 512 == 0,
            let fd = try? POSIXFile.openRegularFile(path)
        else { return false }
        defer { try? fd.close() }
        guard let head = try? POSIXFile.read(fd, count: 1024, at: 0, path: path) else { return false }
        return looksLikeSQLCipher(head: head, size: Int64(st.st_size))
    }

    /// The same judgement from a file's first 1024 bytes and its size (for callers that read
    /// through their own descriptors).
    public static func looksLikeSQLCipher(head: [UInt8], size: Int64) -> Bool {
        guard head.count == 1024, size >= 1024, size % 512 == 0 else { return false }
        if head.starts(with: PageCipher.sqliteMagic) || ProtectedFileHeader.looksProtected(head) { return false }
        return Set(head).count >= distinctByteThreshold
    }
}
