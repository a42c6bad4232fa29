import Foundation
import SystemPackage
import CLinuxShims
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Thin wrappers over the POSIX calls the layers need and swift-system does not offer
/// (`fsync`, `rename`, extended attributes), plus whole-file helpers built on them.
/// Every failure is a ``FileSystemError`` naming the call and the path.
package enum POSIXFile {
    /// Calls `body`, retrying on `EINTR`; a `-1` result becomes a ``FileSystemError``.
    @discardableResult
    package static func check(_ operation: String, _ path: String, _ body: () -> Int32) throws -> Int32 {
        while true {
            let result = body()
            if result != -1 { return result }
            let err = Errno(rawValue: Glibc.errno)
            if err == .interrupted { continue }
            throw FileSystemError(operation, path: path, errno: err)
        }
    }

    /// Wraps a swift-system call so its `Errno` becomes a ``FileSystemError``.
    package static func system<T>(_ operation: String, _ path: String, _ body: () throws -> T) throws -> T {
        do { return try body() } catch let errno as Errno {
            throw FileSystemError(operation, path: path, errno: errno)
        }
    }

    /// Opens `path`.
    package static func open(_ path: String, _ mode: FileDescriptor.AccessMode,
                             options: FileDescriptor.OpenOptions = [], permissions: FilePermissions? = nil) throws -> FileDescriptor {
        try system("open", path) {
            try FileDescriptor.open(FilePath(path), mode, options: options.union(.closeOnExec), permissions: permissions, retryOnInterrupt: true)
        }
    }

    /// `fsync(2)`: the data reaches the disk before this returns.
    package static func sync(_ fd: FileDescriptor, path: String) throws {
        try check("fsync", path) { fsync(fd.rawValue) }
    }

    /// `fsync(2)` on a directory, so a rename or create in it is durable.
    package static func syncDirectory(_ directory: String) throws {
        let fd = try open(directory, .readOnly, options: [.directory])
        defer { try? fd.close() }
        try sync(fd, path: directory)
    }

    /// Reads the whole file.
    package static func readAll(_ path: String) throws -> [UInt8] {
        let fd = try open(path, .readOnly)
        defer { try? fd.close() }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = try system("read", path) { try chunk.withUnsafeMutableBytes { try fd.read(into: $0, retryOnInterrupt: true) } }
            if n == 0 { break }
            result.append(contentsOf: chunk[0..<n])
        }
        return result
    }

    /// Writes all of `bytes` at `offset`.
    package static func write(_ fd: FileDescriptor, _ bytes: some ContiguousBytes, at offset: Int64, path: String) throws {
        try bytes.withUnsafeBytes { buffer in
            var done = 0
            while done < buffer.count {
                let n = try system("write", path) {
                    try fd.write(toAbsoluteOffset: offset + Int64(done), UnsafeRawBufferPointer(rebasing: buffer[done...]), retryOnInterrupt: true)
                }
                done += n
            }
        }
    }

    /// Reads exactly `count` bytes at `offset`, fewer only at the end of the file.
    package static func read(_ fd: FileDescriptor, count: Int, at offset: Int64, path: String) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let n = try system("read", path) {
                try buffer.withUnsafeMutableBytes { raw in
                    try fd.read(fromAbsoluteOffset: offset + Int64(done), into: UnsafeMutableRawBufferPointer(rebasing: raw[done...]), retryOnInterrupt: true)
                }
            }
            if n == 0 { break }
            done += n
        }
        if done < count { buffer.removeLast(count - done) }
        return buffer
    }

    /// The size of an open file.
    package static func size(_ fd: FileDescriptor, path: String) throws -> Int64 {
        try system("lseek", path) { try fd.seek(offset: 0, from: .end) }
    }

    /// A name for a temporary sibling of `path`, hidden and unique: `.NAME.dp-tmp-RANDOM`.
    package static func temporarySibling(of path: String) -> String {
        let url = URL(fileURLWithPath: path)
        let random = UInt64.random(in: 0...UInt64.max)
        return url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).dp-tmp-\(String(random, radix: 16))").path
    }

    /// Replaces `path` atomically: a crash leaves either the old content or the new, never a mix.
    ///
    /// `fill` writes the new content into an unnamed file (`O_TMPFILE`) in the same directory,
    /// which is flushed (`fsync`), linked under a hidden temporary name and renamed over `path`;
    /// the directory is flushed too. A process killed before the rename leaves no trace (at
    /// most, between link and rename, a complete hidden `.NAME.dp-tmp-*`). Where `O_TMPFILE`
    /// is not supported a named hidden temporary file is used. On any failure `path` is
    /// untouched. The new file gets `permissions`, or the old file's mode (0644 for a new file).
    package static func replaceAtomically(_ path: String, permissions: FilePermissions? = nil,
                                          _ fill: (FileDescriptor, String) throws -> Void) throws {
        var mode = permissions ?? FilePermissions(rawValue: 0o644)
        if permissions == nil {
            var st = stat()
            if stat(path, &st) == 0 { mode = FilePermissions(rawValue: st.st_mode & 0o7777) }
        }
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        let temp = temporarySibling(of: path)

        var fd: FileDescriptor
        var isUnnamed = false
        let canLinkUnnamed = access("/proc/self/fd", F_OK) == 0
        let raw = canLinkUnnamed ? Glibc.open(directory, cshim_o_tmpfile() | O_RDWR | O_CLOEXEC, mode.rawValue) : -1
        if raw >= 0 {
            fd = FileDescriptor(rawValue: raw)
            isUnnamed = true
        } else {
            // Unsupported by the file system (or no /proc): fall back to a named temporary file.
            // Any other failure (permissions, read-only, no space, no directory) is the answer.
            let err = Errno(rawValue: Glibc.errno)
            if canLinkUnnamed, ![.notSupported, .isDirectory, .invalidArgument].contains(err) {
                throw FileSystemError("open", path: directory, errno: err)
            }
            fd = try open(temp, .readWrite, options: [.create, .exclusiveCreate], permissions: mode)
        }
        do {
            try check("fchmod", path) { fchmod(fd.rawValue, mode.rawValue) }
            try fill(fd, path)
            try sync(fd, path: path)
            if isUnnamed {
                try check("linkat", path) { linkat(AT_FDCWD, "/proc/self/fd/\(fd.rawValue)", AT_FDCWD, temp, AT_SYMLINK_FOLLOW) }
            }
            try system("close", path) { try fd.close() }
        } catch {
            try? fd.close()
            unlink(temp)
            throw error
        }
        do {
            try check("rename", path) { rename(temp, path) }
        } catch {
            unlink(temp)
            throw error
        }
        try? syncDirectory(directory)
    }

    /// Writes `bytes` to `path` atomically (see ``replaceAtomically(_:permissions:_:)``).
    package static func writeAtomically(_ path: String, _ bytes: [UInt8], permissions: FilePermissions? = nil) throws {
        try replaceAtomically(path, permissions: permissions) { fd, temp in
            try write(fd, bytes, at: 0, path: temp)
        }
    }

    // MARK: Extended attributes

    /// `getxattr(2)`: the attribute's value, or `nil` when it is not set.
    package static func getAttribute(_ name: String, path: String) throws -> [UInt8]? {
        let size = getxattr(path, name, nil, 0)
        if size < 0 {
            let err = Errno(rawValue: Glibc.errno)
            if err == .noData { return nil }
            throw FileSystemError("getxattr", path: path, errno: err)
        }
        var value = [UInt8](repeating: 0, count: size)
        let n = value.withUnsafeMutableBytes { getxattr(path, name, $0.baseAddress, size) }
        if n < 0 { throw FileSystemError("getxattr", path: path, errno: Errno(rawValue: Glibc.errno)) }
        return Array(value[0..<n])
    }

    /// `setxattr(2)`.
    package static func setAttribute(_ name: String, _ value: [UInt8], path: String) throws {
        try check("setxattr", path) { value.withUnsafeBytes { setxattr(path, name, $0.baseAddress, $0.count, 0) } }
    }

    /// `removexattr(2)`; removing an attribute that is not set is not an error.
    package static func removeAttribute(_ name: String, path: String) throws {
        if removexattr(path, name) != 0 {
            let err = Errno(rawValue: Glibc.errno)
            if err != .noData { throw FileSystemError("removexattr", path: path, errno: err) }
        }
    }

    /// Whether `path` exists, and whether it is a directory (symbolic links followed).
    package static func kind(_ path: String) -> (exists: Bool, isDirectory: Bool) {
        var st = stat()
        guard stat(path, &st) == 0 else { return (false, false) }
        return (true, (st.st_mode & S_IFMT) == S_IFDIR)
    }
}
