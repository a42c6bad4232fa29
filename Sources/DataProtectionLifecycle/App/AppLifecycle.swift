import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The app side of the lifecycle — what `UIApplication` gives an iOS app: its state, the events
/// as it moves between front and back, and background tasks to finish work once in the back.
///
/// ```swift
/// guard let lifecycle = AppLifecycle.shared else { fatalError("run me with an app supervisor") }
/// for await event in lifecycle.events() where event == .didEnterBackground {
///     var task = BackgroundTaskIdentifier.invalid
///     task = lifecycle.beginBackgroundTask(withName: "upload") {
///         lifecycle.endBackgroundTask(task)          // time is nearly up: stop cleanly
///     }
///     try await upload()
///     lifecycle.endBackgroundTask(task)
/// }
/// ```
///
/// Events also go to `NotificationCenter.default` under UIKit's names
/// (``LifecycleEvent/notificationName``). A background app with no task is suspended a few
/// seconds after entering the background, as on a phone; the protected-data events and class
/// semantics are unchanged by tasks (a class-A file still becomes unavailable after a lock).
public final class AppLifecycle: Sendable {
    /// The lifecycle of this process's app (``CurrentApp/shared``), or `nil` when it is not one.
    public static let shared: AppLifecycle? = CurrentApp.shared.map(AppLifecycle.init)

    let app: CurrentApp
    private let requests: LifecycleRequests
    private let inner = Mutex(Inner())
    /// The supervisor's clock (virtual in tests): what ``backgroundTimeRemaining`` is counted on.
    public let clock: any KeybagClock

    private struct Inner {
        var state: ApplicationState = .active
        var connected = false
        var streams: [UUID: AsyncStream<LifecycleEvent>.Continuation] = [:]
        var observers: [UUID: @Sendable (LifecycleEvent) -> Void] = [:]
        var expirationHandlers: [UInt32: @Sendable () -> Void] = [:]
        /// Tasks whose warning came before `beginBackgroundTask` had registered their handler.
        var warnedEarly: Set<UInt32> = []
    }

    /// Connects to `app`'s supervisor and starts hearing its events.
    public init(app: CurrentApp) {
        self.app = app
        requests = LifecycleRequests(app: app)
        clock = SupervisorClock(app: app)
        connectEvents()
    }

    // MARK: - State and events

    /// `UIApplication.applicationState`.
    public var applicationState: ApplicationState { inner.withLock { $0.state } }

    /// Whether a supervisor serves this app's lifecycle (otherwise the app stays active and
    /// background tasks are `.invalid`).
    public var isSupervised: Bool { inner.withLock { $0.connected } }

    /// The events from now on, in order; iterate from one place per stream.
    public func events() -> AsyncStream<LifecycleEvent> {
        AsyncStream { continuation in
            let id = UUID()
            inner.withLock { $0.streams[id] = continuation }
            continuation.onTermination = { [weak self] _ in
                _ = self?.inner.withLock { $0.streams.removeValue(forKey: id) }
            }
        }
    }

