import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Opens paths inside directories an app can write, without ever following what the app could
/// have planted there: `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV` — no `..` out, no symbolic link at any step, no
/// `/proc` magic link, no other mount (FORMAT.md §11.1).
enum BeneathOpen {
    static let resolve: SystemCall.Resolve = [.beneath, .noSymlinks, .noMagicLinks, .noCrossDevice]

    /// Opens the directory at `path` (absolute; the trusted starting point) itself, refusing a
    /// link at its last step.
    static func directory(_ path: String) throws -> FileDescriptor {
        let fd = try LosslessPath.withCString(path) { Glibc.open($0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw error(Errno(rawValue: errno), path: path) }
        return FileDescriptor(rawValue: fd)
    }

    /// Opens `relative` beneath `directory` (`path` names it in errors). `flags` are `open(2)`'s;
    /// `mode` counts only with `O_CREAT` (openat2 refuses a mode otherwise).
    static func open(
        _ relative: String, beneath directory: FileDescriptor, flags: Int32, mode: mode_t = 0o600,
        path: String
    ) throws -> FileDescriptor {
        let opened = try LosslessPath.withCString(relative.isEmpty ? "." : relative) { relative in
            Result { () throws(Errno) in
                try SystemCall.openat2(
                    directory.rawValue, relative, flags | O_CLOEXEC | O_NOFOLLOW,
                    mode: flags & O_CREAT != 0 ? UInt32(mode) : 0,
                    resolve: resolve)
            }
        }
        return FileDescriptor(rawValue: try opened.mapError { error($0, path: path) }.get())
    }

    /// The error a refused or failed open means.
    static func error(_ errno: Errno, path: String) -> Error {
        switch errno {
        case .noSuchFileOrDirectory: SharingError.noSuchItem(path: path)
        case .tooManySymbolicLinkLevels:
            SharingError.refusedItem(path: path, reason: "is, or passes through, a symbolic link")
        case .improperLink: SharingError.refusedItem(path: path, reason: "leads out of its container")
        case .notDirectory:
            SharingError.refusedItem(
                path: path, reason: "is, or passes through, something that is not a directory (a link?)")
        default: FileSystemError("openat2", path: path, errno: errno)
        }
    }

    /// `fstat(2)`.
    static func status(_ fd: FileDescriptor, path: String) throws -> stat {
        var st = stat()
        guard fstat(fd.rawValue, &st) == 0 else {
            throw FileSystemError("fstat", path: path, errno: Errno(rawValue: errno))
        }
        return st
    }

    /// Refuses anything but a regular file with no other hard link (another name could be a file
    /// the app reached elsewhere, or one that changes under the share).
    static func requireSingleRegularFile(_ st: stat, path: String) throws {
        switch st.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: throw SharingError.refusedItem(path: path, reason: "is a directory (share the files in it)")
        case S_IFIFO: throw SharingError.refusedItem(path: path, reason: "is a FIFO")
        case S_IFCHR, S_IFBLK: throw SharingError.refusedItem(path: path, reason: "is a device")
        case S_IFSOCK: throw SharingError.refusedItem(path: path, reason: "is a socket")
        default: throw SharingError.refusedItem(path: path, reason: "is not a regular file")
        }
        if st.st_nlink > 1 { throw SharingError.refusedItem(path: path, reason: "has \(st.st_nlink) hard links") }
    }
}
