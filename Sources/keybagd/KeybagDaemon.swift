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
///
/// One client's fault never stalls another (as with ssh-agent and gpg-agent): connections are
/// bounded (``maxConnections``; one more is told "busy" and closed), a reply that cannot be
/// sent within ``sendTimeout`` closes that connection, events go to subscribers without
/// blocking (a subscriber that stopped reading loses its own connection once its socket buffer
/// is full), and `accept` failing for want of descriptors backs off instead of spinning.
/// Request and response buffers are wiped after every request: no passcode or file key is left
/// in freed memory.
final class KeybagDaemon: Sendable {
    let keybag: EmbeddedKeybag
    let socketPath: String
    let manualClock: ManualClock?
    let maxConnections: Int
    /// How long a reply may wait for a client to read before that connection is closed.
    static let sendTimeout: Int = 5
    private let logger = Logger(label: "keybagd")
    private let subscribers = Mutex<Set<Int32>>([])
    private let connections = Mutex(0)
    /// One passcode check (scrypt) on the keybag at a time: the others wait on their own threads,
    /// so requests from everyone else never queue behind more than one of them.
    private let passcodeChecks = DispatchSemaphore(value: 1)
    static let passcodeOps: Set<KeybagWire.Op> = [.unlock, .setPasscode, .changePasscode, .removePasscode, .setBackupPassword]
    private let lastActivity: Mutex<Date>
    private let listener: Int32
    /// Whether the listening socket came from systemd (socket activation): then systemd owns it.
    private let activated: Bool

