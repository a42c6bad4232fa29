import DataProtection
import DataProtectionFileSystem
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

extension ContainerFileSystem {
    /// Serves `manager`'s containers until no lease is left (the process that runs this is the
    /// server a ``Launcher`` starts): mounts `ROOT/Containers` — container floors from their
    /// metadata, set-ID bits refused — listens for leases, writes `ready` and a newline to
    /// `readiness`, and returns once no lease has been open for `linger` (the next app then
    /// starts in a few milliseconds, not with a new server) and the file system is unmounted.
    public static func serve(
        _ manager: ContainerManager, readiness: Int32, linger: Duration = .seconds(30), maxNodes: Int? = nil
    ) async throws {
        // `readiness` gets one line — `ready`, or `error: REASON` when serving could not start —
        // and is closed either way.
        var announced = false
        defer { if !announced { close(readiness) } }
        func announce(_ line: String) {
            _ = Array((line + "\n").utf8).withUnsafeBytes { write(readiness, $0.baseAddress, $0.count) }
            close(readiness)
            announced = true
        }
        do {
            try await serveAnnouncing(manager, linger: linger, maxNodes: maxNodes) { announce("ready") }
        } catch {
            if !announced { announce("error: \(error)") }
            throw error
        }
    }

    /// Removes the names shares' snapshots were opened by that a killed supervisor left
    /// (``DataRootLayout/servedSnapshotPrefix``): the snapshot itself stays where it is.
    private static func removeStraySnapshotNames(_ layout: DataRootLayout) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: layout.containers) else { return }
        for name in names where name.hasPrefix(DataRootLayout.servedSnapshotPrefix) {
            unlink(layout.containers + "/" + name)
        }
    }

    private static func serveAnnouncing(
        _ manager: ContainerManager, linger: Duration, maxNodes: Int?, ready: () -> Void
    ) async throws {
        let layout = manager.layout
        let logger = Logger(label: "dataprotection.containers.filesystem")
        let mountPoint = mountPoint(for: layout)
        let socketPath = socketPath(for: layout)
        let fileSystem = try ProtectedFileSystem(
            directory: layout.containers, files: ProtectedFileManager(keybag: manager.files.keybag),
            floorOfDirectory: ContainerMetadata.floor(ofDirectory:), refusesSetID: true,
            reservedNames: [DataRootLayout.containerMetadataFileName], sharesNodesAmongApps: true,
            servesWithoutPrivileges: true, readOnlyPrefixes: [DataRootLayout.servedSnapshotPrefix],
            maxNodes: maxNodes)
        removeStraySnapshotNames(layout)
        // The socket first: it makes the 0700 directory the mount point lives in.
        let listener: Int32
        do { listener = try UnixSocket.listen(on: socketPath) } catch let error as IPCError {
            throw unavailable(error.description)
        }
        defer { close(listener) }
        try prepareMountPoint(mountPoint)
        let mounted = try fileSystem.mount(at: mountPoint)
        let serving = Task { await mounted.serve() }
        let leases = LeaseCount()
        let acceptor = Thread {
            while true {
                let client: Int32
                do throws(Errno) { client = try SystemCall.accept4CloseOnExec(listener) } catch {
                    switch error {
                    case .interrupted, .connectionAbort, .protocolError: continue
                    case .tooManyOpenFiles, .tooManyOpenFilesInSystem, .noMemory, .noBufferSpace:
                        usleep(10_000)   // out of descriptors or memory for now: the next app waits, never in vain
                        continue
                    default: return   // the listener was shut down
                    }
                }
                guard UnixSocket.peerCredentials(client)?.uid == getuid() else { close(client); continue }
                leases.opened()
                let line = Array((greeting + " " + mountPoint + "\n").utf8)
                _ = line.withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
                Thread {
                    // The lease lasts until the client closes its end (or ends), and so do the
                    // admissions made on it.
                    var admissions: [ServedApps.Admission] = []
                    var line: [UInt8] = []
                    var buffer = [UInt8](repeating: 0, count: 4096)
                    reading: while true {
                        let n = buffer.withUnsafeMutableBytes { read(client, $0.baseAddress, $0.count) }
                        if n < 0, errno == EINTR { continue }
                        if n <= 0 { break }
                        for byte in buffer[0..<n] {
                            guard byte == 0x0A else {
                                line.append(byte)
                                if line.count > 64 * 1024 { break reading }   // no client of ours says that much
                                continue
                            }
                            let reply: String
                            do {
                                guard admissions.count < 64 else {
                                    throw unavailable("too many admissions on one lease")
                                }
                                admissions.append(try admit(line, to: fileSystem.apps, layout: layout))
                                reply = "ok"
                            } catch {
                                reply =
                                    "error: "
                                    + "\(error)".map { $0.isNewline ? " " : $0 }.reduce(into: "") { $0.append($1) }
                            }
                            line = []
                            try? IPCFrame.sendBytes(client, Array((reply + "\n").utf8))
                        }
                    }
                    for admission in admissions { admission.end() }
                    close(client)
                    leases.closed()
                }.start()
            }
        }
        acceptor.start()
        ready()
        logger.debug("serving \(layout.containers) at \(mountPoint)")
        // Ends when no lease is left and no client is connecting (they connect holding the lock).
        let lock = open(lockPath(for: layout), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        defer { if lock >= 0 { close(lock) } }
        while true {
            await leases.untilNone()
            let opened = leases.opens
            try? await Task.sleep(for: linger)
            guard leases.opens == opened else { continue }   // used meanwhile: linger again once unused
            while lock >= 0, flock(lock, LOCK_EX) != 0, errno == EINTR {}
            if leases.current == 0 { break }
            if lock >= 0 { flock(lock, LOCK_UN) }
        }
        unlink(socketPath)
        shutdown(listener, Int32(SHUT_RDWR))
        try? mounted.unmount()
        await serving.value
        rmdir(mountPoint)   // empty once unmounted: a directory per data root served is not left behind
        logger.debug("stopped serving \(layout.containers): no app uses it")
    }

    /// Admits an app's sandbox on a lease's line (FORMAT.md §10.6):
    /// `admit PID APP TERRITORY…`, each territory a directory's path relative to
    /// `ROOT/Containers` (an app's container, a group's).
    private static func admit(
        _ line: [UInt8], to apps: ServedApps, layout: DataRootLayout
    ) throws -> ServedApps.Admission {
        let words = String(decoding: line, as: UTF8.self).split(separator: " ", omittingEmptySubsequences: false).map(
            String.init)
        guard words.count >= 3, words[0] == "admit", let pid = Int32(words[1]), pid > 0, !words[2].isEmpty else {
            throw unavailable("a lease's request is not one this server knows")
        }
        var territories: [String] = []
        for relative in words[3...] {
            let components = relative.split(separator: "/", omittingEmptySubsequences: false)
            guard !components.isEmpty, !components.contains(where: { $0.isEmpty || $0 == "." || $0 == ".." }) else {
                throw unavailable("\(relative) is not a directory inside the containers")
            }
            territories.append(layout.containers + "/" + relative)
        }
        do {
            return try apps.admit(sandboxProcess: pid, app: words[2], territories: territories)
        } catch let error as MountError {
            throw unavailable("the app's sandbox could not be admitted: \(error)")
        }
    }

    /// An empty directory to mount on, made 0700; a mount left by a server that died is removed.
    private static func prepareMountPoint(_ path: String) throws {
        var st = stat()
        if stat(path, &st) != 0, errno == ENOTCONN {
            try? MountedFileSystem.unmount(path)
        }
        if mkdir(path, 0o700) != 0, errno != EEXIST {
            throw unavailable("cannot create \(path): \(String(cString: strerror(errno)))")
        }
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFDIR, st.st_uid == getuid() else {
            throw unavailable("\(path) is not a directory of this user")
        }
    }
}

/// How many leases are open, with a way to wait for none (or for any change).
private final class LeaseCount: Sendable {
    private let state = Mutex<(count: Int, opens: Int, waiters: [CheckedContinuation<Void, Never>])>((0, 0, []))

    var current: Int { state.withLock { $0.count } }
    /// Leases opened so far.
    var opens: Int { state.withLock { $0.opens } }

    func opened() { change(+1) }
    func closed() { change(-1) }

    private func change(_ delta: Int) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.count += delta
            if delta > 0 { state.opens += 1 }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once no lease is open (at once if none is).
    func untilNone() async {
        while current != 0 {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state -> Bool in
                    if state.count == 0 { return true }
                    state.waiters.append(continuation)
                    return false
                }
                if now { continuation.resume() }
            }
        }
    }
}
