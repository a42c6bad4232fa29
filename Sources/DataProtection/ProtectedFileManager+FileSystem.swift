import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A manager on the protected file system (an app whose containers it serves): files are read
/// and written as plaintext and the file system seals them, with the class of their directory
/// — never below the container's — and enforces the class at every call. Classes are the
/// file system's `user.dataprotection.class` attribute (setting it rewraps the file's key, in the
/// file system). No key is ever asked for: the keybag answers lock-state questions only.
extension ProtectedFileManager {
    /// What `url` holds, on the file system: a file with a class is protected (in the file
    /// system's format on disk), one without is a plain file the file system serves read-only.
    func servedProtection(ofItemAt url: URL) throws -> ItemProtection {
        let path = url.path
        guard let st = POSIXFile.status(path) else { throw ProtectedFileError.noSuchFile(path: path) }
        switch st.st_mode & S_IFMT {
        case S_IFDIR: return .directory(defaultClass: try wrapFS { try DirectoryDefault.get(path) })
        case S_IFREG:
            // The class attribute means something only where the file system serves it: elsewhere
            // (an app's /tmp) anyone may set it on a plain file, and the file is what its bytes are.
            guard Self.isOnProtectedFileSystem(path: path) else { return try ItemInspector.protection(ofItemAt: url) }
            return try wrapFS { try DirectoryDefault.get(path) }.map { .protected($0) } ?? .plain
        default: return .other
        }
    }

    /// Writes a file atomically through the file system: a temporary sibling given `cls` (the
    /// file system refuses a class below the container's: the file keeps the container's then),
    /// filled, flushed, renamed over `url`.
    func writeServedAtomically(
        to url: URL, protection cls: ProtectionClass, keepingMode: Bool, replacement: POSIXFile.Replacement = .durable,
        _ fill: @escaping (any PlaintextStorage) throws -> Void
    ) async throws {
        let path = url.path
        try await servedTranslating(path: path, writing: true, protection: cls) {
            if POSIXFile.kind(path).isDirectory { throw ProtectedFileError.isDirectory(path: path) }
            try ProtectedFileError.checkReplaceable(path)
            try POSIXFile.replaceAtomically(
                path, permissions: keepingMode ? nil : FilePermissions(rawValue: 0o600), replacement: replacement
            ) { fd, temp in
                try Self.setServedClass(cls, of: fd, path: temp)
                try fill(PlainFileStorage(fd: fd, path: temp))
            }
        }
    }

    /// A handle on the file the file system serves at `fd` (the handle then owns it).
    /// A plain file (no class) is ``ProtectedFileError/notProtected(path:)`` — but a protected
    /// file reached outside the file system (its bytes are ciphertext) is never taken as plain.
    func openServedHandle(owning fd: FileDescriptor, url: URL, writable: Bool) async throws -> ProtectedFileHandle {
        let value = try POSIXFile.system("fgetxattr", url.path) { try Self.servedClass(of: fd) }
        guard let cls = value else {
            if !Self.isOnProtectedFileSystem(fd),
                ProtectedFileHeader.looksProtected(
                    (try? POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: url.path)) ?? [])
            {
                throw ProtectedFileError.damaged(
                    path: url.path,
                    reason: "a protected file reached outside the protected file system, where no key is held")
            }
            throw ProtectedFileError.notProtected(path: url.path)
        }
        return ProtectedFileHandle(url: url, keybag: keybag, fd: fd, servedFile: cls, writable: writable)
    }

    /// Whether the protected file system serves `path` (the mount it is on is of type
    /// `fuse.dataprotection`, as `/proc/self/mountinfo` says): inside an app, its containers.
    package static func isServedByProtectedFileSystem(_ path: String) -> Bool {
        let absolute = URL(fileURLWithPath: path).standardizedFileURL.resolvingSymlinksInPath().path
        return MountTable.mount(covering: absolute)?.type == "fuse.dataprotection"
    }

    /// Whether `fd` is a file of a FUSE file system (the protected file system is one; a
    /// sandboxed app sees no other).
    static func isOnProtectedFileSystem(_ fd: FileDescriptor) -> Bool {
        (try? SystemCall.fstatfsType(fd.rawValue)) == SystemCall.fuseSuperMagic
    }

    /// Whether the item at `path` is on a FUSE file system (`statfs`).
    static func isOnProtectedFileSystem(path: String) -> Bool {
        (try? SystemCall.statfsType(path)) == SystemCall.fuseSuperMagic
    }

    /// A new, empty file through the file system, of `cls`, opened for writing.
    func createServedFile(at url: URL, protection cls: ProtectionClass) async throws -> ProtectedFileHandle {
        let path = url.path
        return try await servedTranslating(path: path, writing: true, protection: cls) {
            let fd = try POSIXFile.open(
                path, .readWrite, options: [.create, .exclusiveCreate], permissions: FilePermissions(rawValue: 0o644))
            do {
                try Self.setServedClass(cls, of: fd, path: path)
                return ProtectedFileHandle(
                    url: url, keybag: keybag, fd: fd, servedFile: (try? Self.servedClass(of: fd)) ?? cls, writable: true
                )
            } catch {
                try? fd.close()
                _ = try? POSIXFile.call("unlink", path) { unlink($0) }
                throw error
            }
        }
    }

    /// Gives the file at `fd` class `cls` through the file system's attribute; one below the
    /// container's is refused there (`EPERM`) and the file keeps the container's class.
    static func setServedClass(_ cls: ProtectionClass, of fd: FileDescriptor, path: String) throws {
        // Elsewhere the attribute would be a label on plaintext.
        guard isOnProtectedFileSystem(fd) else {
            throw FileSystemError(
                "protect (outside the protected file system, which serves an app's containers)", path: path,
                errno: .notSupported)
        }
        let value = Array(cls.shortName.utf8)
        do throws(Errno) { try SystemCall.fsetxattr(fd.rawValue, DirectoryDefault.attribute, value) } catch {
            if error != .notPermitted { throw FileSystemError("fsetxattr", path: path, errno: error) }
        }
    }

    /// The class the file system reports for the file at `fd`; `nil` for a plain file.
    static func servedClass(of fd: FileDescriptor) throws -> ProtectionClass? {
        var buffer = [UInt8](repeating: 0, count: 64)
        let n: Int
        do throws(Errno) { n = try SystemCall.fgetxattr(fd.rawValue, DirectoryDefault.attribute, &buffer) } catch {
            if error == .noData || error == .notSupported { return nil }
            throw error
        }
        return ProtectionClass(name: String(decoding: buffer[0..<n], as: UTF8.self))
    }

    /// Runs file system calls on a served file, reporting the file system's refusal of a class
    /// that is locked (`EACCES`) as ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``.
    func servedTranslating<T>(
        path: String, writing: Bool, protection: ProtectionClass? = nil,
        _ body: () async throws -> T
    ) async throws -> T {
        do {
            return try await ProtectedFileError.translating(path: path, writing: writing, body)
        } catch ProtectedFileError.fileSystem(let failure) where failure.errno == .permissionDenied {
            let cls = protection ?? (try? servedProtection(ofItemAt: URL(fileURLWithPath: path)))?.fileClass
            if let cls, cls != .noProtection, (try? await keybag.generation(of: cls)) == nil {
                throw ProtectedFileError.unavailable(
                    path: path, protectionClass: cls, lockState: await keybag.lockState, writing: writing)
            }
            throw ProtectedFileError.fileSystem(failure)
        }
    }
}
