import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Protected files reached through descriptors rather than paths — for a process that opened
/// them safely itself (`openat2` beneath a directory it does not trust) or received them from
/// another process. Nothing here resolves a path.
extension ProtectedFileManager {
    /// Opens the protected file open at `descriptor` for reading. The descriptor is duplicated:
    /// the caller keeps (and closes) its own. `url` names the file in errors.
    public func openHandle(forReadingFrom descriptor: FileDescriptor, url: URL) async throws -> ProtectedFileHandle {
        try await openHandle(duplicating: descriptor, url: url, writable: false)
    }

    /// Opens the protected file open at `descriptor` for reading and writing; writes fail with
    /// `EBADF` when the descriptor was opened read-only (the kernel decides, not this handle).
    public func openHandle(forUpdating descriptor: FileDescriptor, url: URL) async throws -> ProtectedFileHandle {
        try await openHandle(duplicating: descriptor, url: url, writable: true)
    }

    /// Makes the empty file open (read-write) at `descriptor` a new protected file of class
    /// `protection` and opens it for writing. The descriptor is duplicated; `url` names it in errors.
    /// Like ``createFile(at:protection:thisDeviceOnly:access:)``, 4 KiB segments unless `access`
    /// says the file will be streamed.
    public func createFile(
        in descriptor: FileDescriptor, url: URL, protection: ProtectionClass,
        access: ProtectedFileAccessPattern = .randomAccess
    ) async throws -> ProtectedFileHandle {
        let path = url.path
        return try await ProtectedFileError.translating(path: path, writing: true) {
            guard try POSIXFile.size(descriptor, path: path) == 0 else {
                throw ProtectedFileError.fileSystem(FileSystemError("create", path: path, errno: .fileExists))
            }
            if servedByFileSystem {
                let fd = try POSIXFile.system("dup", path) { try descriptor.duplicate() }
                do {
                    try Self.setServedClass(protection, of: fd, path: path)
                    return try await openServedHandle(owning: fd, url: url, writable: true)
                } catch {
                    try? fd.close()
                    throw error
                }
            }
            let (header, keys) = try await newFileKeys(
                protection, thisDeviceOnly: false, segmentSizeLog2: segmentSizeLog2(for: access), path: path)
            let fd = try POSIXFile.system("dup", path) { try descriptor.duplicate() }
            do {
                return try await newFileHandle(owning: fd, url: url, header: header, keys: keys)
            } catch {
                try? fd.close()
                throw error
            }
        }
    }

    private func openHandle(
        duplicating descriptor: FileDescriptor, url: URL, writable: Bool
    ) async throws -> ProtectedFileHandle {
        try await ProtectedFileError.translating(path: url.path, writing: writable) {
            let fd = try POSIXFile.system("dup", url.path) { try descriptor.duplicate() }
            do {
                return try await openHandle(owning: fd, url: url, writable: writable)
            } catch {
                try? fd.close()
                throw error
            }
        }
    }

