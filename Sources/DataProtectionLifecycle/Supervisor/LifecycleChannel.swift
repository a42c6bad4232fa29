import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The supervisor's side of one lifecycle channel (FORMAT.md §12.2): requests answered in order
/// until the app closes it; after `subscribe`, events only.
enum LifecycleChannel {
    static func serve(_ fd: Int32, controller: LifecycleController, logger: Logger) {
        UnixSocket.setTimeouts(fd, seconds: 5, sending: true, receiving: false)
        let writer = Writer(fd: fd)
        // One sleep per channel (the channel is the sleep's own, FORMAT §12.2): a second one closes
        // the channel, so a flood of requests costs the supervisor nothing that grows.
        var sleep: Task<Void, Never>?
        defer { sleep?.cancel() }
        func answer(_ payload: [UInt8]) -> Bool { writer.write(payload) }
        while let frame = try? IPCFrame.read(fd) {
            var r = ByteReader(frame)
            guard (try? r.u8("version")) == LifecycleProtocol.version, let raw = try? r.u8("op"),
                let op = LifecycleProtocol.Op(rawValue: raw)
            else {
                logger.info("closing \(controller.identifier)'s lifecycle channel: malformed request")
                return
            }
            switch op {
            case .subscribe:
                guard r.remaining == 0, writer.locked({ controller.subscribe(fd) }) else { return }
                defer { controller.unsubscribe(fd) }
                var byte: UInt8 = 0
                while recv(fd, &byte, 1, 0) < 0 && errno == EINTR {}   // until the app closes it
                return
            case .beginTask:
                guard let name = try? LifecycleProtocol.string(&r, "name"), r.remaining == 0 else { return }
                var w = ByteWriter()
                w.raw(LifecycleProtocol.ok)
                w.u32(controller.beginTask(named: String(name.prefix(256))).rawValue)
                guard answer(w.bytes) else { return }
            case .endTask:
                guard let id = try? r.u32("id"), r.remaining == 0 else { return }
                controller.endTask(id)
                guard answer(LifecycleProtocol.ok) else { return }
            case .timeRemaining, .now, .state:
                guard r.remaining == 0 else { return }
                var w = ByteWriter()
                w.raw(LifecycleProtocol.ok)
                switch op {
                case .timeRemaining: LifecycleProtocol.double(&w, controller.timeRemaining ?? -1)
                case .now: LifecycleProtocol.double(&w, controller.clock.now().timeIntervalSince1970)
                default: w.u8(controller.state.rawValue)
                }
                guard answer(w.bytes) else { return }
            case .sleepUntil:
                guard let seconds = try? LifecycleProtocol.double(&r, "deadline"), seconds.isFinite, r.remaining == 0
                else { return }
                guard sleep == nil else {
                    logger.info("closing \(controller.identifier)'s lifecycle channel: a second sleep on it")
                    return
                }
                let clock = controller.clock
                sleep = Task {
                    do { try await clock.sleep(until: Date(timeIntervalSince1970: seconds)) } catch { return }
                    _ = writer.write(LifecycleProtocol.ok)
                }
            }
        }
    }
}

/// Answers go out one frame at a time: a sleep's answer comes from its own task.
private final class Writer: Sendable {
    let fd: Int32
    private let lock = Mutex(())
    init(fd: Int32) { self.fd = fd }

    func write(_ payload: [UInt8]) -> Bool { lock.withLock { _ in (try? IPCFrame.write(fd, payload)) != nil } }
    func locked<T>(_ body: () -> T) -> T { lock.withLock { _ in body() } }
}
