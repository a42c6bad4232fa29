import DataProtection
import DataProtectionFileSystem
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The protected file system that serves a data root's containers to its apps: one FUSE mount
/// of `ROOT/Containers` per data root, shared by every sandbox (each binds its own containers
/// from it), so the apps of a group work on one file system — one page cache, one set of
/// locks, inotify across them — as the Flatpak document portal and Android's scoped storage do.
/// Every regular file any program writes there is a protected file of its directory's class,
/// never below the class the user chose for the container (FORMAT.md §10.6).
///
/// A server process serves it while any app holds a ``Lease``: the first app to run starts it
/// (``Launcher``), the last one to end lets it go.
public enum ContainerFileSystem {
    /// Starts a server process for a data root, whose standard output is the returned descriptor:
    /// the server writes one line there once it serves.
    public typealias Launcher = @Sendable (_ root: String) throws -> Int32

    /// A launcher that serves the containers in this process (a task), for a process that
    /// supervises every app it runs for as long as they run (an example, a test): it serves until
    /// no lease is left.
    public static func inProcess(_ manager: ContainerManager) -> Launcher {
        { _ in
            let ends: (read: Int32, write: Int32)
            do throws(Errno) { ends = try SystemCall.pipe2CloseOnExec() } catch {
                throw unavailable("pipe: \(error.description)")
            }
            let readiness = ends.write
            Task.detached { try? await serve(manager, readiness: readiness, linger: .zero) }
            return ends.read
        }
    }

    /// What the first line on a lease's socket starts with (then a space, the mount point, `\n`).
    static let greeting = "DPFS1"

    /// Where the file system of `layout`'s root is mounted, beside keybagd's socket.
    public static func mountPoint(for layout: DataRootLayout) -> String {
        KeybagSocket.directory() + "/containers-\(KeybagSocket.rootDigest(layout.root))"
    }

    static func socketPath(for layout: DataRootLayout) -> String { mountPoint(for: layout) + ".sock" }

    /// `ROOT/containers-fs.lock`: held while a client connects (or starts a server) and while a
    /// server that no one uses any more decides to end.
    static func lockPath(for layout: DataRootLayout) -> String { layout.root + "/containers-fs.lock" }

    /// An app's hold on the file system: it stays mounted while the lease is open.
    public final class Lease: Sendable {
        /// Where `ROOT/Containers` is served.
        public let mountPoint: String
        private let connection: Int32

        init(mountPoint: String, connection: Int32) {
            self.mountPoint = mountPoint
            self.connection = connection
        }

        /// Where `path` (inside `ROOT/Containers`) is served.
        public func served(_ path: String, layout: DataRootLayout) -> String {
            mountPoint + path.dropFirst(layout.containers.count)
        }

        /// Tells the server that the sandbox whose process `pid` is runs `app`, owning the
        /// subtrees of `territories` (its container, its groups' containers): what the app
        /// reaches outside them it may use only as the descriptor it was handed allows
        /// (``ServedApps``). Ends with the lease.
        ///
        /// - Throws: ``ContainerError/launchFailed(_:)`` when the server refuses or does not answer.
        public func admit(sandboxProcess pid: Int32, app: UUID, territories: [String], layout: DataRootLayout) throws {
            var line = "admit \(pid) \(app.uuidString)"
            for territory in territories {
                guard territory.hasPrefix(layout.containers + "/") else {
                    throw ContainerError.launchFailed(
                        "\(territory) is not inside the containers the file system serves")
                }
                line += " " + territory.dropFirst(layout.containers.count + 1)
            }
            do { try IPCFrame.sendBytes(connection, Array((line + "\n").utf8)) } catch let error as IPCError {
                throw ContainerError.launchFailed("the containers' file system server went away (\(error.description))")
            }
            guard let reply = ContainerFileSystem.readLine(connection, timeout: 30) else {
                throw ContainerError.launchFailed("the containers' file system server did not answer within 30 s")
            }
            guard reply == "ok" else {
                throw ContainerError.launchFailed(reply.hasPrefix("error: ") ? String(reply.dropFirst(7)) : reply)
            }
        }

        deinit { close(connection) }
    }

    /// Takes a lease on the file system serving `layout`'s containers, starting its server with
    /// `launch` when none serves them.
    ///
    /// - Throws: ``ContainerError/sandboxUnavailable(_:)`` when no server could be reached or started.
    public static func lease(_ layout: DataRootLayout, launch: Launcher) throws -> Lease {
        do { try MountedFileSystem.checkAvailability() } catch let error as MountError {
            if case .unavailable(let why) = error {
                throw ContainerError.sandboxUnavailable("apps' containers are served through FUSE: \(why)")
            }
            throw unavailable(error.description)
        }
        let lockPath = lockPath(for: layout)
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard lock >= 0 else { throw unavailable("cannot open \(lockPath): \(String(cString: strerror(errno)))") }
        defer { close(lock) }
        while flock(lock, LOCK_EX) != 0 {
            guard errno == EINTR else {
                throw unavailable("cannot lock \(lockPath): \(String(cString: strerror(errno)))")
            }
        }
        if let lease = try connect(layout) { return lease }
        let readiness = try launch(layout.root)
        defer { close(readiness) }
        let line = readLine(readiness, timeout: 60)
        guard line == "ready" else {
            throw unavailable("its server did not start" + (line.map { ": \($0)" } ?? " (no answer within 60 s)"))
        }
        guard let lease = try connect(layout) else {
            throw unavailable("its server started but does not answer on \(socketPath(for: layout))")
        }
        return lease
    }

    /// Connects to a running server: `nil` when none listens.
    private static func connect(_ layout: DataRootLayout) throws -> Lease? {
        let path = socketPath(for: layout)
        let fd: Int32?
        do { fd = try UnixSocket.connectTrusted(path, timeout: 30) } catch let error as IPCError {
            throw unavailable(error.description)
        }
        guard let fd else { return nil }
        guard let line = readLine(fd, timeout: 30), line.hasPrefix(greeting + " ") else {
            close(fd)
            return nil   // a server on its way out
        }
        return Lease(mountPoint: String(line.dropFirst(greeting.count + 1)), connection: fd)
    }

    static func unavailable(_ reason: String) -> ContainerError {
        .sandboxUnavailable("the protected file system for the containers is unavailable: \(reason)")
    }

    /// One line (without its `\n`, at most 4 KiB) from `fd`, waiting at most `timeout` seconds.
    static func readLine(_ fd: Int32, timeout: Int32) -> String? {
        var bytes: [UInt8] = []
        while bytes.count < 4096 {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, timeout * 1000)
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { return nil }
            var byte: UInt8 = 0
            let n = read(fd, &byte, 1)
            if n < 0, errno == EINTR { continue }
            guard n == 1 else { return nil }
            if byte == 0x0A { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        return nil
    }
}
