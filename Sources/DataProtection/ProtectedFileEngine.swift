import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// `UTIME_OMIT` (a macro Swift does not import): `futimens` leaves that time as it is.
let utimeOmit = (1 << 30) - 2

/// One protected file held open by a file system server: reads and writes plaintext at offsets
/// on the descriptor it was given, sealing with the file's key, which it holds until it is
/// dropped. Unlike ``ProtectedFileHandle`` it checks no lock state: the server decides, per
/// call, what each class allows (and, at a lock, keeps writing back dirty pages a moment after
/// the class key is gone). Not thread-safe: the server serializes the calls on one file.
/// `@unchecked Sendable`: the server calls it for one file under that file's lock: never from two threads at once.
package final class ProtectedFileEngine: @unchecked Sendable {
    package let protectionClass: ProtectionClass
    package let fd: FileDescriptor
    private let file: SegmentedFile

    fileprivate init(file: SegmentedFile, fd: FileDescriptor) {
        self.file = file
        // The server runs several requests at once: each seals and opens on its own thread.
        file.threads = 1
        self.fd = fd
        self.protectionClass = file.header.protectionClass
    }

    /// The plaintext length.
    package var size: Int64 { file.size }

    /// What the file's header says without a key (its class and segment size).
    package var prefix: ProtectedFilePrefix {
        ProtectedFilePrefix(protectionClass: protectionClass, layout: file.header.layout)
    }

    package func read(at offset: Int64, count: Int) throws -> Data { try file.read(at: offset, count: count) }

    package func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws { try file.write(bytes, at: offset) }

    /// Cuts or zero-extends the file to `size` bytes.
    package func truncate(to size: Int64) throws { try file.truncate(to: size) }

    /// Ends a run of writes (at an fsync, at the last close): the file's end is authenticated
    /// again (FORMAT.md §3, "Writing in place"). Cheap when nothing was written. The content does
    /// not change, and neither does the file's modification time: a time a program set after
    /// its last write (`rsync`, `cp -p`, `tar x`, `touch -d`) is the time it keeps, whenever the
    /// close that settles the file comes.
    package func settle() throws {
        guard file.needsSettling else { return }
        try keepingModificationTime { try file.settle() }
    }

    /// Writes a class change (a new wrapping of this file's key) through this engine, whose
    /// header it is: one header write, the engine's marks kept. The modification time moves: an
    /// incremental backup tells a changed file by its size and modification time, and must store
    /// the file again with its new class.
    package func apply(_ rewrap: Rewrap) throws {
        guard rewrap.fileID == file.header.fileID else {
            throw ProtectedFileError.damaged(path: file.path, reason: "its header changed during the class change")
        }
        try file.replaceWrapping(rewrap.wrappedKey)
    }

    /// Runs `body`, which writes the file without changing its content, then sets the file's
    /// modification time back to what it was before (`futimens`, access time untouched).
    private func keepingModificationTime(_ body: () throws -> Void) throws {
        var before = stat()
        let known = fstat(fd.rawValue, &before) == 0
        try body()
        guard known else { return }
        let times = [timespec(tv_sec: 0, tv_nsec: utimeOmit), before.st_mtim]
        _ = futimens(fd.rawValue, times)
    }
}

extension ProtectedFileManager {
    /// Opens the protected file at `fd` (the engine uses the descriptor; the caller keeps it open
    /// for as long as the engine lives): unwraps its key, authenticates its header and end.
    package func openEngine(fd: FileDescriptor, path: String) async throws -> ProtectedFileEngine {
        try await ProtectedFileError.translating(path: path, writing: false) {
            let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
            guard ProtectedFileHeader.looksProtected(headerBytes) else {
                throw ProtectedFileError.notProtected(path: path)
            }
            let header = try ProtectedFileHeader.parse(headerBytes, path: path)
            let key = try await keybag.unwrapFileKey(header.wrappedKey)
            let file = try SegmentedFile.open(
                fd: fd, path: path, headerBytes: headerBytes, header: header,
                keys: FileKeys(fileKey: key, fileID: header.fileID))
            return ProtectedFileEngine(file: file, fd: fd)
        }
    }

    /// Makes the empty file at `fd` a new protected file of class `protection`, with 4 KiB
    /// segments (a file system's files are written at random), and opens it.
    package func createEngine(
        fd: FileDescriptor, path: String, protection: ProtectionClass
    ) async throws -> ProtectedFileEngine {
        try await ProtectedFileError.translating(path: path, writing: true) {
            let (header, keys) = try await newFileKeys(
                protection, thisDeviceOnly: false, segmentSizeLog2: randomAccessSegmentSizeLog2, path: path)
            let file = try SegmentedFile.create(fd: fd, path: path, header: header, keys: keys)
            return ProtectedFileEngine(file: file, fd: fd)
        }
    }

