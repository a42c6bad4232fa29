import Crypto
import DataProtectionIPC
import DataProtectionSystem
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where keybagd listens for a data root, and the Unix-socket calls around it.
package enum KeybagSocket {
    /// `$XDG_RUNTIME_DIR/dataprotection/keybagd-<16 hex of SHA-256(root)>.sock`; without
    /// `XDG_RUNTIME_DIR`, `/tmp/dataprotection-<uid>/…` (as ssh-agent falls back to /tmp).
    package static func path(forRoot root: String) -> String {
        directory() + "/keybagd-\(rootDigest(root)).sock"
    }

    /// 16 hex digits naming a data root in socket names: the first 8 bytes of SHA-256 of its
    /// absolute path.
    package static func rootDigest(_ root: String) -> String {
        let absolute = URL(fileURLWithPath: root).standardizedFileURL.path
        return Array(SHA256.hash(data: Data(absolute.utf8)).prefix(8)).hex
    }

    /// The socket directory (to be created 0700 by the daemon).
    package static func directory() -> String {
        if let runtime = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            return runtime + "/dataprotection"
        }
        return "/tmp/dataprotection-\(getuid())"
    }

    /// Connects to `path` as a client that sends secrets (``UnixSocket/connectTrusted(_:timeout:)``):
    /// `nil` when nothing listens there.
    /// - Throws: ``KeybagError/daemon(_:)`` when the directory, the socket or its peer is not this user's.
    package static func connect(_ path: String, timeout: Int = 5) throws -> Int32? {
        do { return try UnixSocket.connectTrusted(path, timeout: timeout) } catch let error as IPCError {
            throw KeybagError.daemon(error.description)
        }
    }

    /// The peer's user and process ids (`SO_PEERCRED`).
    package static func peerUID(_ fd: Int32) -> (uid: uid_t, pid: pid_t)? { UnixSocket.peerCredentials(fd) }
}

