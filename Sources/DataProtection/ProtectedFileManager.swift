import Crypto
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Protected files, in the shape of `FileManager` and `Data.write(to:options:)`.
///
/// ```swift
/// let keybag = try await Keybag.open(root: try DataRoot.resolve())
/// let files = ProtectedFileManager(keybag: keybag)
/// try await files.write(Data("secret".utf8), to: url, options: .completeFileProtection)
/// let data = try await files.contents(of: url)          // fails with 257 while locked
/// try await files.setAttributes([.protectionKey: FileProtectionType.none], ofItemAtPath: url.path)
/// ```
///
/// Class of a new file: the one named by the caller; otherwise the stronger of the nearest
/// ancestor directory's default (iOS's default, class C, when none has one) and — when an
/// existing protected file is replaced — that file's class, so nothing is silently lowered.
public struct ProtectedFileManager: Sendable {
    /// The device whose keybag wraps the file keys.
    public let keybag: Keybag
    /// log2 of the segment size of new ``ProtectedFileAccessPattern/sequential`` files (16: 64 KiB).
    public var segmentSizeLog2: UInt8 = ProtectedFileHeader.defaultSegmentSizeLog2
    /// log2 of the segment size of new ``ProtectedFileAccessPattern/randomAccess`` files (12: 4 KiB).
    public var randomAccessSegmentSizeLog2: UInt8 = ProtectedFileHeader.randomAccessSegmentSizeLog2

    /// The weakest class a new file at a path may inherit, where someone other than the caller
    /// chose it (an app's container, an App Group's: the user's choice, read from where the app
    /// cannot write): a directory default lowered by whoever can write the directory's
    /// attributes does not lower it. `nil` for no floor.
    package var inheritedClassFloor: (@Sendable (String) -> ProtectionClass?)?

    /// Whether the files are on the protected file system (an app whose containers it serves):
    /// they are then read and written as plaintext, the file system seals them and enforces
    /// their class, and no key is asked of the keybag (see `ProtectedFileManager+FileSystem.swift`).
    package var servedByFileSystem = false

    public init(keybag: Keybag) {
        self.keybag = keybag
    }

    // MARK: - Inspecting

    /// What `url` holds (see ``ItemInspector/protection(ofItemAt:)``). Needs no key.
    public func protection(ofItemAt url: URL) throws -> ItemProtection {
        if servedByFileSystem { return try servedProtection(ofItemAt: url) }
        return try ItemInspector.protection(ofItemAt: url)
    }

    /// The plaintext size of a file (see ``ItemInspector/plaintextSize(ofItemAt:)``). Needs no key.
    public func plaintextSize(ofItemAt url: URL) throws -> Int64 {
        if servedByFileSystem {
            guard let st = POSIXFile.status(url.path) else { throw ProtectedFileError.noSuchFile(path: url.path) }
            return Int64(st.st_size)
        }
        return try ItemInspector.plaintextSize(ofItemAt: url)
    }

    /// The default class a new file at `url` would get if the caller named none.
    public func defaultProtection(forNewItemAt url: URL) -> ProtectionClass {
        defaultProtection(forNewItemAtPath: url.path)
    }

    /// ``defaultProtection(forNewItemAt:)`` for a path.
    package func defaultProtection(forNewItemAtPath path: String) -> ProtectionClass {
        let standardized = POSIXFile.standardized(path)
        let inherited = DirectoryDefault.inherited(forNewItemAt: standardized) ?? .default
        guard let floor = inheritedClassFloor?(standardized) else { return inherited }
        return max(inherited, floor)
    }

    // MARK: - Whole-file write and read

    /// Writes `data` atomically, like `Data.write(to:options:)`: the class comes from the
    /// options' file-protection bits (`.completeFileProtection` …) or is inherited.
    /// A crash leaves the old content or the new, never a mix. `.withoutOverwriting` is honoured.
    public func write(_ data: some DataProtocol, to url: URL, options: Data.WritingOptions = []) async throws {
        if options.contains(.withoutOverwriting), FileManager.default.fileExists(atPath: url.path) {
            throw ProtectedFileError.fileSystem(FileSystemError("open", path: url.path, errno: .fileExists))
        }
        try await write(data, to: url, protection: ProtectionClass(writingOptions: options))
    }