    /// Copies the file open at `source` into a new protected file in the directory open at
    /// `directory`, under the first name `names(1)`, `names(2)`, … not taken there — never
    /// replacing anything — and returns the name and class it got.
    ///
    /// The copy's class is the stronger of the source's and `minimum` (a plain source gets
    /// `minimum`); it keeps the source's "this device only". No plaintext reaches the disk:
    /// - A protected source is copied as ciphertext, inside the kernel: the copy shares the
    ///   source's file key and file ID, as an APFS clone shares its extents' keys. When the
    ///   source's class is at least `minimum`, its header is kept as it is and no key is needed
    ///   (a class-A file copies while the device is locked). Otherwise the key is rewrapped to
    ///   `minimum`, which needs the source's class key
    ///   (``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` otherwise).
    ///   A damaged source makes a damaged copy, which its reader detects as it would the source.
    /// - A plain source is encrypted under a new file key.
    ///
    /// The copy reads at most the size the source had when opened and fails if that size
    /// changed. The new file appears under its name only when complete and flushed.
    public func copyFile(
        from source: FileDescriptor, sourceURL: URL, into directory: FileDescriptor, directoryURL: URL,
        protection minimum: ProtectionClass, names: (Int) -> String
    ) async throws -> (name: String, protection: ProtectionClass) {
        let sourcePath = sourceURL.path
        let plan = try await ProtectedFileError.translating(path: sourcePath, writing: false) {
            try await copyPlan(source, url: sourceURL, minimum: minimum)
        }
        return try await ProtectedFileError.translating(path: directoryURL.path, writing: true) {
            try Self.requireSpace(for: plan.fileSize, in: directory, path: directoryURL.path)
            let target = try UnnamedFile(in: directory, directoryPath: directoryURL.path)
            defer { target.discard() }
            let complete: Bool
            switch plan {
            case .ciphertext(let header, let fileSize, _):
                // The whole file from offset 0 (block-aligned, so a file system that can share
                // extents, btrfs or XFS, clones them), then the header decided on above over its
                // first 160 bytes, whatever the source's header became meanwhile.
                let copied = try POSIXFile.copyRange(
                    from: source, to: target.fd, offset: 0, count: fileSize, path: sourcePath)
                try POSIXFile.write(target.fd, header, at: 0, path: target.displayPath)
                complete = copied == fileSize
            case .encrypt(let reader, let cls):
                let (header, keys) = try await newFileKeys(
                    cls, thisDeviceOnly: false, segmentSizeLog2: segmentSizeLog2, path: directoryURL.path)
                let copy = try SegmentedFile.create(fd: target.fd, path: target.displayPath, header: header, keys: keys)
                try copy.writeStream(from: reader.read)
                complete = copy.size == reader.fileSize
            }
            // The source may not grow or shrink under the copy (an app extending its file to
            // make the copy endless, or cutting it short): what was copied is what was there.
            guard complete, try POSIXFile.size(source, path: sourcePath) == plan.fileSize else {
                throw ProtectedFileError.fileSystem(FileSystemError("copy", path: sourcePath, errno: .resourceBusy))
            }
            try POSIXFile.sync(target.fd, path: target.displayPath)
            let name = try target.link(names: names)
            try? POSIXFile.sync(directory, path: directoryURL.path)
            return (name, plan.protection)
        }
    }

    /// Refuses a copy of `size` plaintext bytes that would leave the file system holding
    /// `directory` with less than 64 MiB or 1 % free (a full disk stops every app and the keybag).
    public static func requireSpace(for size: Int64, in directory: FileDescriptor, path: String) throws {
        var fs = statvfs()
        guard fstatvfs(directory.rawValue, &fs) == 0 else { return }
        let blockSize = Int64(fs.f_frsize)
        let available = Int64(fs.f_bavail) * blockSize
        let reserve = max(64 << 20, Int64(fs.f_blocks) * blockSize / 100)
        // + 28 bytes per 64 KiB segment, rounded up
        let needed = size + (size >> 11) + Int64(ProtectedFileHeader.size) + (1 << 20)
        guard size >= 0, needed <= available - reserve else {
            throw ProtectedFileError.fileSystem(FileSystemError("copy", path: path, errno: .noSpace))
        }
    }

    /// Decides how `source` is copied: its header (kept, or rewrapped to `minimum`) when it is
    /// protected, its bytes when it is plain. Nothing is read past the header yet.
    private func copyPlan(_ source: FileDescriptor, url: URL, minimum: ProtectionClass) async throws -> CopyPlan {
        let path = url.path
        let st = try POSIXFile.system("fstat", path) { () throws -> stat in
            var st = stat()
            guard fstat(source.rawValue, &st) == 0 else { throw Errno(rawValue: errno) }
            return st
        }
        guard st.st_mode & S_IFMT == S_IFREG else {
            throw ProtectedFileError.fileSystem(FileSystemError("copy", path: path, errno: .invalidArgument))
        }
        let fileSize = Int64(st.st_size)
        let prefix = try POSIXFile.read(source, count: ProtectedFileHeader.size, at: 0, path: path)
        guard ProtectedFileHeader.looksProtected(prefix) else {
            // At most the size the file had when opened.
            var offset: Int64 = 0
            return .encrypt(
                PlainCopySource(fileSize: fileSize) { buffer in
                    let wanted = Int(min(Int64(buffer.count), fileSize - offset))
                    guard wanted > 0 else { return 0 }
                    let n = try POSIXFile.system("read", path) {
                        try source.read(
                            fromAbsoluteOffset: offset,
                            into: UnsafeMutableRawBufferPointer(rebasing: buffer[..<wanted]), retryOnInterrupt: true)
                    }
                    offset += Int64(n)
                    return n
                }, protection: minimum)
        }
        var header = try ProtectedFileHeader.parse(prefix, path: path)
        guard fileSize >= Int64(ProtectedFileHeader.size + SegmentCipher.overhead) else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated: no complete segment after the header")
        }
        guard header.protectionClass < minimum else {
            return .ciphertext(header: prefix, fileSize: fileSize, protection: header.protectionClass)
        }
        // A weaker source: its key, rewrapped to `minimum` under a header checked first.
        let key = try await keybag.unwrapFileKey(header.wrappedKey)
        let keys = FileKeys(fileKey: key, fileID: header.fileID)
        guard ProtectedFileHeader.verify(prefix, keys: keys) else {
            throw ProtectedFileError.damaged(path: path, reason: "header authentication failed")
        }
        header.wrappedKey = try await keybag.wrap(key, for: minimum, thisDeviceOnly: header.wrappedKey.thisDeviceOnly)
        return .ciphertext(header: header.encoded(keys: keys), fileSize: fileSize, protection: minimum)
    }
}

