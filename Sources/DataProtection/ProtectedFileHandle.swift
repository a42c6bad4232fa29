import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// An open protected file, for random access: read or write at any offset, append,
/// truncate — only the touched segments (4 KiB in files made for random access, 64 KiB in
/// files written whole: ``ProtectedFileAccessPattern``) are decrypted and re-sealed.
///
/// The handle follows its class, as an open file does on iOS:
/// - **A** (`complete`): every call fails with
/// ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``
///   once the grace period after a lock has passed; after the next unlock it works again.
/// - **B** (`completeUnlessOpen`): the file key stays in the handle until ``close()``, so a
///   handle opened while unlocked — or a file created while locked — keeps working while locked.
/// - **C**, **D**: as long as the class is available.
///
/// ```swift
/// let handle = try await files.openHandle(forUpdating: url)
/// try await handle.write(Data("patch".utf8), at: 4096)
/// let bytes = try await handle.read(at: 0, count: 100)
/// try await handle.close()
/// ```
public actor ProtectedFileHandle {
    /// The file.
    public nonisolated let url: URL
    /// The file's class when the handle was opened.
    public nonisolated let protectionClass: ProtectionClass
    /// Whether the handle may write.
    public nonisolated let isWritable: Bool
    /// log2 of the file's segment size (from its header).
    nonisolated let segmentSizeLog2: UInt8

    private let keybag: Keybag
    private var fd: FileDescriptor?
    /// The protected file's header (`nil` for a file the protected file system serves).
    private let header: ProtectedFileHeader?
    private var engine: (any PlaintextStorage)?
    private var keyGeneration: Int?
    private var position: Int64 = 0

    init(
        url: URL, keybag: Keybag, fd: FileDescriptor, header: ProtectedFileHeader,
        engine: SegmentedFile, keyGeneration: Int?, writable: Bool
    ) {
        self.url = url
        self.keybag = keybag
        self.fd = fd
        self.header = header
        self.protectionClass = header.protectionClass
        self.segmentSizeLog2 = header.segmentSizeLog2
        self.engine = engine
        self.keyGeneration = keyGeneration
        self.isWritable = writable
    }

    /// A handle on a file the protected file system serves (it seals, and enforces the class at
    /// every call): this handle reads and writes the file as it is.
    init(url: URL, keybag: Keybag, fd: FileDescriptor, servedFile protectionClass: ProtectionClass, writable: Bool) {
        self.url = url
        self.keybag = keybag
        self.fd = fd
        self.header = nil
        self.protectionClass = protectionClass
        self.segmentSizeLog2 = ProtectedFileHeader.randomAccessSegmentSizeLog2
        self.engine = PlainFileStorage(fd: fd, path: url.path)
        self.keyGeneration = nil
        self.isWritable = writable
    }

    private var path: String { url.path }

    /// The engine, after checking that the class allows access now. A discarded class key
    /// drops the handle's copy of the file key too; it is unwrapped again after an unlock.
    private func access(writing: Bool) async throws -> any PlaintextStorage {
        guard let fd else { throw ProtectedFileError.closed(path: path) }
        if writing, !isWritable {
            throw ProtectedFileError.fileSystem(FileSystemError("write", path: path, errno: .badFileDescriptor))
        }
        if protectionClass == .completeUnlessOpen, let engine { return engine }
        guard let header else {
            // Served by the file system, which refuses what the class does not allow; asked
            // first so that a locked class is reported as such.
            if protectionClass != .noProtection {
                do { _ = try await keybag.generation(of: protectionClass) } catch let error as KeybagError {
                    throw ProtectedFileError.translate(error, path: path, writing: writing)
                }
            }
            if let engine { return engine }
            throw ProtectedFileError.closed(path: path)
        }
        let generation: Int
        do {
            generation = try await keybag.generation(of: protectionClass)
        } catch let error as KeybagError {
            // The class locked: the file key goes, after the file's end is settled (FORMAT.md §3).
            if isWritable { try? engine?.settle() }
            engine = nil
            throw ProtectedFileError.translate(error, path: path, writing: writing)
        }
        if let engine, generation == keyGeneration { return engine }
        let reopened = try await ProtectedFileError.translating(path: path, writing: writing) {
            let key = try await keybag.unwrapFileKey(header.wrappedKey)
            // The header as it is now: writing in place marks it (FORMAT.md §3).
            let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
            let current = try ProtectedFileHeader.parse(headerBytes, path: path)
            guard current.fileID == header.fileID else {
                throw ProtectedFileError.damaged(path: path, reason: "its header changed while it was open")
            }
            return try SegmentedFile.open(
                fd: fd, path: path, headerBytes: headerBytes, header: current,
                keys: FileKeys(fileKey: key, fileID: header.fileID))
        }
        engine = reopened
        keyGeneration = generation
        return reopened
    }

    private func run<T>(writing: Bool, _ body: (any PlaintextStorage) throws -> T) async throws -> T {
        let engine = try await access(writing: writing)
        return try await ProtectedFileError.translating(path: path, writing: writing) { try body(engine) }
    }

    /// The plaintext length.
    public func size() async throws -> Int64 {
        try await run(writing: false) { $0.size }
    }

    /// Reads up to `count` bytes at `offset`; fewer at the end of the file.
    public func read(at offset: Int64, count: Int) async throws -> Data {
        try await run(writing: false) { try $0.read(at: offset, count: count) }
    }

    /// Reads up to `count` bytes at the current position and moves past them, like
    /// `FileHandle.read(upToCount:)`; returns `nil` at the end of the file.
    public func read(upToCount count: Int) async throws -> Data? {
        let bytes = try await read(at: position, count: count)
        position += Int64(bytes.count)
        return bytes.isEmpty && count > 0 ? nil : bytes
    }

    /// Reads from the current position to the end.
    public func readToEnd() async throws -> Data {
        let total = try await size()
        return try await read(upToCount: Int(max(0, total - position))) ?? Data()
    }

    /// Writes `data` at `offset` (extending the file with zeros over any gap).
    public func write(_ data: some DataProtocol, at offset: Int64) async throws {
        let engine = try await access(writing: true)
        try await ProtectedFileError.translating(path: path, writing: true) {
            if data.regions.count == 1, let region = data.regions.first {
                try region.withUnsafeBytes { try engine.write($0, at: offset) }
            } else {
                try Array(data).withUnsafeBytes { try engine.write($0, at: offset) }
            }
        }
    }

    /// Writes at the current position and moves past the data, like `FileHandle.write(contentsOf:)`.
    public func write(contentsOf data: some DataProtocol) async throws {
        try await write(data, at: position)
        position += Int64(data.count)
    }

    /// Appends at the end of the file.
    public func append(_ data: some DataProtocol) async throws {
        let end = try await size()
        try await write(data, at: end)
        position = end + Int64(data.count)
    }

    /// Cuts (or zero-extends) the file to `size` bytes, like `FileHandle.truncate(atOffset:)`.
    public func truncate(atOffset size: Int64) async throws {
        try await run(writing: true) { try $0.truncate(to: size) }
        position = min(position, size)
    }

    /// Moves the position used by ``read(upToCount:)`` and ``write(contentsOf:)``.
    public func seek(toOffset offset: Int64) throws {
        guard offset >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative offset") }
        position = offset
    }

    /// The current position.
    public func offset() -> Int64 { position }

    /// Flushes written data to the disk (`fsync`).
    public func synchronize() async throws {
        guard let fd else { throw ProtectedFileError.closed(path: path) }
        try await ProtectedFileError.translating(path: path, writing: true) {
            try POSIXFile.sync(fd, path: path)
            // Once the data is on the disk, the file's end is authenticated again (FORMAT.md §3).
            try engine?.settle()
        }
    }

    /// Closes the handle and forgets the file key. Reopening a class-B file needs an unlock.
    public func close() async throws {
        guard let fd else { return }
        self.fd = nil
        let engine = self.engine
        self.engine = nil
        try await ProtectedFileError.translating(path: path, writing: false) {
            var settling: (any Error)?
            if isWritable {
                do { try engine?.settle() } catch { settling = error }
            }
            try POSIXFile.system("close", path) { try fd.close() }
            if let settling { throw settling }
        }
    }

    deinit {
        try? fd?.close()
    }
}
