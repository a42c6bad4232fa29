import CLinuxShims
import DataProtectionKeybag
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The daemon: one embedded keybag, served on a Unix socket to processes of the same user.
///
/// Each connection gets its own thread and is answered in order; a request is one call on the
/// keybag actor. Class keys never cross the socket: clients send wrapped file keys and get the
/// file key back only when its class is available now. A malformed or oversized frame closes
/// that connection and nothing else.
final class KeybagDaemon: Sendable {
    let keybag: EmbeddedKeybag
    let socketPath: String
    let manualClock: ManualClock?
    private let logger = Logger(label: "keybagd")
    private let subscribers = Mutex<[Int32]>([])
    private let lastActivity: Mutex<Date>
    private let listener: Int32
    /// Whether the listening socket came from systemd (socket activation): then systemd owns it.
    private let activated: Bool

    init(keybag: EmbeddedKeybag, socketPath: String, manualClock: ManualClock?) throws {
        self.keybag = keybag
        self.socketPath = socketPath
        self.manualClock = manualClock
        self.lastActivity = Mutex(keybag.clock.now())
        if let inherited = try Self.activatedSocket(expected: socketPath) {
            self.listener = inherited
            self.activated = true
        } else {
            self.listener = try Self.listen(on: socketPath)
            self.activated = false
        }
    }