    init(keybag: EmbeddedKeybag, socketPath: String, manualClock: ManualClock?, maxConnections: Int = 256) throws {
        self.keybag = keybag
        self.socketPath = socketPath
        self.manualClock = manualClock
        self.maxConnections = maxConnections
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
        var backoff: UInt32 = 10_000   // µs, doubled up to 1 s while accept cannot get a descriptor
        var lastComplaint: ContinuousClock.Instant?
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                let err = errno
                if err == EINTR || err == ECONNABORTED { continue }
                // Out of descriptors or memory: say so once a minute, wait, try again — never spin.
                if lastComplaint.map({ ContinuousClock.now - $0 > .seconds(60) }) ?? true {
                    logger.error("accept: \(String(cString: strerror(err))); backing off (said once a minute)")
                    lastComplaint = .now
                }
                usleep(backoff)
                backoff = min(backoff * 2, 1_000_000)
                continue
            }
            backoff = 10_000
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            var timeout = timeval(tv_sec: Self.sendTimeout, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            let admitted = connections.withLock { count in
                guard count < maxConnections else { return false }
                count += 1
                return true
            }
            guard admitted else {
                refuse(client, "busy: \(maxConnections) connections are open (keybagd --max-connections); close some and retry")
                continue
            }
            let thread = Thread { [self] in
                handle(client)
                connections.withLock { $0 -= 1 }
            }
            thread.name = "keybagd connection"
            thread.stackSize = 256 * 1024
            thread.start()
        }
    }

    /// One error frame, then close. Closing with the peer's request unread would reset the
    /// connection and could drop the frame, so with `waitForPeer` (on a connection's own thread)
    /// the request is drained first, for a second at most; the accept loop never waits.
    private func refuse(_ fd: Int32, _ why: String, waitForPeer: Bool = false) {
        var w = ByteWriter()
        w.u8(KeybagWire.version); w.u8(KeybagWire.Status.error.rawValue)
        KeybagWire.error(&w, .daemon(why))
        var frame = ByteWriter()
        frame.u32(UInt32(w.bytes.count))
        frame.raw(w.bytes)
        _ = frame.bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        shutdown(fd, Int32(SHUT_WR))
        if waitForPeer {
            var timeout = timeval(tv_sec: 1, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var sink = [UInt8](repeating: 0, count: 4096)
            var total = 0
            while total < 70_000 {
                let n = sink.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                total += n
            }
        }
        close(fd)
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
            refuse(fd, why, waitForPeer: true)
            return
        }
        // No receive timeout on the daemon's side of a connection: clients may be idle.
        while true {
            let payload: [UInt8]
            do {
                guard let frame = try KeybagWire.readFrame(fd) else { break }
                payload = frame
            } catch {
                logger.info("closing a connection: \(error)")
                break
            }
            // The request may carry a passcode or a key: zero its buffer once answered.
            defer { payload.wipeInPlace() }
            var reader = ByteReader(payload)
            guard (try? reader.u8("version")) == KeybagWire.version,
                  let raw = try? reader.u8("op"), let op = KeybagWire.Op(rawValue: raw) else {
                logger.info("closing a connection: unknown version or operation")
                break
            }
            if op == .subscribe {
                guard reader.remaining == 0 else { break }
                try? KeybagWire.writeFrame(fd, [KeybagWire.version, KeybagWire.Status.ok.rawValue])
                serveSubscriber(fd)
                return
            }
            lastActivity.withLock { $0 = keybag.clock.now() }
            // Sized so it never grows: a growing array would leave a copy of a key behind.
            var out = ByteWriter(capacity: 4096)
            defer { out.bytes.wipeInPlace() }
            out.u32(0)   // the length, patched in by sendFramed
            out.u8(KeybagWire.version)
            let checksPasscode = Self.passcodeOps.contains(op)
            if checksPasscode { passcodeChecks.wait() }
            defer { if checksPasscode { passcodeChecks.signal() } }
            do {
                let body = try blocking { [self, reader] in
                    var reader = reader
                    var body = ByteWriter(capacity: 1024)
                    try await answer(op, &reader, &body)
                    return body.bytes
                }
                defer { body.wipeInPlace() }
                out.u8(KeybagWire.Status.ok.rawValue)
                out.raw(body)
            } catch let error as KeybagError {
                out.u8(KeybagWire.Status.error.rawValue)
                KeybagWire.error(&out, error)
            } catch {
                logger.info("closing a connection: \(error)")
                break
            }
            // A client that does not read its reply within the send timeout loses this connection.
            do { try KeybagWire.sendFramed(fd, &out) } catch { break }
        }
        close(fd)
    }

    /// A subscriber's connection: events are pushed by ``broadcast(_:)`` without blocking; this
    /// thread only waits for the peer to go away, then closes the descriptor (once).
    private func serveSubscriber(_ fd: Int32) {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        subscribers.withLock { _ = $0.insert(fd) }
        var pollfd = Glibc.pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&pollfd, 1, -1)
            if ready < 0, errno == EINTR { continue }
            var byte: UInt8 = 0
            let n = recv(fd, &byte, 1, Int32(MSG_DONTWAIT))
            if n < 0, errno == EAGAIN || errno == EINTR { continue }
            break   // end of stream, an error, or a byte a subscriber must not send
        }
        subscribers.withLock { _ = $0.remove(fd) }
        close(fd)
    }

    /// One request on the keybag actor: its type (``KeybagRequests``, by opcode) reads it,
    /// performs it on the embedded keybag and writes the answer. Only the test clock and the
    /// subscription are the daemon's own.
    private func answer(_ op: KeybagWire.Op, _ r: inout ByteReader, _ w: inout ByteWriter) async throws {
        switch op {
        case .advanceClock:
            guard let manualClock else { throw KeybagError.daemon("advance-clock needs a daemon started with --manual-clock") }
            let seconds = try KeybagWire.double(&r, "seconds")
            guard seconds.isFinite, seconds >= 0, seconds <= 1e9 else { throw KeybagError.invalidArgument("clock advance \(seconds) s") }
            manualClock.advance(by: seconds)
            _ = await keybag.lockState   // expire the grace period now, if due
            guard r.remaining == 0 else { throw KeybagWire.ProtocolError("trailing bytes in a request") }
        case .subscribe:
            break
        default:
            guard let request = KeybagRequests.byOpcode[op] else { throw KeybagWire.ProtocolError("operation \(op) is not served") }
            try await request.answer(&r, &w, keybag: keybag)
        }
    }

    /// Sends an event to every subscriber without ever blocking: a subscriber whose socket
    /// buffer is full (it stopped reading) loses its connection — only its own.
    private func broadcast(_ event: KeybagWire.Event) {
        var w = ByteWriter()
        w.u8(KeybagWire.version)
        w.u8(KeybagWire.Status.event.rawValue)
        KeybagWire.event(&w, event)
        var frame = ByteWriter()
        frame.u32(UInt32(w.bytes.count))
        frame.raw(w.bytes)
        let bytes = frame.bytes
        subscribers.withLock { fds in
            for fd in fds {
                let sent = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
                if sent != bytes.count {
                    // Full (or gone): drop it. A partial frame cannot be finished later, so the
                    // stream ends here; its thread sees the shutdown and closes the descriptor.
                    logger.notice("dropping an event subscriber that stopped reading")
                    shutdown(fd, Int32(SHUT_RDWR))
                    fds.remove(fd)
                }
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
