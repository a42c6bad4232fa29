import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// "This app is running": a shared `flock` on `ROOT/Containers/.running/<UUID>.lock`, held by
/// each supervisor for as long as it runs the app. Uninstall, and tools that change an app's
/// files from outside (re-protection, `dpctl defaults`), take it exclusively and refuse while
/// the app runs — so nothing the app does can race them. The lock lives where no app can see it
/// (an app that could `chmod` it could block its own uninstall forever).
final class RunningAppLock: Sendable {
    private let fd: Int32

    private init(fd: Int32) { self.fd = fd }

    static func path(_ layout: DataRootLayout, _ uuid: UUID) -> String {
        layout.containers + "/.running/" + uuid.uuidString + ".lock"
    }

    /// Holds the lock shared (a supervisor, while its app runs).
    static func shared(_ layout: DataRootLayout, _ uuid: UUID) throws -> RunningAppLock {
        try take(path(layout, uuid), LOCK_SH)!
    }

    /// Holds the lock exclusively, or `nil` when a supervisor runs the app.
    static func tryExclusive(_ layout: DataRootLayout, _ uuid: UUID) throws -> RunningAppLock? {
        try take(path(layout, uuid), LOCK_EX | LOCK_NB)
    }

    private static func take(_ path: String, _ operation: Int32) throws -> RunningAppLock? {
        try makeDirectory(URL(fileURLWithPath: path).deletingLastPathComponent().path)
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            throw ContainerError.fileSystem(FileSystemError("open", path: path, errno: Errno(rawValue: errno)))
        }
        while flock(fd, operation) != 0 {
            if errno == EINTR { continue }
            let failure = errno
            close(fd)
            if failure == EWOULDBLOCK { return nil }
            throw ContainerError.fileSystem(FileSystemError("flock", path: path, errno: Errno(rawValue: failure)))
        }
        return RunningAppLock(fd: fd)
    }

    func release() { close(fd) }
}

extension ContainerManager {
    /// Runs `body` while none of `apps` runs (each one's lock held exclusively); otherwise
    /// ``ContainerError/appRunning(_:)`` names the first that does.
    package func whileNotRunning<T>(_ apps: [AppContainer], _ body: () async throws -> T) async throws -> T {
        var held: [RunningAppLock] = []
        defer { held.forEach { $0.release() } }
        for app in apps {
            guard let lock = try RunningAppLock.tryExclusive(layout, app.uuid) else {
                throw ContainerError.appRunning(app.identifier)
            }
            held.append(lock)
        }
        return try await body()
    }
}
