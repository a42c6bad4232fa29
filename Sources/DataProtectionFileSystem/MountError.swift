import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Why a protected file system could not be mounted or served.
public enum MountError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// This machine lacks a part FUSE needs (`/dev/fuse`, `fusermount3`).
    case unavailable(String)
    /// The mount point (or the directory to serve) cannot be used.
    case badMountPoint(String, String)
    /// A system call failed: what was done, and the call's error.
    case system(String, Errno)

    public var description: String {
        switch self {
        case .unavailable(let why): "the protected file system cannot be mounted here: \(why)"
        case .badMountPoint(let path, let why): "\(path) \(why)"
        case .system(let call, let errno): "\(call): \(errno.description)"
        }
    }

    public var errorDescription: String? { description }
}
