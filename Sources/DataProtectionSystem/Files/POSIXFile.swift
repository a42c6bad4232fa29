import CLinuxShims
import Foundation
import SystemPackage

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
    /// Calls `body`, retrying on `EINTR`; a `-1` result becomes a ``FileSystemError``
    /// (`path`, what the error shows, is worked out only then).
    @discardableResult
    package static func check(
        _ operation: String, _ path: @autoclosure () -> String, _ body: () -> Int32
    ) throws -> Int32 {
        while true {
            let result = body()
            if result != -1 { return result }
            let err = Errno(rawValue: Glibc.errno)
            if err == .interrupted { continue }
            throw FileSystemError(operation, path: path(), errno: err)
        }
    }

    /// Runs a ``SystemCall`` again while it is interrupted (`EINTR`); its other `Errno` becomes a
    /// ``FileSystemError``.
    package static func retryingOnInterrupt<T>(
        _ operation: String, _ path: String, _ body: () throws(Errno) -> T
    ) throws -> T {
        while true {
            do throws(Errno) { return try body() } catch {
                if error == .interrupted { continue }
                throw FileSystemError(operation, path: path, errno: error)
            }
        }
    }

    /// Wraps a swift-system call so its `Errno` becomes a ``FileSystemError``.
    package static func system<T>(_ operation: String, _ path: String, _ body: () throws -> T) throws -> T {
        do { return try body() } catch let errno as Errno {
            throw FileSystemError(operation, path: path, errno: errno)
        }
    }

    /// Opens `path`.
    package static func open(
        _ path: String, _ mode: FileDescriptor.AccessMode,
        options: FileDescriptor.OpenOptions = [], permissions: FilePermissions? = nil
    ) throws -> FileDescriptor {
        try system("open", path) {
            try FileDescriptor.open(
                try fsPath(path), mode, options: options.union(.closeOnExec), permissions: permissions,
                retryOnInterrupt: true)
        }
    }

    /// The `FilePath` whose bytes are those `path` stands for (``LosslessPath``).
    package static func fsPath(_ path: String) throws -> FilePath {
        try LosslessPath.withCString(path) { FilePath(platformString: $0) }
    }

    /// Runs a path system call on the bytes `path` stands for (``LosslessPath``), retrying on
    /// `EINTR`; `-1` becomes a ``FileSystemError`` naming `operation` and the path.
    @discardableResult
    package static func call(
        _ operation: String, _ path: String, _ body: (UnsafePointer<CChar>) -> Int32
    ) throws -> Int32 {
        try LosslessPath.withCString(path) { c in try check(operation, LosslessPath.display(path)) { body(c) } }
    }

    /// Runs a two-path system call (`rename`, `link`, `symlink`) on the bytes of both paths.
    @discardableResult
    package static func call(
        _ operation: String, _ first: String, _ second: String,
        _ body: (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32
    ) throws -> Int32 {
        try call(operation, second) { c2 in
            (try? LosslessPath.withCString(first) { c1 in body(c1, c2) })
                ?? {
                    errno = EINVAL; return -1
                }()
        }
    }

    /// Renames `source` to `destination` unless something is there already (`EEXIST`, as a
    /// ``FileSystemError``): ``SystemCall/renameWithoutReplacing(_:_:_:_:)`` on both paths' bytes.
    package static func renameWithoutReplacing(_ source: String, to destination: String) throws {
        try LosslessPath.withCString(source) { from in
            try LosslessPath.withCString(destination) { to in
                do throws(Errno) { try SystemCall.renameWithoutReplacing(AT_FDCWD, from, AT_FDCWD, to) } catch {
                    throw FileSystemError("rename", path: LosslessPath.display(destination), errno: error)
                }
            }
        }
    }

    /// `lstat(2)` on the bytes of `path`: `nil` when nothing is there.
    package static func linkStatus(_ path: String) -> stat? {
        var st = stat()
        guard (try? LosslessPath.withCString(path, { lstat($0, &st) })) == 0 else { return nil }
        return st
    }

    /// `stat(2)` (links followed) on the bytes of `path`: `nil` when nothing is there.
    package static func status(_ path: String) -> stat? {
        var st = stat()
        guard (try? LosslessPath.withCString(path, { stat($0, &st) })) == 0 else { return nil }
        return st
    }

    /// The names in a directory as ``LosslessPath`` strings (`.` and `..` left out), read as
    /// bytes with `readdir(3)`: no name is lost or merged, whatever its encoding.
    package static func directoryEntries(_ directory: String) throws -> [String] {
        let fd = try open(directory, .readOnly, options: [.directory])
        guard let dir = fdopendir(fd.rawValue) else {
            let err = Errno(rawValue: Glibc.errno)
            try? fd.close()
            throw FileSystemError("opendir", path: LosslessPath.display(directory), errno: err)
        }
        defer { closedir(dir) }
        var names: [String] = []
        while true {
            errno = 0
            guard let entry = readdir(dir) else {
                if errno != 0 {
                    throw FileSystemError(
                        "readdir", path: LosslessPath.display(directory), errno: Errno(rawValue: errno))
                }
                break
            }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            names.append(LosslessPath.string(fromBytes: name))
        }
        return names
    }

    /// `readlink(2)`: a link's target, as a ``LosslessPath`` string.
    package static func linkTarget(_ path: String) throws -> String {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = try LosslessPath.withCString(path) { c in
            buffer.withUnsafeMutableBytes { readlink(c, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        }
        guard n >= 0 else {
            throw FileSystemError("readlink", path: LosslessPath.display(path), errno: Errno(rawValue: Glibc.errno))
        }
        return LosslessPath.string(fromBytes: buffer[0..<n])
    }

    /// Opens a file that must be a regular file — not a link (`O_NOFOLLOW`), a FIFO (opened
    /// `O_NONBLOCK`, so it cannot hang), a device or a directory — for reading.
    package static func openRegularFile(_ path: String) throws -> FileDescriptor {
        let fd = try open(path, .readOnly, options: [.noFollow, .nonBlocking])
        var st = stat()
        guard fstat(fd.rawValue, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
            try? fd.close()
            throw FileSystemError("open", path: LosslessPath.display(path), errno: .invalidArgument)
        }
        return fd
    }

    /// Reads a whole regular file (see ``openRegularFile(_:)``) of at most `maxSize` bytes;
    /// a larger one is refused before it is read, so a hostile file cannot exhaust memory.
    package static func readRegularFile(_ path: String, maxSize: Int) throws -> [UInt8] {
        let fd = try openRegularFile(path)
        defer { try? fd.close() }
        var st = stat()
        guard fstat(fd.rawValue, &st) == 0, st.st_size <= maxSize else {
            throw FileSystemError("read", path: LosslessPath.display(path), errno: .fileTooLarge)
        }
        // The size it has now, plus one byte to see it grow while read.
        let bytes = try read(fd, count: Int(st.st_size) + 1, at: 0, path: path)
        guard bytes.count <= Int(st.st_size), bytes.count <= maxSize else {
            throw FileSystemError("read", path: LosslessPath.display(path), errno: .fileTooLarge)
        }
        return bytes
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
            let n = try system("read", path) {
                try chunk.withUnsafeMutableBytes { try fd.read(into: $0, retryOnInterrupt: true) }
            }
            if n == 0 { break }
            result.append(contentsOf: chunk[0..<n])
        }
        return result
    }

    /// Writes all of `bytes` at `offset`.
    package static func write(
        _ fd: FileDescriptor, _ bytes: some ContiguousBytes, at offset: Int64, path: String
    ) throws {
        try bytes.withUnsafeBytes { buffer in
            var done = 0
            while done < buffer.count {
                let n = try system("write", path) {
                    try fd.write(
                        toAbsoluteOffset: offset + Int64(done), UnsafeRawBufferPointer(rebasing: buffer[done...]),
                        retryOnInterrupt: true)
                }
                done += n
            }
        }
    }

    /// Reads exactly `count` bytes at `offset`, fewer only at the end of the file.
    package static func read(_ fd: FileDescriptor, count: Int, at offset: Int64, path: String) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        let done = try buffer.withUnsafeMutableBytes { try read(fd, into: $0, at: offset, path: path) }
        if done < count { buffer.removeLast(count - done) }
        return buffer
    }

    /// Fills `buffer` from `offset` (`pread`, retried until full or end of file); returns the
    /// bytes read, fewer than asked only at the end of the file.
    package static func read(
        _ fd: FileDescriptor, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, path: String
    ) throws -> Int {
        var done = 0
        while done < buffer.count {
            let n = try system("read", path) {
                try fd.read(
                    fromAbsoluteOffset: offset + Int64(done),
                    into: UnsafeMutableRawBufferPointer(rebasing: buffer[done...]), retryOnInterrupt: true)
            }
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// Copies up to `count` bytes from `source` to `target`, both at `offset`, inside the kernel
    /// (`copy_file_range`; `pread`/`pwrite` where the file systems cannot), starting the
    /// write-back of each chunk as it goes (`sync_file_range`) so that a final `fsync` waits for
    /// little. Returns the bytes copied: fewer than `count` only when `source` ended first.
    package static func copyRange(
        from source: FileDescriptor, to target: FileDescriptor, offset: Int64, count: Int64, path: String
    ) throws -> Int64 {
        let chunk: Int64 = 8 << 20
        var done: Int64 = 0
        var inKernel = true
        while done < count {
            let wanted = min(chunk, count - done)
            var n: Int64
            if inKernel {
                do throws(Errno) {
                    n = Int64(
                        try SystemCall.copyFileRange(
                            from: source.rawValue, at: offset + done, to: target.rawValue, at: offset + done,
                            count: Int(wanted)))
                } catch .interrupted {
                    continue
                } catch  where [.improperLink, .noFunction, .notSupported, .invalidArgument].contains(error) {
                    inKernel = false
                    continue
                } catch {
                    throw FileSystemError("copy_file_range", path: path, errno: error)
                }
            } else {
                let bytes = try read(source, count: Int(wanted), at: offset + done, path: path)
                try write(target, bytes, at: offset + done, path: path)
                n = Int64(bytes.count)
            }
            if n == 0 { break }
            try? SystemCall.syncFileRangeWrite(target.rawValue, offset: offset + done, count: n)
            done += n
        }
        return done
    }

    /// The size of an open file.
    package static func size(_ fd: FileDescriptor, path: String) throws -> Int64 {
        try system("lseek", path) { try fd.seek(offset: 0, from: .end) }
    }

    /// How the names of ``temporarySibling(of:)`` for a file named `name` begin
    /// (`.NAME.dp-tmp-`): what a writer killed mid-write may leave beside it.
    package static func temporarySiblingPrefix(forName name: String) -> String { ".\(name).dp-tmp-" }

    /// A name for a temporary sibling of `path`, hidden and unique: `.NAME.dp-tmp-RANDOM`, or
    /// `.dp-tmp-RANDOM` when NAME is too long for that to fit in NAME_MAX (255 bytes).
    package static func temporarySibling(of path: String) -> String {
        let (directory, name) = split(path)
        let random = String(UInt64.random(in: 0...UInt64.max), radix: 16)
        let withName = temporarySiblingPrefix(forName: name) + random
        let fits = LosslessPath.bytes(of: withName).count <= Int(NAME_MAX)
        return (directory == "/" ? "/" : directory + "/") + (fits ? withName : ".dp-tmp-\(random)")
    }

    /// A path's directory and last name, by its last `/` (no `stat`, unlike `URL(fileURLWithPath:)`):
    /// `("/a", "b")` for `/a/b` and `/a/b/`, `("/", "a")` for `/a`, `(".", "a")` for `a`, `("/", "/")` for `/`.
    package static func split(_ path: String) -> (directory: String, name: String) {
        var trimmed = Substring(path)
        // Byte by byte: a trailing slash may end a grapheme cluster ("\u{600}/" is one).
        while trimmed.utf8.count > 1, trimmed.utf8.last == UInt8(ascii: "/") {
            trimmed = trimmed[..<trimmed.utf8.index(before: trimmed.utf8.endIndex)]
        }
        if trimmed == "/" { return ("/", "/") }
        guard let slash = trimmed.utf8.lastIndex(of: UInt8(ascii: "/")) else { return (".", String(trimmed)) }
        let directory = trimmed[..<slash]
        return (directory.isEmpty ? "/" : String(directory), String(trimmed[trimmed.utf8.index(after: slash)...]))
    }

    /// `path` as `URL(fileURLWithPath:).standardizedFileURL.path` has it (no `.` or `..`
    /// component, no repeated or trailing slash), without building a URL when it is so already
    /// (an absolute path with none of them: the paths this library makes). Paths under `/private`
    /// and `/var/automount`, which Foundation may shorten, are always Foundation's.
    package static func standardized(_ path: String) -> String {
        let bytes = path.utf8
        guard bytes.first == UInt8(ascii: "/"), !path.hasPrefix("/private"), !path.hasPrefix("/var/automount") else {
            return URL(fileURLWithPath: path, isDirectory: false).standardizedFileURL.path
        }
        if bytes.count == 1 { return path }
        var length = 0, onlyDots = true, clean = true
        for byte in bytes.dropFirst() {
            if byte == UInt8(ascii: "/") {
                if length == 0 || (onlyDots && length <= 2) { clean = false; break }
                length = 0; onlyDots = true
            } else {
                length += 1
                if byte != UInt8(ascii: ".") { onlyDots = false }
            }
        }
        if length == 0 || (onlyDots && length <= 2) { clean = false }
        return clean ? path : URL(fileURLWithPath: path, isDirectory: false).standardizedFileURL.path
    }
}