/// A connection to the keybagd serving a root. Calls are synchronous request/response frames
/// (a Unix-socket round trip), serialized on one connection; a dropped connection is reopened
/// on the next call, so a restarted daemon is picked up (before first unlock, as after a reboot).
package final class KeybagdConnection: Sendable {
    /// Where the keys are, for messages: the daemon's socket path, or the app's supervisor.
    package let socketPath: String
    /// Opens a new connection (one per call stream, one per event subscription): a `connect` to
    /// the daemon's socket, or a channel asked of an app's supervisor.
    private let connector: @Sendable () -> Int32?
    private let connection = Mutex<Int32?>(nil)
    /// The daemon's state page, when it publishes one: generations and availability without a
    /// round trip.
    private let page = Mutex<KeybagStatePage?>(nil)
    /// File keys of classes C and D unwrapped before, valid while the page shows the same daemon
    /// instance and class generation (see ``cachedFileKey(_:)``).
    private let fileKeys = Mutex<[WrappedFileKey: CachedFileKey]>([:])
    private static let fileKeyCacheLimit = 4096

    private struct CachedFileKey {
        let key: SymmetricKey
        let instance: UInt64
        let generation: UInt64
    }

    private init(socketPath: String, fd: Int32, connector: @escaping @Sendable () -> Int32?) {
        self.socketPath = socketPath
        self.connector = connector
        connection.withLock { $0 = fd }
    }

    deinit {
        connection.withLock { if let fd = $0 { close(fd) } }
    }

    /// A client for the daemon serving `root`, or `nil` when none listens. A daemon that
    /// answers but refuses this process (another user's), or is busy, or does not answer its
    /// hello, is an error that says why — never a silent fall-back to keys of this process,
    /// which would report "locked" while the daemon holds the device unlocked.
    package static func connect(root: String, socketPath: String? = nil) throws -> KeybagdConnection? {
        let path = socketPath ?? KeybagSocket.path(forRoot: root)
        guard let fd = try KeybagSocket.connect(path) else {
            // No daemon where this process looks. One that serves the root from elsewhere (another
            // runtime directory) holds the root's daemon lock: using keys of this process would
            // give the device a second lock state.
            if socketPath == nil, let holder = KeybagDaemonLock.holder(root: root), holder.socketPath != path {
                throw KeybagError.daemon(
                    "\(holder.described) serves \(root), but this process looks for it on \(path)"
                        + " (XDG_RUNTIME_DIR differs): run with the daemon's XDG_RUNTIME_DIR")
            }
            return nil   // no daemon, or a stale socket file
        }
        let client = KeybagdConnection(socketPath: path, fd: fd, connector: { try? KeybagSocket.connect(path) })
        do {
            var hello = try client.call(.hello)
            // The daemon must serve this root's keybag (its ID, from the keybag file's clear
            // header): a daemon of another root on this path gets nothing else.
            let served = try KeybagRequests.Hello.decode(&hello).id
            if let expected = KeybagFile.identifier(atRoot: root), served != expected {
                throw KeybagError.daemon(
                    "refused: the daemon on \(path) serves keybag \(served.uuidString), not \(root)'s (\(expected.uuidString)); nothing else was sent"
                )
            }
            // The daemon publishes its page before it answers (a socket-activated one starts now).
            client.page.withLock { $0 = KeybagStatePage.attach(socketPath: path) }
        } catch let error as KeybagError {
            throw error
        } catch {
            throw KeybagError.daemon("the daemon on \(path) did not answer (\(error))")
        }
        return client
    }

    /// A client whose connections come from `connector` (an app's channels to its supervisor,
    /// which speaks this protocol for the operations an app may use). `description` names the
    /// other end in messages. There is no state page: every answer is a round trip.
    package static func connect(
        description: String, connector: @escaping @Sendable () -> Int32?
    ) throws -> KeybagdConnection {
        guard let fd = connector() else { throw KeybagError.daemon("no connection to \(description)") }
        let client = KeybagdConnection(socketPath: description, fd: fd, connector: connector)
        try client.call(.hello)
        return client
    }

    /// Sends one request and returns the body of the answer. Daemon-side errors come back as the
    /// same ``KeybagError`` the embedded keybag throws; a dead or silent daemon as
    /// ``KeybagError/daemon(_:)``.
    @discardableResult
    package func call(_ op: KeybagWire.Op, _ body: (inout ByteWriter) -> Void = { _ in }) throws -> ByteReader {
        var request = ByteWriter()
        request.u8(KeybagWire.version)
        request.u8(op.rawValue)
        body(&request)
        return try connection.withLock { fd -> ByteReader in
            if fd == nil { fd = connector() }
            guard let open = fd else { throw KeybagError.daemon("not running (no answer on \(socketPath))") }
            do {
                do { try KeybagWire.writeFrame(open, request.bytes) } catch {
                    // A daemon that refused the connection may have said why before closing it.
                    guard let payload = try? KeybagWire.readFrame(open), payload.count > 2,
                        payload[1] == KeybagWire.Status.error.rawValue
                    else { throw error }
                    var reader = ByteReader(Array(payload[2...]))
                    throw try KeybagWire.error(&reader)
                }
                guard let payload = try KeybagWire.readFrame(open) else {
                    throw KeybagWire.ProtocolError("the daemon closed the connection")
                }
                var reader = ByteReader(payload)
                guard try reader.u8("version") == KeybagWire.version else {
                    throw KeybagWire.ProtocolError("protocol version")
                }
                switch KeybagWire.Status(rawValue: try reader.u8("status")) {
                case .ok: return reader
                case .error: throw try KeybagWire.error(&reader)
                default: throw KeybagWire.ProtocolError("unexpected status")
                }
            } catch let error as KeybagError {
                throw error
            } catch {
                close(open)
                fd = nil
                throw KeybagError.daemon("\(error) (\(socketPath))")
            }
        }
    }

    /// Sends a typed request (``KeybagRequest``) and decodes its answer.
    package func send<Request: KeybagRequest>(_ request: Request) throws -> Request.Response {
        var reader = try call(Request.op) { request.encode(&$0) }
        return try Request.decode(&reader)
    }

    // MARK: - Without a round trip

    /// What the daemon's page says now, or `nil` (no page, or the daemon is gone).
    package func pageReading() -> KeybagStatePage.Reading? { page.withLock { $0 }?.read() }

    /// The generation of an available class, read from the page; `nil` when only the daemon
    /// can answer: the class is unavailable (the daemon then says why), the device is locked
    /// and the class is A or B (the daemon ends the grace period), or there is no page.
    package func fastGeneration(of cls: ProtectionClass) -> Int? {
        guard let reading = pageReading(), reading.isAvailable(cls) else { return nil }
        if reading.isLocked && (cls == .complete || cls == .completeUnlessOpen) { return nil }
        return Int(reading.generation(cls))
    }

    /// A file key this process unwrapped before, when it is still valid: only classes C and D
    /// are kept (their keys are discarded only by an erase or a daemon restart, and either
    /// changes what the page shows); class A and B keys always ask the daemon, so a lock takes
    /// effect exactly when the daemon says. Entries go when they are found stale.
    package func cachedFileKey(_ wrapped: WrappedFileKey) -> (key: SymmetricKey, generation: Int)? {
        guard
            wrapped.protectionClass == .completeUntilFirstUserAuthentication
                || wrapped.protectionClass == .noProtection,
            let reading = pageReading()
        else { return nil }
        return fileKeys.withLock { cache in
            guard let entry = cache[wrapped] else { return nil }
            let cls = wrapped.protectionClass
            guard entry.instance == reading.instance, entry.generation == reading.generation(cls),
                reading.isAvailable(cls)
            else {
                cache = cache.filter { $0.key.protectionClass != cls && $0.value.instance == reading.instance }
                return nil
            }
            return (entry.key, Int(entry.generation))
        }
    }

    /// Keeps a file key the daemon just unwrapped, if nothing changed on the page while it did.
    package func rememberFileKey(
        _ wrapped: WrappedFileKey, key: SymmetricKey, generation: Int, observedBefore: KeybagStatePage.Reading?
    ) {
        let cls = wrapped.protectionClass
        guard cls == .completeUntilFirstUserAuthentication || cls == .noProtection, let before = observedBefore,
            before.generation(cls) == UInt64(generation), pageReading() == before
        else { return }
        fileKeys.withLock { cache in
            if cache.count >= Self.fileKeyCacheLimit { cache.removeAll() }
            cache[wrapped] = CachedFileKey(key: key, instance: before.instance, generation: before.generation(cls))
        }
    }

    /// Opens a second connection that receives events; `handler` runs on a background thread
    /// until the connection ends (then `ended` runs once).
    package func subscribe(
        _ handler: @escaping @Sendable (KeybagWire.Event) -> Void, ended: @escaping @Sendable () -> Void
    ) throws {
        guard let fd = connector() else { throw KeybagError.daemon("not running (\(socketPath))") }
        do {
            try KeybagWire.writeFrame(fd, [KeybagWire.version, KeybagWire.Op.subscribe.rawValue])
            guard let payload = try KeybagWire.readFrame(fd), payload.count >= 2,
                payload[1] == KeybagWire.Status.ok.rawValue
            else {
                throw KeybagWire.ProtocolError("subscription refused")
            }
        } catch {
            close(fd)
            throw KeybagError.daemon("\(error)")
        }
        // Events may be far apart: no receive timeout on this connection.
        var none = timeval(tv_sec: 0, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
        let thread = Thread {
            defer { close(fd); ended() }
            while let payload = try? KeybagWire.readFrame(fd) {
                var reader = ByteReader(payload)
                guard (try? reader.u8("version")) == KeybagWire.version,
                    (try? reader.u8("status")) == KeybagWire.Status.event.rawValue,
                    let event = try? KeybagWire.event(&reader)
                else { return }
                handler(event)
            }
        }
        thread.name = "keybagd events"
        thread.start()
    }
}