    /// Calls `callback` on each event (on the lifecycle's thread); returns a token for
    /// ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ callback: @escaping @Sendable (LifecycleEvent) -> Void) -> UUID {
        let id = UUID()
        inner.withLock { $0.observers[id] = callback }
        return id
    }

    public func removeObserver(_ token: UUID) {
        _ = inner.withLock { $0.observers.removeValue(forKey: token) }
    }

    // MARK: - Background tasks

    /// `beginBackgroundTask(withName:expirationHandler:)`: while any task runs, the app keeps
    /// running in the background, up to its budget. Shortly before the budget ends,
    /// `expirationHandler` is called (on its own thread): end the task there. Returns
    /// ``BackgroundTaskIdentifier/invalid`` when the app's time in the background is spent (or
    /// no supervisor serves the lifecycle).
    public func beginBackgroundTask(
        withName name: String? = nil, expirationHandler: (@Sendable () -> Void)? = nil
    ) -> BackgroundTaskIdentifier {
        // The handler is registered before the ID is known to the supervisor's timer.
        let answer = ask(
            LifecycleProtocol.request(LifecycleProtocol.Op.beginTask.rawValue) {
                LifecycleProtocol.string(&$0, name ?? "")
            })
        guard var body = answer, let raw = try? body.u32("id") else { return .invalid }
        let id = BackgroundTaskIdentifier(rawValue: raw)
        guard id != .invalid, let expirationHandler else { return id }
        let warned = inner.withLock { inner -> Bool in
            if inner.warnedEarly.remove(raw) != nil { return true }
            inner.expirationHandlers[raw] = expirationHandler
            return false
        }
        if warned { Thread { expirationHandler() }.start() }
        return id
    }

    /// `endBackgroundTask(_:)`: the task is done. Ending `.invalid` or an ended task does nothing.
    public func endBackgroundTask(_ identifier: BackgroundTaskIdentifier) {
        guard identifier != .invalid else { return }
        inner.withLock { inner in
            inner.expirationHandlers.removeValue(forKey: identifier.rawValue)
            inner.warnedEarly.remove(identifier.rawValue)
        }
        _ = ask(LifecycleProtocol.request(LifecycleProtocol.Op.endTask.rawValue) { $0.u32(identifier.rawValue) })
    }

    /// `backgroundTimeRemaining`: seconds the app may still run in the background this trip;
    /// `.greatestFiniteMagnitude` while it is in front (as UIKit returns).
    public var backgroundTimeRemaining: TimeInterval {
        guard var body = ask(LifecycleProtocol.request(LifecycleProtocol.Op.timeRemaining.rawValue)),
            let seconds = try? LifecycleProtocol.double(&body, "remaining")
        else { return 0 }
        return seconds < 0 ? .greatestFiniteMagnitude : seconds
    }

    /// `ProcessInfo.performExpiringActivity(withReason:using:)`'s shape: `block(false)` runs on
    /// its own thread as a background task; if the time runs out first, `block(true)` is called
    /// concurrently (stop the work); when `block(false)` returns the task ends. When no time is
    /// left, only `block(true)` is called.
    public func performExpiringActivity(
        withReason reason: String, using block: @escaping @Sendable (_ expired: Bool) -> Void
    ) {
        let id = beginBackgroundTask(withName: reason) { block(true) }
        guard id != .invalid else {
            Thread { block(true) }.start()
            return
        }
        Thread { [self] in
            block(false)
            endBackgroundTask(id)
        }.start()
    }

    // MARK: - The channels

    private func ask(_ request: [UInt8]) -> ByteReader? { requests.ask(request) }

    /// A supervisor stopping the app sends `willTerminate` on the channel and `SIGTERM` to each
    /// of its processes: an app that follows the lifecycle hears the event, and has the grace
    /// period to act on it, so `SIGTERM`'s default (ending the process at once) would cut its
    /// handler short. Where `SIGTERM` is left to its default, it is caught and does nothing
    /// (a handler, not `SIG_IGN`: programs the app starts get the default back).
    private static func hearTerminationAsWillTerminate() {
        var current = sigaction()
        guard sigaction(SIGTERM, nil, &current) == 0, current.__sigaction_handler.sa_handler == nil else { return }
        var quiet = sigaction()
        quiet.__sigaction_handler.sa_handler = quietTermination
        quiet.sa_flags = SA_RESTART
        sigemptyset(&quiet.sa_mask)
        _ = sigaction(SIGTERM, &quiet, nil)
    }

    /// The handler ``hearTerminationAsWillTerminate()`` installs: nothing.
    private static let quietTermination: @convention(c) (Int32) -> Void = { _ in }

    /// Gives `SIGTERM` its default back if ours is still the handler (the channel to the
    /// supervisor closed: nothing will say willTerminate, and `kill` must end the app).
    private static func hearTerminationAgain() {
        var current = sigaction()
        guard sigaction(SIGTERM, nil, &current) == 0, let handler = current.__sigaction_handler.sa_handler,
            unsafeBitCast(handler, to: UnsafeRawPointer.self)
                == unsafeBitCast(quietTermination, to: UnsafeRawPointer.self)
        else { return }
        var standard = sigaction()
        standard.__sigaction_handler.sa_handler = nil   // SIG_DFL
        sigemptyset(&standard.sa_mask)
        _ = sigaction(SIGTERM, &standard, nil)
    }

    private func connectEvents() {
        guard let fd = app.openServiceChannel(LifecycleProtocol.serviceIdentifier)?.rawValue else { return }
        UnixSocket.setTimeouts(fd, seconds: 0)
        guard (try? IPCFrame.write(fd, LifecycleProtocol.request(LifecycleProtocol.Op.subscribe.rawValue))) != nil,
            let answer = try? IPCFrame.read(fd), var body = try? LifecycleProtocol.body(answer),
            let raw = try? body.u8("state"), let state = ApplicationState(rawValue: raw)
        else {
            close(fd)
            return
        }
        inner.withLock {
            $0.state = state
            $0.connected = true
        }
        Self.hearTerminationAsWillTerminate()
        let thread = Thread { [self] in
            defer {
                // No supervisor to say willTerminate any more: SIGTERM ends the app again.
                Self.hearTerminationAgain()
                close(fd)
                let streams = inner.withLock { inner in
                    defer { inner.streams = [:] }; return inner.streams.values
                }
                for stream in streams { stream.finish() }
            }
            while let frame = try? IPCFrame.read(fd) {
                guard frame.count >= 3, frame[0] == LifecycleProtocol.version,
                    frame[1] == LifecycleProtocol.Status.event.rawValue
                else { return }
                if frame[2] == LifecycleProtocol.taskExpiring {
                    var r = ByteReader(Array(frame[3...]))
                    guard let id = try? r.u32("id") else { return }
                    let handler = inner.withLock { inner -> (@Sendable () -> Void)? in
                        guard let handler = inner.expirationHandlers.removeValue(forKey: id) else {
                            inner.warnedEarly.insert(id)
                            return nil
                        }
                        return handler
                    }
                    if let handler { Thread { handler() }.start() }
                    continue
                }
                guard let event = LifecycleEvent(rawValue: frame[2]) else { return }
                deliver(event)
            }
        }
        thread.name = "app lifecycle"
        thread.start()
    }

    private func deliver(_ event: LifecycleEvent) {
        let (streams, observers) = inner.withLock { inner in
            inner.state = event.resultingState
            return (Array(inner.streams.values), Array(inner.observers.values))
        }
        NotificationCenter.default.post(name: event.notificationName, object: nil)
        for observer in observers { observer(event) }
        for stream in streams { stream.yield(event) }
    }
}

extension CurrentApp {
    /// This app's lifecycle (``AppLifecycle/shared`` for the process's own app).
    public var lifecycle: AppLifecycle {
        if let shared = AppLifecycle.shared, shared.app === self { return shared }
        return AppLifecycle(app: self)
    }
}
