import DataProtectionKeybag
import DataProtectionSystem
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The system calls an audit makes, each relative to an open directory so a deep tree costs
/// no path walks: `openat`, `fstatat(AT_SYMLINK_NOFOLLOW)`, `readdir`, `readlinkat`, `pread`,
/// `fgetxattr`. Nothing here follows a link or writes.
enum DirectoryReader {
    /// `O_NOATIME` (a GNU extension Glibc's module does not export).
    static let noAccessTime: Int32 = 0o1000000

    /// The names in the directory (not `.` or `..`), as bytes mapped by ``LosslessPath``.
    static func names(_ fd: Int32) -> [String] {
        let copy = dup(fd)
        guard copy >= 0, let stream = fdopendir(copy) else { return [] }
        defer { closedir(stream) }
        rewinddir(stream)   // the copy shares the position of `fd`, which an earlier listing may have moved
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                LosslessPath.string(fromBytes: raw.prefix { $0 != 0 })
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
    static func status(_ directory: Int32, _ name: String) -> stat? {
        var st = stat()
        guard (try? LosslessPath.withCString(name) { fstatat(directory, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0 else {
            return nil
        }
        return st
    }

    /// Opens `name` below `directory` read-only, never following a link (`O_NOFOLLOW`), never
    /// blocking on a FIFO, never updating its access time where the kernel allows.
    static func open(_ directory: Int32, _ name: String, directoryOnly: Bool = false) -> Int32? {
        var flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY
        if directoryOnly { flags |= O_DIRECTORY }
        guard
            let fd = try? LosslessPath.withCString(
                name,
                { path -> Int32 in
                    let fd = openat(directory, path, flags | Self.noAccessTime)
                    return fd >= 0 || errno != EPERM ? fd : openat(directory, path, flags)
                }), fd >= 0
        else { return nil }
        return fd
    }

    /// Up to `count` bytes from the start of the file.
    static func prefix(_ fd: Int32, count: Int) -> [UInt8] { read(fd, count: count, at: 0) }

    /// `count` bytes at `offset`, or fewer at the end.
    static func read(_ fd: Int32, count: Int, at offset: Int64) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset)) }
        return n > 0 ? Array(buffer[..<n]) : []
    }

    /// An extended attribute's value (at most 256 bytes), `nil` when absent.
    static func attribute(_ fd: Int32, _ name: String) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 256)
        guard let n = try? SystemCall.fgetxattr(fd, name, &buffer) else { return nil }
        return Array(buffer[..<n])
    }

    /// Where a symbolic link points, its bytes mapped by ``LosslessPath``.
    static func linkTarget(_ directory: Int32, _ name: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n =
            (try? LosslessPath.withCString(name) { path in
                buffer.withUnsafeMutableBytes {
                    readlinkat(directory, path, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count)
                }
            }) ?? -1
        return n >= 0 ? LosslessPath.string(fromBytes: buffer[..<n]) : nil
    }
}