/// How a copy is made (see ``ProtectedFileManager/copyFile(from:sourceURL:into:directoryURL:protection:names:)``).
private enum CopyPlan {
    /// A protected source: `header`, then the source's segments as they are.
    case ciphertext(header: [UInt8], fileSize: Int64, protection: ProtectionClass)
    /// A plain source, encrypted into a new file of class `protection`.
    case encrypt(PlainCopySource, protection: ProtectionClass)

    /// The source file's size when opened: the copy reads no more, and it must not change.
    var fileSize: Int64 {
        switch self {
        case .ciphertext(_, let fileSize, _): fileSize
        case .encrypt(let source, _): source.fileSize
        }
    }

    var protection: ProtectionClass {
        switch self {
        case .ciphertext(_, _, let protection), .encrypt(_, let protection): protection
        }
    }
}

/// A plain file's bytes, a buffer at a time.
private struct PlainCopySource {
    var fileSize: Int64
    var read: (UnsafeMutableRawBufferPointer) throws -> Int
}

/// A new file in a directory descriptor that has no name until ``link(names:)`` gives it one
/// (`O_TMPFILE`; a hidden name where the file system lacks it). Discarded unless linked.
private final class UnnamedFile {
    let fd: FileDescriptor
    let directory: FileDescriptor
    let directoryPath: String
    /// The hidden name, when the file system has no `O_TMPFILE`.
    private var hiddenName: String?
    private var closed = false

    var displayPath: String { directoryPath + "/" + (hiddenName ?? "(new file)") }

    init(in directory: FileDescriptor, directoryPath: String) throws {
        self.directory = directory
        self.directoryPath = directoryPath
        let raw = openat(directory.rawValue, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0o600)
        if raw >= 0 {
            fd = FileDescriptor(rawValue: raw)
            return
        }
        let err = Errno(rawValue: errno)
        guard [.notSupported, .isDirectory, .invalidArgument].contains(err) else {
            throw FileSystemError("open", path: directoryPath, errno: err)
        }
        let name = ".dp-tmp-" + (0..<8).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
        let named = openat(directory.rawValue, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard named >= 0 else {
            throw FileSystemError("open", path: directoryPath + "/" + name, errno: Errno(rawValue: errno))
        }
        fd = FileDescriptor(rawValue: named)
        hiddenName = name
    }

    /// Gives the file the first free name of `names(1)`, `names(2)`, …; never replaces a file.
    func link(names: (Int) -> String) throws -> String {
        for attempt in 1...10_000 {
            let name = names(attempt)
            let err: Errno
            if let hiddenName {
                if linkat(directory.rawValue, hiddenName, directory.rawValue, name, 0) == 0 { return name }
                err = Errno(rawValue: errno)
            } else {
                do throws(Errno) {
                    try SystemCall.linkUnnamed(fd.rawValue, directory.rawValue, name)
                    return name
                } catch {
                    err = error
                }
            }
            guard err == .fileExists else {
                throw FileSystemError("linkat", path: directoryPath + "/" + name, errno: err)
            }
        }
        throw FileSystemError("linkat", path: directoryPath, errno: .fileExists)
    }

    /// Closes the descriptor and removes the hidden name, if any (the linked name stays).
    func discard() {
        guard !closed else { return }
        closed = true
        try? fd.close()
        if let hiddenName { _ = unlinkat(directory.rawValue, hiddenName, 0) }
    }
}
