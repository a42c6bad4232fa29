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

/// The supervisor's side of the app's socket (FORMAT.md §10.3): answers `describe`, hands out
/// keybag channels, and on each channel serves the keybag operations an app may use
/// (``Keybag/appOperations``) with this process's keys — its embedded keybag, or keybagd's
/// (then the app sees the device's one lock state). Everything else is refused as
/// ``KeybagError/notPermitted(_:)``; a malformed frame closes that channel only. Service
/// channels (op 3) go to the ``AppSupervisorService`` the app names, if the supervisor has it.
final class AppService: Sendable {
    let description: AppDescription
    let run: RunningApp
    var app: AppContainer { run.app }
    let keybag: Keybag
    let services: [any AppSupervisorService]
    let logger: Logger
    private let channels = Mutex<Set<Int32>>([])
    private let subscribers = Mutex<Set<Int32>>([])
    private let observerTokens = Mutex<[UUID]>([])
    private let control = Mutex<Int32?>(nil)

    init(
        description: AppDescription, run: RunningApp, keybag: Keybag, services: [any AppSupervisorService],
        logger: Logger
    ) {
        self.description = description
        self.run = run
        self.keybag = keybag
        self.services = services
        self.logger = logger
    }

    /// Starts answering on `fd` (the supervisor's end of the app's socket).
    func start(control fd: Int32) async throws {
        control.withLock { $0 = fd }
        let protected = await keybag.addObserver { [weak self] event in self?.broadcast(.protectedData(event)) }
        let discarded = await keybag.addDiscardObserver { [weak self] cls in self?.broadcast(.discarded(cls)) }
        observerTokens.withLock { $0 = [protected, discarded] }
        let thread = Thread { [self] in serveControl(fd) }
        thread.name = "app control"
        thread.start()
    }

    /// Closes every channel (the app has ended).
    func stop() {
        if let fd = control.withLock({ fd -> Int32? in
            defer { fd = nil }; return fd
        }) {
            shutdown(fd, Int32(SHUT_RDWR))
        }
        for fd in channels.withLock({ $0 }) { shutdown(fd, Int32(SHUT_RDWR)) }
        let tokens = observerTokens.withLock { $0 }
        let keybag = self.keybag
        Task { for token in tokens { await keybag.removeObserver(token); await keybag.removeDiscardObserver(token) } }
    }

    // MARK: - Control

    private func serveControl(_ fd: Int32) {
        defer { close(fd) }
        while let frame = try? IPCFrame.read(fd) {
            guard frame.count >= 2, frame[0] == SupervisorProtocol.version,
                let op = SupervisorProtocol.Op(rawValue: frame[1]),
                frame.count == (op == .serviceChannel ? 3 : 2)
            else {
                logger.info("closing the app's socket: malformed request")
                return
            }
            switch op {
            case .describe:
                let encoder = PropertyListEncoder()
                encoder.outputFormat = .binary
                guard let plist = try? encoder.encode(description) else { return }
                guard (try? IPCFrame.write(fd, [SupervisorProtocol.version, 0] + Array(plist))) != nil else { return }
            case .keybagChannel:
                guard hand(openChannel(named: "app keybag channel", serve: serveChannel), over: fd) else { return }
            case .serviceChannel:
                let service = services.first { $0.serviceIdentifier == frame[2] }
                let run = self.run
                let channel = service.flatMap { service in
                    openChannel(named: "app service channel") {
                        service.serve(channel: FileDescriptor(rawValue: $0), run: run)
                    }
                }
                guard hand(channel, over: fd) else { return }
            }
        }
    }

    /// Sends the app its end of a new channel (and closes ours of it), or the refusal; `false`
    /// when the app's socket is gone.
    private func hand(_ channel: Int32?, over fd: Int32) -> Bool {
        guard let channel else { return sendByte(fd, SupervisorProtocol.channelRefused) }
        defer { close(channel) }
        return (try? UnixSocket.send(descriptor: channel, over: fd, message: [SupervisorProtocol.channelGranted]))
            != nil
    }

