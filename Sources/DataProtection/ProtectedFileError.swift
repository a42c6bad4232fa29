import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// Errors of protected-file operations. Each says what happened to which file and what to do;
/// none of them ever comes with wrong plaintext.
public enum ProtectedFileError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The file's class is unavailable in the current lock state (iOS: `NSFileReadNoPermissionError`
    /// 257 when reading, `NSFileWriteNoPermissionError` 513 when writing).
    case unavailable(path: String, protectionClass: ProtectionClass, lockState: LockState, writing: Bool)
    /// The file is in the protected format but damaged: a bad header, a segment that fails
    /// authentication, truncation, extension, reordering or segments from another file.
    case damaged(path: String, reason: String)
    /// The file header names a format version this build cannot read.
    case unsupportedVersion(path: String, version: UInt16)
    /// The file was protected by another keybag (another device, or this root before an erase).
    case foreignKeybag(path: String)
    /// The operation needs a protected file, but the file is plain.
    case notProtected(path: String)
    /// No file or directory at the path.
    case noSuchFile(path: String)
    /// A directory was found where a file was expected.
    case isDirectory(path: String)
    /// Something other than a regular file is where a file would be replaced or converted: a
    /// symbolic link (replacing it would leave its target as it was), a device, a FIFO or a
    /// socket. `kind` says which ("a symbolic link to /etc/hostname", "a character device").
    case notARegularFile(path: String, kind: String)
    /// A directory cannot be copied into itself or below itself.
    case copyIntoItself(path: String, destination: String)
    /// The handle was closed.
    case closed(path: String)
    /// An offset or length outside what the file allows.
    case invalidRange(path: String, reason: String)
    /// The keybag refused (wrong state, erased …).
    case keybag(KeybagError)
    /// A file-system call failed (permissions, a full disk …). Nothing was replaced.
    case fileSystem(FileSystemError)
    /// Re-protecting a tree was interrupted (its task cancelled: Ctrl-C in dpctl) after
    /// `completed` of `total` items; each item is whole (its old or its new self), and running
    /// it again finishes the rest.
    case interrupted(completed: Int, total: Int)

    public var description: String {
        switch self {
        case .unavailable(let path, let cls, let state, let writing):
            "\(path): class \(cls) data cannot be \(writing ? "written" : "read") while the device is \(state.phrase)"
        case .damaged(let path, let reason):
            "\(path): damaged protected file: \(reason)"
        case .unsupportedVersion(let path, let version):
            "\(path): protected file format version \(version) is not supported by this build"
        case .foreignKeybag(let path):
            "\(path): protected by another device's keybag; it cannot be decrypted here"
        case .notProtected(let path):
            "\(path): not a protected file (protect it to convert it in place)"
        case .noSuchFile(let path):
            "\(path): no such file or directory"
        case .isDirectory(let path):
            "\(path): is a directory"
        case .notARegularFile(let path, let kind):
            kind.hasPrefix("a symbolic link")
                ? "\(path): is \(kind); name the file itself (a link is never replaced)"
                : "\(path): is \(kind), not a regular file; nothing was written"
        case .copyIntoItself(let path, let destination):
            "\(path): a directory cannot be copied into itself (\(destination))"
        case .closed(let path):
            "\(path): the file handle is closed"
        case .invalidRange(let path, let reason):
            "\(path): \(reason)"
        case .keybag(let error):
            error.description
        case .interrupted(let completed, let total):
            "interrupted: \(completed) of \(total) items done, each one whole (a file is its old or its new self); run it again to finish"
        case .fileSystem(let error):
            error.description
        }
    }
}

extension ProtectedFileError: LocalizedError {
    public var errorDescription: String? { description }
}

extension ProtectedFileError: CustomNSError {
    public static var errorDomain: String { NSCocoaErrorDomain }

    /// The `CocoaError` code iOS reports: 257 (`fileReadNoPermission`) or 513
    /// (`fileWriteNoPermission`) for an unavailable class, 260 for a missing file,
    /// 259 (`fileReadCorruptFile`) for a damaged one, 640 for a full disk.
    public var errorCode: Int { cocoaCode.rawValue }

    public var errorUserInfo: [String: Any] {
        var info: [String: Any] = [NSLocalizedDescriptionKey: description]
        if let path { info[NSFilePathErrorKey] = path }
        return info
    }