    /// A new wrapping of the key of the protected file at `fd` for `protection` (the content is
    /// not re-encrypted), as ``setProtection(_:ofItemAt:)`` makes for a path; `nil` when it has
    /// that class already. Nothing is written: ``Rewrap/apply(fd:path:)`` or
    /// ``ProtectedFileEngine/apply(_:)`` writes it, where the caller serializes header writes.
    package func prepareRewrap(fd: FileDescriptor, path: String, to protection: ProtectionClass) async throws -> Rewrap?
    {
        try await ProtectedFileError.translating(path: path, writing: true) {
            let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
            guard ProtectedFileHeader.looksProtected(headerBytes) else {
                throw ProtectedFileError.notProtected(path: path)
            }
            let header = try ProtectedFileHeader.parse(headerBytes, path: path)
            guard header.protectionClass != protection else { return nil }
            let key = try await keybag.unwrapFileKey(header.wrappedKey)
            let keys = FileKeys(fileKey: key, fileID: header.fileID)
            guard ProtectedFileHeader.verify(headerBytes, keys: keys) else {
                throw ProtectedFileError.damaged(path: path, reason: "header authentication failed")
            }
            let wrapped = try await keybag.wrap(key, for: protection, thisDeviceOnly: header.wrappedKey.thisDeviceOnly)
            return Rewrap(fileID: header.fileID, keys: keys, wrappedKey: wrapped)
        }
    }
}

/// A file key's new wrapping, ready to be written into its header (see
/// ``ProtectedFileManager/prepareRewrap(fd:path:to:)``).
package struct Rewrap: Sendable {
    let fileID: [UInt8]
    let keys: FileKeys
    let wrappedKey: WrappedFileKey

    /// Writes the new wrapping into the header on disk as it is now (its marks kept), then
    /// flushes it. For a file no engine holds open.
    package func apply(fd: FileDescriptor, path: String) throws {
        let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
        var header = try ProtectedFileHeader.parse(headerBytes, path: path)
        guard header.fileID == fileID, ProtectedFileHeader.verify(headerBytes, keys: keys) else {
            throw ProtectedFileError.damaged(path: path, reason: "its header changed during the class change")
        }
        header.wrappedKey = wrappedKey
        try POSIXFile.write(fd, header.encoded(keys: keys), at: 0, path: path)
        try POSIXFile.sync(fd, path: path)
    }
}

/// What a file's first bytes say, without any key: protected (with its class and segment size)
/// or not — for a server that reports plaintext sizes.
package struct ProtectedFilePrefix: Sendable, Equatable {
    /// What a file is, by its first bytes (up to ``length`` of them).
    package enum Kind: Sendable, Equatable {
        /// Not the protected format: served as it is.
        case plain
        /// A protected file whose header parses.
        case protected(ProtectedFilePrefix)
        /// The protected format's signature, but a header that does not parse (truncated,
        /// altered, a newer version): never read as plain, never written.
        case damaged
    }

    /// Classifies a file by its first bytes (all of them, when it is shorter than ``length``).
    package static func kind(of bytes: [UInt8]) -> Kind {
        guard ProtectedFileHeader.looksProtected(bytes) else { return .plain }
        return ProtectedFilePrefix(bytes).map { .protected($0) } ?? .damaged
    }

    package let protectionClass: ProtectionClass
    let layout: SegmentLayout

    /// The bytes to read from the start of a file to decide.
    package static let length = ProtectedFileHeader.size

    init(protectionClass: ProtectionClass, layout: SegmentLayout) {
        self.protectionClass = protectionClass
        self.layout = layout
    }

    /// A prefix of format `version` (FORMAT.md §3) with segments of `2^segmentSizeLog2` bytes.
    package init(protectionClass: ProtectionClass, version: UInt16, segmentSizeLog2: UInt8) {
        self.init(protectionClass: protectionClass, layout: SegmentLayout(version: version, log2: segmentSizeLog2))
    }

    /// `nil` when `bytes` are not a protected file's header.
    package init?(_ bytes: [UInt8]) {
        guard ProtectedFileHeader.looksProtected(bytes), let header = try? ProtectedFileHeader.parse(bytes, path: "")
        else { return nil }
        protectionClass = header.protectionClass
        layout = header.layout
    }

    /// The plaintext length of a protected file of `fileSize` bytes (not authenticated; 0 when
    /// no whole segment fits).
    package func plaintextSize(fileSize: Int64) -> Int64 {
        layout.plaintextSize(fileSize: fileSize)?.size ?? 0
    }
}