    private func sendByte(_ fd: Int32, _ byte: UInt8) -> Bool {
        var value = byte
        return Glibc.send(fd, &value, 1, Int32(MSG_NOSIGNAL)) == 1
    }

    /// A new channel: our end is served by `serve` on its own thread; the app's end is returned
    /// (to be sent and closed). `nil` when the app holds ``AppSupervisor/maxChannels`` already.
    private func openChannel(named name: String, serve: @escaping @Sendable (Int32) -> Void) -> Int32? {
        var fds: [Int32] = [-1, -1]
        guard channels.withLock({ $0.count }) < AppSupervisor.maxChannels,
            socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0
        else { return nil }
        let ours = fds[0]
        channels.withLock { _ = $0.insert(ours) }
        UnixSocket.setTimeouts(ours, seconds: 5, sending: true, receiving: false)
        let thread = Thread { [self] in
            serve(ours)
            channels.withLock { _ = $0.remove(ours) }
            close(ours)
        }
        thread.name = name
        thread.start()
        return fds[1]
    }

    // MARK: - A keybag channel

    private func serveChannel(_ fd: Int32) {
        while true {
            guard let payload = try? IPCFrame.read(fd) else { return }
            defer { payload.wipeInPlace() }   // may carry a file key
            guard payload.count >= 2, payload[0] == KeybagWire.version, let op = KeybagWire.Op(rawValue: payload[1])
            else {
                logger.info("closing an app's keybag channel: unknown version or operation")
                return
            }
            if op == .subscribe {
                guard payload.count == 2 else { return }
                // Registered and acknowledged under the subscribers' lock: no event can slip in
                // before the acknowledgement, and none is missed after it.
                let acknowledged = subscribers.withLock { set -> Bool in
                    guard (try? IPCFrame.write(fd, [KeybagWire.version, KeybagWire.Status.ok.rawValue])) != nil else {
                        return false
                    }
                    set.insert(fd)
                    return true
                }
                if acknowledged { serveSubscriber(fd) }
                return
            }
            var out = ByteWriter(capacity: 4096)
            defer { out.bytes.wipeInPlace() }
            out.u32(0)
            out.u8(KeybagWire.version)
            do {
                if description.servedByFileSystem {
                    guard Keybag.servedAppOperations.contains(op) else {
                        throw KeybagError.notPermitted(
                            "an app cannot ask for \(op) (only the lock state: the file system protects its files)")
                    }
                } else {
                    guard Keybag.appOperations.contains(op) else {
                        throw KeybagError.notPermitted(
                            "an app cannot ask for \(op) (only its own files' keys and the lock state)")
                    }
                }
                let body = Array(payload[2...])
                let keybag = self.keybag
                let answer = try runBlocking { try await keybag.answer(op, body: body) }
                defer { answer.wipeInPlace() }
                out.u8(KeybagWire.Status.ok.rawValue)
                out.raw(answer)
            } catch let error as KeybagError {
                out.u8(KeybagWire.Status.error.rawValue)
                KeybagWire.error(&out, error)
            } catch {
                logger.info("closing an app's keybag channel: \(error)")
                return
            }
            var frame = out.bytes
            guard (try? IPCFrame.send(fd, &frame)) != nil else { frame.wipeInPlace(); return }
            frame.wipeInPlace()
        }
    }

    /// An event subscriber: events are pushed by ``broadcast(_:)`` without blocking; this thread
    /// only waits for the app to close the channel.
    private func serveSubscriber(_ fd: Int32) {
        defer { subscribers.withLock { _ = $0.remove(fd) } }
        var byte: UInt8 = 0
        while true {
            let n = recv(fd, &byte, 1, 0)
            if n < 0 && errno == EINTR { continue }
            return
        }
    }

    private func broadcast(_ event: KeybagWire.Event) {
        var w = ByteWriter()
        w.u8(KeybagWire.version)
        w.u8(KeybagWire.Status.event.rawValue)
        KeybagWire.event(&w, event)
        subscribers.withLock { fds in _ = IPCFrame.broadcast(w.bytes, to: &fds) }
    }
}