    /// The same error as Foundation's `CocoaError`.
    ///
    /// ```swift
    /// catch let error as ProtectedFileError where error.cocoaError.code == .fileReadNoPermission { … }
    /// ```
    public var cocoaError: CocoaError {
        var info: [String: Any] = [NSLocalizedDescriptionKey: description]
        if let path { info[NSFilePathErrorKey] = path }
        return CocoaError(cocoaCode, userInfo: info)
    }

    private var cocoaCode: CocoaError.Code {
        switch self {
        case .unavailable(_, _, _, let writing): writing ? .fileWriteNoPermission : .fileReadNoPermission
        case .damaged, .unsupportedVersion, .foreignKeybag, .notProtected: .fileReadCorruptFile
        case .noSuchFile: .fileReadNoSuchFile
        case .fileSystem(let error) where error.errno == .noSpace: .fileWriteOutOfSpace
        case .fileSystem(let error) where error.errno == .permissionDenied: .fileWriteNoPermission
        default: .fileReadUnknown
        }
    }

    /// The path the error is about.
    public var path: String? {
        switch self {
        case .unavailable(let p, _, _, _), .damaged(let p, _), .unsupportedVersion(let p, _), .foreignKeybag(let p),
            .notProtected(let p), .noSuchFile(let p), .isDirectory(let p), .notARegularFile(let p, _),
            .copyIntoItself(let p, _), .closed(let p), .invalidRange(let p, _):
            p
        case .fileSystem(let e): e.path
        case .keybag, .interrupted: nil
        }
    }
}

extension ProtectedFileError {
    /// The same error about `path` (for a file read through a descriptor, `/proc/self/fd/N`,
    /// whose errors should name the file the user knows).
    public func naming(_ path: String) -> ProtectedFileError {
        switch self {
        case .unavailable(_, let cls, let state, let writing):
            .unavailable(path: path, protectionClass: cls, lockState: state, writing: writing)
        case .damaged(_, let reason): .damaged(path: path, reason: reason)
        case .unsupportedVersion(_, let version): .unsupportedVersion(path: path, version: version)
        case .foreignKeybag: .foreignKeybag(path: path)
        case .notProtected: .notProtected(path: path)
        case .noSuchFile: .noSuchFile(path: path)
        case .isDirectory: .isDirectory(path: path)
        case .notARegularFile(_, let kind): .notARegularFile(path: path, kind: kind)
        case .closed: .closed(path: path)
        case .invalidRange(_, let reason): .invalidRange(path: path, reason: reason)
        case .copyIntoItself, .keybag, .fileSystem, .interrupted: self
        }
    }

    /// Throws ``notARegularFile(path:kind:)`` when `path` is a symbolic link, a device, a FIFO
    /// or a socket: only a regular file (or nothing) is replaced by an atomic write.
    static func checkReplaceable(_ path: String) throws {
        guard let st = POSIXFile.linkStatus(path) else { return }
        let kind: String
        switch st.st_mode & S_IFMT {
        case S_IFREG, S_IFDIR: return   // a directory is refused as such by the caller
        case S_IFLNK: kind = "a symbolic link" + ((try? POSIXFile.linkTarget(path)).map { " to \($0)" } ?? "")
        case S_IFCHR: kind = "a character device"
        case S_IFBLK: kind = "a block device"
        case S_IFIFO: kind = "a FIFO"
        case S_IFSOCK: kind = "a socket"
        default: kind = "not a file"
        }
        throw ProtectedFileError.notARegularFile(path: path, kind: kind)
    }

    /// Runs `body`, translating keybag and file-system errors into `ProtectedFileError`s about `path`.
    static func translating<T>(
        path: String, writing: Bool, isolation: isolated (any Actor)? = #isolation,
        _ body: () async throws -> T
    ) async throws -> T {
        do {
            return try await body()
        } catch let error as ProtectedFileError {
            throw error
        } catch let error as KeybagError {
            throw translate(error, path: path, writing: writing)
        } catch let error as FileSystemError {
            if error.errno == .noSuchFileOrDirectory { throw ProtectedFileError.noSuchFile(path: error.path) }
            if error.errno == .isDirectory { throw ProtectedFileError.isDirectory(path: error.path) }
            throw ProtectedFileError.fileSystem(error)
        }
    }

    static func translate(_ error: KeybagError, path: String, writing: Bool) -> ProtectedFileError {
        switch error {
        case .classUnavailable(let cls, let state):
            .unavailable(path: path, protectionClass: cls, lockState: state, writing: writing)
        case .foreignKeybag: .foreignKeybag(path: path)
        case .keyUnwrapFailed: .damaged(path: path, reason: "the wrapped file key does not unwrap")
        default: .keybag(error)
        }
    }
}
