import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
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
final class KeybagdServer: Sendable {
    let keybag: EmbeddedKeybag
    let socketPath: String
    let manualClock: ManualClock?
    let maxConnections: Int
    /// How long a reply may wait for a client to read before that connection is closed.
    static let sendTimeout: Int = 5
    private let logger = Logger(label: "keybagd")
    private let subscribers = Mutex<Set<Int32>>([])
    /// One passcode check (scrypt) on the keybag at a time: the others wait on their own threads,
    /// so requests from everyone else never queue behind more than one of them.
    private let passcodeChecks = DispatchSemaphore(value: 1)
    static let passcodeOps: Set<KeybagWire.Op> = [
        .unlock, .setPasscode, .changePasscode, .removePasscode, .setBackupPassword,
    ]
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

    /// The listening socket systemd passed (``UnixSocket/activatedSocket(expected:)``), or `nil`.
    static func activatedSocket(expected path: String) throws -> Int32? {
        do { return try UnixSocket.activatedSocket(expected: path) } catch let error as IPCError {
            throw DaemonError("\(error) (dpctl daemon install --socket-activation writes the units)")
        }
    }

    /// Listens on this root's socket (``UnixSocket/listen(on:backlog:)``).
    static func listen(on path: String) throws -> Int32 {
        do { return try UnixSocket.listen(on: path) } catch let error as IPCError {
            throw DaemonError(error.description.replacingOccurrences(of: "another server", with: "another keybagd"))
        }
    }

    /// Accepts connections until the process ends.
    func serve() async throws {
        // The state page first, so no discard can happen unpublished. The observers run on the
        // keybag's executor as part of the change, before any other request is answered.
        let status = await keybag.status
        let page = try KeybagStatePage.publish(
            socketPath: socketPath, available: status.available, locked: status.lockState != .unlocked)
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
        var busy = ByteWriter()
        busy.u8(KeybagWire.version); busy.u8(KeybagWire.Status.error.rawValue)
        KeybagWire.error(
            &busy,
            .daemon("busy: \(maxConnections) connections are open (keybagd --max-connections); close some and retry"))
        let server = IPCServer(
            listener: listener, maxConnections: maxConnections, sendTimeout: Self.sendTimeout, busyFrame: busy.bytes,
            logger: logger)
        server.serve { [self] fd in handle(fd) }
    }

    /// One error frame, then close (see ``IPCServer/refuse(_:payload:waitForPeer:)``).
    private func refuse(_ fd: Int32, _ why: String, waitForPeer: Bool = false) {
        var w = ByteWriter()
        w.u8(KeybagWire.version); w.u8(KeybagWire.Status.error.rawValue)
        KeybagWire.error(&w, .daemon(why))
        IPCServer.refuse(fd, payload: w.bytes, waitForPeer: waitForPeer)
    }

    func stop() {
        if !activated { unlink(socketPath) }   // systemd owns an activated socket
    }

    // MARK: - One connection

    private func handle(_ fd: Int32) {
        guard let peer = KeybagSocket.peerUID(fd) else { close(fd); return }
        guard peer.uid == getuid() else {
            let why =
                "refused: the peer (pid \(peer.pid)) runs as uid \(peer.uid); this keybagd serves uid \(getuid()) only"
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
                let raw = try? reader.u8("op"), let op = KeybagWire.Op(rawValue: raw)
            else {
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
                let body = try runBlocking { [self, reader] in
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
            // An erased device (erase, or the tenth wrong passcode with erase-after-ten) is served
            // no longer: the daemon ends, its socket goes, and a new device can be set up there.
            if (try? runBlocking({ [keybag] in await keybag.isErased })) == true {
                logger.notice("the device was erased: stopping")
                close(fd)
                kill(getpid(), SIGTERM)
                return
            }
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
            guard let manualClock else {
                throw KeybagError.daemon("advance-clock needs a daemon started with --manual-clock")
            }
            let seconds = try KeybagWire.double(&r, "seconds")
            guard seconds.isFinite, seconds >= 0, seconds <= 1e9 else {
                throw KeybagError.invalidArgument("clock advance \(seconds) s")
            }
            manualClock.advance(by: seconds)
            _ = await keybag.lockState   // expire the grace period now, if due
            guard r.remaining == 0 else { throw KeybagWire.ProtocolError("trailing bytes in a request") }
        case .subscribe:
            break
        default:
            guard let request = KeybagRequests.byOpcode[op] else {
                throw KeybagWire.ProtocolError("operation \(op) is not served")
            }
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
        let dropped = subscribers.withLock { fds in IPCFrame.broadcast(w.bytes, to: &fds) }
        if dropped > 0 { logger.notice("dropped \(dropped) event subscriber(s) that stopped reading") }
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