    /// Writes `data` atomically under `protection` (or the inherited class when `nil`).
    ///
    /// `thisDeviceOnly` binds the file key to this device too (like the keychain's
    /// `…ThisDeviceOnly`): no backup can restore it elsewhere. `nil` keeps the flag of the file
    /// being replaced (off for a new file). `access` sets the file's segment size
    /// (``ProtectedFileAccessPattern``).
    public func write(
        _ data: some DataProtocol, to url: URL, protection: ProtectionClass?, thisDeviceOnly: Bool? = nil,
        access: ProtectedFileAccessPattern = .sequential
    ) async throws {
        try await write(
            data, to: url, protection: protection, thisDeviceOnly: thisDeviceOnly, access: access, replacement: .durable
        )
    }

    /// ``write(_:to:protection:thisDeviceOnly:access:)`` put in place as `replacement` says
    /// (unflushed, keeping the replaced file: preferences).
    package func write(
        _ data: some DataProtocol, to url: URL, protection: ProtectionClass?, thisDeviceOnly: Bool?,
        access: ProtectedFileAccessPattern = .sequential, replacement: POSIXFile.Replacement
    ) async throws {
        let bytes = Array(data)
        try await writeAtomically(
            to: url, protection: protection, thisDeviceOnly: thisDeviceOnly, access: access, replacement: replacement
        ) { file in
            var offset = 0
            try file.writeStream { buffer in
                let n = min(buffer.count, bytes.count - offset)
                bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: n) }
                offset += n
                return n
            }
        }
    }

    /// Writes everything readable from `source` (read to its end, in bounded memory)
    /// atomically to `url` (standard input, a pipe, a socket).
    public func write(
        contentsOf source: FileDescriptor, to url: URL, protection: ProtectionClass?, thisDeviceOnly: Bool? = nil,
        access: ProtectedFileAccessPattern = .sequential
    ) async throws {
        try await writeAtomically(to: url, protection: protection, thisDeviceOnly: thisDeviceOnly, access: access) {
            file in
            try file.writeStream { buffer in
                try POSIXFile.system("read", "<input>") { try source.read(into: buffer, retryOnInterrupt: true) }
            }
        }
    }

    /// The class a write to `url` gets when the caller names `explicit`.
    func resolveClass(for url: URL, explicit: ProtectionClass?) -> ProtectionClass {
        if let explicit { return explicit }
        let inherited = defaultProtection(forNewItemAt: url)
        if let existing = (try? protection(ofItemAt: url))?.fileClass { return max(existing, inherited) }
        return inherited
    }

    func writeAtomically(
        to url: URL, protection: ProtectionClass?, thisDeviceOnly: Bool? = nil, keepingMode: Bool = true,
        access: ProtectedFileAccessPattern = .sequential, replacement: POSIXFile.Replacement = .durable,
        _ fill: @escaping (any PlaintextStorage) throws -> Void
    ) async throws {
        let path = url.path
        if servedByFileSystem {
            return try await writeServedAtomically(
                to: url, protection: resolveClass(for: url, explicit: protection), keepingMode: keepingMode,
                replacement: replacement, fill)
        }
        try await ProtectedFileError.translating(path: path, writing: true) {
            if POSIXFile.kind(path).isDirectory { throw ProtectedFileError.isDirectory(path: path) }
            try ProtectedFileError.checkReplaceable(path)
            let cls = resolveClass(for: url, explicit: protection)
            let deviceOnly = thisDeviceOnly ?? ((try? ItemInspector.isThisDeviceOnly(url)) ?? false)
            let (header, keys) = try await newFileKeys(
                cls, thisDeviceOnly: deviceOnly, segmentSizeLog2: segmentSizeLog2(for: access), path: path)
            try POSIXFile.replaceAtomically(
                path, permissions: keepingMode ? nil : FilePermissions(rawValue: 0o600), replacement: replacement
            ) { fd, temp in
                let file = try SegmentedFile.create(fd: fd, path: temp, header: header, keys: keys)
                try fill(file)
                try file.settle()
            }
        }
    }

    /// The plaintext of `url`, like `Data(contentsOf:)`. A plain file is returned as it is.
    /// Throws ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` (Cocoa 257)
    /// when the class is unavailable, ``ProtectedFileError/damaged(path:reason:)`` when any byte was changed.
    public func contents(of url: URL) async throws -> Data {
        if servedByFileSystem {
            return try await servedTranslating(path: url.path, writing: false) { Data(try POSIXFile.readAll(url.path)) }
        }
        if case .plain = try protection(ofItemAt: url) {
            return try await ProtectedFileError.translating(path: url.path, writing: false) {
                Data(try POSIXFile.readAll(url.path))
            }
        }
        let handle = try await openHandle(forReadingFrom: url)
        do {
            let data = try await handle.readToEnd()
            try await handle.close()
            return data
        } catch {
            try? await handle.close()
            throw error
        }
    }

    // MARK: - Handles

    /// Opens a protected file for reading.
    public func openHandle(forReadingFrom url: URL) async throws -> ProtectedFileHandle {
        try await openHandle(url, writable: false)
    }

    /// Opens a protected file for reading and writing.
    public func openHandle(forUpdating url: URL) async throws -> ProtectedFileHandle {
        try await openHandle(url, writable: true)
    }

    /// Creates a new, empty protected file (replacing none: fails if `url` exists) and opens it
    /// for writing. Class B works while locked: the handle keeps the new key until closed.
    /// A handle is for reading and writing at offsets, so the file gets 4 KiB segments unless
    /// `access` says it will be streamed (``ProtectedFileAccessPattern``).
    public func createFile(
        at url: URL, protection: ProtectionClass? = nil, thisDeviceOnly: Bool = false,
        access: ProtectedFileAccessPattern = .randomAccess
    ) async throws -> ProtectedFileHandle {
        try await createFile(
            at: url, protection: protection, thisDeviceOnly: thisDeviceOnly,
            segmentSizeLog2: segmentSizeLog2(for: access))
    }

    func createFile(
        at url: URL, protection: ProtectionClass?, thisDeviceOnly: Bool, segmentSizeLog2: UInt8
    ) async throws -> ProtectedFileHandle {
        if servedByFileSystem {
            return try await createServedFile(at: url, protection: protection ?? defaultProtection(forNewItemAt: url))
        }
        let path = url.path
        return try await ProtectedFileError.translating(path: path, writing: true) {
            let cls = protection ?? defaultProtection(forNewItemAt: url)
            let (header, keys) = try await newFileKeys(
                cls, thisDeviceOnly: thisDeviceOnly, segmentSizeLog2: segmentSizeLog2, path: path)
            let fd = try POSIXFile.open(
                path, .readWrite, options: [.create, .exclusiveCreate], permissions: FilePermissions(rawValue: 0o644))
            do {
                return try await newFileHandle(owning: fd, url: url, header: header, keys: keys)
            } catch {
                try? fd.close()
                _ = try? POSIXFile.call("unlink", path) { unlink($0) }
                throw error
            }
        }
    }

    /// log2 of the segment size for a new file used as `access` says.
    func segmentSizeLog2(for access: ProtectedFileAccessPattern) -> UInt8 {
        access == .sequential ? segmentSizeLog2 : randomAccessSegmentSizeLog2
    }

    /// A new file's header and keys: a fresh file key wrapped for `cls`, a random file ID.
    /// `path` names the new file in errors.
    func newFileKeys(
        _ cls: ProtectionClass, thisDeviceOnly: Bool, segmentSizeLog2: UInt8, path: String
    ) async throws -> (ProtectedFileHeader, FileKeys) {
        guard ProtectedFileHeader.segmentSizeLog2Range.contains(segmentSizeLog2) else {
            throw ProtectedFileError.invalidRange(
                path: path, reason: "segment size 2^\(segmentSizeLog2) (2^12 to 2^24)")
        }
        let (key, wrapped) = try await keybag.wrapNewFileKey(for: cls, thisDeviceOnly: thisDeviceOnly)
        // Files made for random access are written in place: page-aligned segments (format 2),
        // so that a write cut short leaves every segment whole.
        let version =
            segmentSizeLog2 == ProtectedFileHeader.randomAccessSegmentSizeLog2
            ? ProtectedFileHeader.pageAlignedVersion : ProtectedFileHeader.version
        let header = ProtectedFileHeader(
            version: version, segmentSizeLog2: segmentSizeLog2, fileID: randomFileID(), wrappedKey: wrapped)
        return (header, FileKeys(fileKey: key, fileID: header.fileID))
    }

    /// A writable handle on the new, empty file open at `fd` (which the handle then owns), after
    /// writing its header and its one empty final segment.
    func newFileHandle(
        owning fd: FileDescriptor, url: URL, header: ProtectedFileHeader, keys: FileKeys
    ) async throws -> ProtectedFileHandle {
        let cls = header.protectionClass
        let engine = try SegmentedFile.create(fd: fd, path: url.path, header: header, keys: keys)
        let generation = cls == .completeUnlessOpen ? nil : try await keybag.generation(of: cls)
        return ProtectedFileHandle(
            url: url, keybag: keybag, fd: fd, header: header,
            engine: engine, keyGeneration: generation, writable: true)
    }

    private func openHandle(_ url: URL, writable: Bool) async throws -> ProtectedFileHandle {
        let path = url.path
        return try await servedTranslating(path: path, writing: writable) {
            if POSIXFile.kind(path).isDirectory { throw ProtectedFileError.isDirectory(path: path) }
            let fd = try POSIXFile.open(path, writable ? .readWrite : .readOnly)
            do {
                return try await openHandle(owning: fd, url: url, writable: writable)
            } catch {
                try? fd.close()
                throw error
            }
        }
    }

    /// A handle on the protected file open at `fd`, which the handle then owns (closes).
    func openHandle(owning fd: FileDescriptor, url: URL, writable: Bool) async throws -> ProtectedFileHandle {
        if servedByFileSystem { return try await openServedHandle(owning: fd, url: url, writable: writable) }
        let path = url.path
        let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
        guard ProtectedFileHeader.looksProtected(headerBytes) else { throw ProtectedFileError.notProtected(path: path) }
        let header = try ProtectedFileHeader.parse(headerBytes, path: path)
        let cls = header.protectionClass
        let (key, classGeneration) = try await keybag.unwrapFileKeyWithGeneration(header.wrappedKey)
        let generation = cls == .completeUnlessOpen ? nil : classGeneration
        let engine = try SegmentedFile.open(
            fd: fd, path: path, headerBytes: headerBytes, header: header,
            keys: FileKeys(fileKey: key, fileID: header.fileID))
        return ProtectedFileHandle(
            url: url, keybag: keybag, fd: fd, header: header,
            engine: engine, keyGeneration: generation, writable: writable)
    }

    // MARK: - Changing protection

    /// Sets the class of an item, like `setAttributes([.protectionKey: …])`:
    /// - a protected file: its key is rewrapped; the content is not re-encrypted;
    /// - a plain file: converted in place to the protected format, atomically;
    /// - a directory: its default for new files; files already in it keep their class.
    public func setProtection(_ cls: ProtectionClass, ofItemAt url: URL) async throws {
        let path = url.path
        if servedByFileSystem {
            // The file system rewraps a file's key, or sets a directory's default, and refuses a
            // class below the container's (`EPERM`) and a plain file (`ENOTSUP`).
            return try await servedTranslating(path: path, writing: true, protection: cls) {
                try wrapFS { try DirectoryDefault.set(cls, path) }
            }
        }
        switch try protection(ofItemAt: url) {
        case .directory:
            try wrapFS { try DirectoryDefault.set(cls, path) }
        case .plain:
            let source = try await ProtectedFileError.translating(path: path, writing: false) {
                try POSIXFile.open(path, .readOnly)
            }
            defer { try? source.close() }
            try await write(contentsOf: source, to: url, protection: cls)
        case .protected(let current):
            guard current != cls else { return }
            try await rewrapHeader(of: url) { wrapped in
                let key = try await keybag.unwrapFileKey(wrapped)
                return (key, try await keybag.wrap(key, for: cls, thisDeviceOnly: wrapped.thisDeviceOnly))
            }
        case .other:
            try ProtectedFileError.checkReplaceable(path)
            throw ProtectedFileError.notProtected(path: path)
        }
    }

    /// Gives a protected file a new wrapping of its (unchanged) key and rewrites the header in
    /// place: 160 bytes at offset 0 sit in one disk sector, so the rewrite is all or nothing.
    /// The header MAC is checked with the old key before anything is written.
    func rewrapHeader(
        of url: URL, _ rewrap: (WrappedFileKey) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey)
    ) async throws {
        let path = url.path
        try await ProtectedFileError.translating(path: path, writing: true) {
            let fd = try POSIXFile.open(path, .readWrite)
            defer { try? fd.close() }
            let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
            guard ProtectedFileHeader.looksProtected(headerBytes) else {
                throw ProtectedFileError.notProtected(path: path)
            }
            var header = try ProtectedFileHeader.parse(headerBytes, path: path)
            let (key, wrapped) = try await rewrap(header.wrappedKey)
            let keys = FileKeys(fileKey: key, fileID: header.fileID)
            guard ProtectedFileHeader.verify(headerBytes, keys: keys) else {
                throw ProtectedFileError.damaged(path: path, reason: "header authentication failed")
            }
            header.wrappedKey = wrapped
            try POSIXFile.write(fd, header.encoded(keys: keys), at: 0, path: path)
            try POSIXFile.sync(fd, path: path)
        }
    }

    /// Makes a protected file that another device wrote (restored from a backup) this device's:
    /// its key is unwrapped with the other device's class keys (from its backup keybag) and
    /// rewrapped under this keybag, in the same class unless `protection` names another. The
    /// content is not re-encrypted.
    public func adoptFile(
        at url: URL, from backupKeys: BackupClassKeys, protection: ProtectionClass? = nil
    ) async throws {
        try await rewrapHeader(of: url) { wrapped in
            try await keybag.adoptFileKey(wrapped, from: backupKeys, as: protection)
        }
    }

    /// Removes a directory's default class (new files then inherit from further up).
    public func removeDefaultProtection(ofDirectoryAt url: URL) throws {
        try wrapFS { try DirectoryDefault.set(nil, url.path) }
    }

    /// `FileManager.attributesOfItem(atPath:)` plus `.protectionKey` (a `FileProtectionType`,
    /// absent for plain files) and, for protected files, `.size` as the plaintext size.
    public func attributesOfItem(atPath path: String) throws -> [FileAttributeKey: Any] {
        var attributes: [FileAttributeKey: Any]
        do { attributes = try FileManager.default.attributesOfItem(atPath: path) } catch {
            throw ProtectedFileError.noSuchFile(path: path)
        }
        let url = URL(fileURLWithPath: path)
        switch try protection(ofItemAt: url) {
        case .protected(let cls):
            attributes[.protectionKey] = cls.fileProtectionType
            attributes[.size] = NSNumber(value: try plaintextSize(ofItemAt: url))
        case .directory(let cls?):
            attributes[.protectionKey] = cls.fileProtectionType
        default: break
        }
        return attributes
    }

    /// `FileManager.setAttributes(_:ofItemAtPath:)`: `.protectionKey` changes the class (see
    /// ``setProtection(_:ofItemAt:)``); the other keys go to `FileManager`.
    public func setAttributes(_ attributes: [FileAttributeKey: Any], ofItemAtPath path: String) async throws {
        var rest = attributes
        if let value = rest.removeValue(forKey: .protectionKey) {
            let type: FileProtectionType
            if let t = value as? FileProtectionType {
                type = t
            } else if let s = value as? String {
                type = FileProtectionType(rawValue: s)
            } else {
                throw ProtectedFileError.keybag(.unsupportedProtectionType(String(describing: value)))
            }
            do {
                try await setProtection(try ProtectionClass(type), ofItemAt: URL(fileURLWithPath: path))
            } catch let error as KeybagError { throw ProtectedFileError.keybag(error) }
        }
        if !rest.isEmpty { try FileManager.default.setAttributes(rest, ofItemAtPath: path) }
    }

    // MARK: - Helpers

    func wrapFS<T>(_ body: () throws -> T) throws -> T { try ItemInspector.wrapFS(body) }

}

/// A new file's random ID: 16 bytes from swift-crypto's CSPRNG in one call (one `getrandom`,
/// where drawing each byte from the standard library's generator made sixteen).
func randomFileID() -> [UInt8] { SymmetricKey(size: SymmetricKeySize(bitCount: 128)).withUnsafeBytes { Array($0) } }