    /// The listening socket systemd passed (the `sd_listen_fds` protocol: `LISTEN_PID` is this
    /// process, `LISTEN_FDS` is 1, the socket is fd 3), after checking it is a Unix stream
    /// socket bound to this root's path in a 0700 directory of this user; `nil` without one.
    static func activatedSocket(expected path: String) throws -> Int32? {
        let environment = ProcessInfo.processInfo.environment
        guard let pid = environment["LISTEN_PID"], pid == String(getpid()), let count = environment["LISTEN_FDS"] else { return nil }
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDS")
        unsetenv("LISTEN_FDNAMES")
        guard count == "1" else { throw DaemonError("systemd passed \(count) sockets; keybagd takes exactly one (ListenStream=\(path))") }
        let fd: Int32 = 3
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        var type: Int32 = 0
        var typeLength = socklen_t(MemoryLayout<Int32>.size)
        guard named == 0, address.sun_family == sa_family_t(AF_UNIX),
              getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &typeLength) == 0, type == Int32(SOCK_STREAM.rawValue) else {
            throw DaemonError("the socket systemd passed is not a Unix stream socket")
        }
        let bound = withUnsafeBytes(of: address.sun_path) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        guard bound == path else {
            throw DaemonError("systemd passed a socket on \(bound), but this root's socket is \(path); fix ListenStream= (dpctl daemon install --socket-activation writes it)")
        }
        let directory = (path as NSString).deletingLastPathComponent
        var info = stat()
        guard lstat(directory, &info) == 0, info.st_uid == getuid(), info.st_mode & 0o077 == 0 else {
            throw DaemonError("\(directory) must be a 0700 directory of this user (DirectoryMode=0700)")
        }
        chmod(path, 0o600)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return fd
    }

    /// Creates the 0700 directory (refusing one another user owns or others can enter), removes a
    /// stale socket (refusing to start when a live daemon answers there), binds with mode 0600.
    static func listen(on path: String) throws -> Int32 {
        let directory = (path as NSString).deletingLastPathComponent
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw DaemonError("cannot create \(directory): \(String(cString: strerror(errno)))")
        }
        var info = stat()
        guard lstat(directory, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { throw DaemonError("\(directory) is not a directory") }
        guard info.st_uid == getuid() else { throw DaemonError("\(directory) belongs to uid \(info.st_uid), not to this user") }
        guard info.st_mode & 0o077 == 0 else { throw DaemonError("\(directory) is open to other users (mode \(String(info.st_mode & 0o777, radix: 8))); it must be 0700") }
        if let fd = KeybagSocket.connect(path, timeout: 1) {
            close(fd)
            throw DaemonError("another keybagd already serves this root on \(path)")
        }
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw DaemonError("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_un()
        guard KeybagSocket.fill(&address, path) else { throw DaemonError("socket path too long: \(path)") }
        let previous = umask(0o177)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        umask(previous)
        guard bound == 0 else { throw DaemonError("bind \(path): \(String(cString: strerror(errno)))") }
        chmod(path, 0o600)
        guard Glibc.listen(fd, 64) == 0 else { throw DaemonError("listen: \(String(cString: strerror(errno)))") }
        return fd
    }

    /// Accepts connections until the process ends.
    func serve() async throws {
        // The state page first, so no discard can happen unpublished. The observers run on the
        // keybag's executor as part of the change, before any other request is answered.
        let status = await keybag.status
        let page = try KeybagStatePage.publish(socketPath: socketPath, available: status.available, locked: status.lockState != .unlocked)
        await keybag.addObserver { [self] event in
            switch event {
            case .didBecomeAvailable: page.publishAvailable(ProtectionClass.allCases)
            case .willBecomeUnavailable: page.publishLocked()
            }
            broadcast(.protectedData(event))
        }
        await keybag.addDiscardObserver { [self] cls in
            page.publishDiscard(cls)
            broadcast(.discarded(cls))
        }
        logger.notice("serving \(keybag.root) on \(socketPath)")
        // One line on standard output once the socket accepts connections, for whoever waits on us.
        FileHandle.standardOutput.write(Data("ready \(socketPath)\n".utf8))
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                logger.error("accept: \(String(cString: strerror(errno)))")
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            let thread = Thread { [self] in handle(client) }
            thread.name = "keybagd connection"
            thread.start()
        }
    }

    func stop() {
        if !activated { unlink(socketPath) }   // systemd owns an activated socket
    }

    // MARK: - One connection

    private func handle(_ fd: Int32) {
        guard let peer = KeybagSocket.peerUID(fd) else { close(fd); return }
        guard peer.uid == getuid() else {
            let why = "refused: the peer (pid \(peer.pid)) runs as uid \(peer.uid); this keybagd serves uid \(getuid()) only"
            logger.warning("\(why)")
            var w = ByteWriter()
            w.u8(KeybagWire.version); w.u8(KeybagWire.Status.error.rawValue)
            KeybagWire.error(&w, .daemon(why))
            try? KeybagWire.writeFrame(fd, w.bytes)
            close(fd)
            return
        }
        // No timeout on the daemon's side of a connection: clients may be idle.
        while true {
            let payload: [UInt8]
            do {
                guard let frame = try KeybagWire.readFrame(fd) else { break }
                payload = frame
            } catch {
                logger.info("closing a connection: \(error)")
                break
            }
            var reader = ByteReader(payload)
            guard (try? reader.u8("version")) == KeybagWire.version,
                  let raw = try? reader.u8("op"), let op = KeybagWire.Op(rawValue: raw) else {
                logger.info("closing a connection: unknown version or operation")
                break
            }
            if op == .subscribe {
                try? KeybagWire.writeFrame(fd, [KeybagWire.version, KeybagWire.Status.ok.rawValue])
                subscribers.withLock { $0.append(fd) }
                return   // the fd now belongs to the broadcaster
            }
            lastActivity.withLock { $0 = keybag.clock.now() }
            var out = ByteWriter()
            out.u8(KeybagWire.version)
            do {
                let body = try blocking { [self, reader] in
                    var reader = reader
                    var body = ByteWriter()
                    try await answer(op, &reader, &body)
                    return body.bytes
                }
                out.u8(KeybagWire.Status.ok.rawValue)
                out.raw(body)
            } catch let error as KeybagError {
                out.u8(KeybagWire.Status.error.rawValue)
                KeybagWire.error(&out, error)
            } catch {
                logger.info("closing a connection: \(error)")
                break
            }
            do { try KeybagWire.writeFrame(fd, out.bytes) } catch { break }
        }
        close(fd)
    }

    /// One request on the keybag actor.
    private func answer(_ op: KeybagWire.Op, _ r: inout ByteReader, _ w: inout ByteWriter) async throws {
        switch op {
        case .hello:
            KeybagWire.uuid(&w, keybag.id)
            KeybagWire.string(&w, keybag.root)
        case .status:
            KeybagWire.status(&w, await keybag.status)
        case .lockState:
            KeybagWire.lockState(&w, await keybag.lockState)
        case .isProtectedDataAvailable:
            w.u8(await keybag.isProtectedDataAvailable ? 1 : 0)
        case .isAvailable:
            w.u8(await keybag.isAvailable(try KeybagWire.protectionClass(&r)) ? 1 : 0)
        case .canCreate:
            w.u8(await keybag.canCreate(try KeybagWire.protectionClass(&r)) ? 1 : 0)
        case .gracePeriod:
            KeybagWire.double(&w, await keybag.gracePeriod)
        case .setGracePeriod:
            try await keybag.setGracePeriod(try KeybagWire.double(&r, "seconds"))
        case .setEraseAfterTenFailures:
            try await keybag.setEraseAfterTenFailures(try r.u8("on") == 1)
        case .unlock:
            try await keybag.unlock(passcode: try KeybagWire.string(&r, "passcode"))
        case .lock:
            await keybag.lock()
        case .setPasscode:
            try await keybag.setPasscode(try KeybagWire.string(&r, "passcode"))
        case .changePasscode:
            let old = try KeybagWire.string(&r, "old"), new = try KeybagWire.string(&r, "new")
            try await keybag.changePasscode(from: old, to: new)
        case .removePasscode:
            try await keybag.removePasscode(current: try KeybagWire.string(&r, "passcode"))
        case .setBackupPassword:
            try await keybag.setBackupPassword(try KeybagWire.string(&r, "password"))
        case .erase:
            try await keybag.erase()
        case .generation:
            w.u64(UInt64(try await keybag.generation(of: try KeybagWire.protectionClass(&r))))
        case .wrapNewFileKey:
            let cls = try KeybagWire.protectionClass(&r), only = try r.u8("this device only") == 1
            let (key, wrapped) = try await keybag.wrapNewFileKey(for: cls, thisDeviceOnly: only)
            KeybagWire.key(&w, key)
            KeybagWire.wrapped(&w, wrapped)
        case .unwrapFileKey:
            let (key, generation) = try await keybag.unwrapFileKeyWithGeneration(try KeybagWire.wrapped(&r))
            KeybagWire.key(&w, key)
            w.u64(UInt64(generation))
        case .rewrapFileKey:
            let wrapped = try KeybagWire.wrapped(&r), cls = try KeybagWire.protectionClass(&r)
            KeybagWire.wrapped(&w, try await keybag.rewrapFileKey(wrapped, to: cls))
        case .wrap:
            let key = try KeybagWire.key(&r), cls = try KeybagWire.protectionClass(&r), only = try r.u8("this device only") == 1
            KeybagWire.wrapped(&w, try await keybag.wrap(key, for: cls, thisDeviceOnly: only))
        case .advanceClock:
            guard let manualClock else { throw KeybagError.daemon("advance-clock needs a daemon started with --manual-clock") }
            manualClock.advance(by: try KeybagWire.double(&r, "seconds"))
            _ = await keybag.lockState   // expire the grace period now, if due
        case .subscribe:
            break
        }
        guard r.remaining == 0 else { throw KeybagWire.ProtocolError("trailing bytes in a request") }
    }

    private func broadcast(_ event: KeybagWire.Event) {
        var w = ByteWriter()
        w.u8(KeybagWire.version)
        w.u8(KeybagWire.Status.event.rawValue)
        KeybagWire.event(&w, event)
        subscribers.withLock { fds in
            fds = fds.filter { fd in
                if (try? KeybagWire.writeFrame(fd, w.bytes)) != nil { return true }
                close(fd)
                return false
            }
        }
    }

    // MARK: - Idle lock

    /// Locks after `seconds` without a request (checked every second of the keybag's clock).
    func lockWhenIdle(after seconds: TimeInterval) async {
        while true {
            try? await keybag.clock.sleep(until: keybag.clock.now().addingTimeInterval(1))
            let idle = keybag.clock.now().timeIntervalSince(lastActivity.withLock { $0 })
            if idle >= seconds, await keybag.lockState == .unlocked {
                logger.notice("idle for \(Int(idle)) s: locking")
                await keybag.lock()
            }
        }
    }
}

struct DaemonError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The result of async work, handed from a task to the thread waiting for it.
final class Outcome<T: Sendable>: @unchecked Sendable {
    var result: Result<T, any Error>?
    init() {}
}

/// Runs async work from a plain thread (a connection's) and waits for its result.
func blocking<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) throws -> T {
    let outcome = Outcome<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        do { outcome.result = .success(try await work()) } catch { outcome.result = .failure(error) }
        done.signal()
    }
    done.wait()
    return try outcome.result!.get()
}
