import DataProtectionKeybag
import Foundation
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// "This app is running": a shared `flock` on the container's directory, held by each supervisor
/// for as long as it runs the app; uninstall takes it exclusively and so never removes a
/// container from under a running app. (The directory, not a file in it: the app cannot replace
/// its own container's root, which is a mount point in its sandbox.)
final class RunningAppLock: Sendable {
    private let fd: Int32

    private init(fd: Int32) { self.fd = fd }

    /// Holds the lock shared (a supervisor, while its app runs).
    static func shared(container: String) throws -> RunningAppLock {
        try take(container: container, LOCK_SH, blocking: true)!
    }

    /// Holds the lock exclusively, or `nil` when a supervisor runs the app.
    static func tryExclusive(container: String) -> RunningAppLock? {
        try? take(container: container, LOCK_EX | LOCK_NB, blocking: false)
    }

    private static func take(container: String, _ operation: Int32, blocking: Bool) throws -> RunningAppLock? {
        let path = container
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { throw ContainerError.fileSystem(FileSystemError("open", path: path, errno: Errno(rawValue: errno))) }
        while flock(fd, operation) != 0 {
            if errno == EINTR { continue }
            close(fd)
            if errno == EWOULDBLOCK { return nil }
            throw ContainerError.fileSystem(FileSystemError("flock", path: path, errno: Errno(rawValue: errno)))
        }
        return RunningAppLock(fd: fd)
    }

    func release() { close(fd) }
}
