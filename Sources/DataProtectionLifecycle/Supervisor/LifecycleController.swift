import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One run's lifecycle, in the supervisor: its state, its background tasks and their budget,
/// the events it owes the app, and when it is suspended — every deadline on the supervisor's
/// clock (a ``ManualClock`` in tests, so nothing waits on real time).
///
/// The rules (iOS's, see FORMAT.md §12.1):
/// - to the background (the home button, a lock): `willResignActive`, `didEnterBackground`;
///   the trip's budget starts;
/// - in the background with no task: suspended ``LifecycleSettings/suspensionDelay`` after
///   entering it (at once if that has passed when the last task ends);
/// - with tasks: running; ``LifecycleSettings/expirationWarning`` before the budget ends each
///   task's expiration handler is called; at its end the tasks still running are ended by the
///   system (logged by name) and the app is suspended;
/// - back in front: resumed, then `willEnterForeground`, `didBecomeActive`;
/// - terminated: resumed, `willResignActive` if active, `willTerminate`, then killed after
///   ``LifecycleSettings/terminationDeadline`` unless it ended first.
final class LifecycleController: Sendable {
    let run: RunningApp
    let settings: LifecycleSettings
    let clock: any KeybagClock
    private let inhibitor: SleepInhibitor
    private let logger: Logger
    private let inner: Mutex<Inner>

    struct TaskRecord: Sendable {
        let name: String
        let started: Date
        var warned = false
    }

    private struct Inner {
        var state: ApplicationState = .active
        var deviceLocked: Bool
        /// Was in front when the device locked: the unlock brings it back.
        var frontAtLock = false
        var tasks: [UInt32: TaskRecord] = [:]
        var nextTaskID: UInt32 = 1
        var enteredBackground: Date?
        var subscribers: Set<Int32> = []
        var timer: Task<Void, Never>?
        var terminating = false
        var ended = false
        var waiters: [(ApplicationState, CheckedContinuation<Void, Never>)] = []
    }

    init(
        run: RunningApp, settings: LifecycleSettings, clock: any KeybagClock, deviceLocked: Bool,
        inhibitor: SleepInhibitor, logger: Logger
    ) {
        self.run = run
        self.settings = settings
        self.clock = clock
        self.inhibitor = inhibitor
        self.logger = logger
        inner = Mutex(Inner(deviceLocked: deviceLocked))
    }

    var identifier: String { run.app.identifier.rawValue }

    /// Background tasks one run may hold at once (each costs the supervisor a record).
    static let maxTasks = 1024

    var state: ApplicationState { inner.withLock { $0.state } }

    var tasks: [UInt32: TaskRecord] { inner.withLock { $0.tasks } }

    /// The background time left (`nil`: unlimited, the app is in front).
    var timeRemaining: TimeInterval? {
        inner.withLock { inner in
            guard let entered = inner.enteredBackground else { return nil }
            return max(0, entered.addingTimeInterval(settings.backgroundTimeBudget).timeIntervalSince(clock.now()))
        }
    }

    /// Returns once the app is in `state` (at once if it is).
    func wait(until state: ApplicationState) async {
        await withCheckedContinuation { continuation in
            let now = inner.withLock { inner -> Bool in
                if inner.state == state { return true }
                inner.waiters.append((state, continuation))
                return false
            }
            if now { continuation.resume() }
        }
    }

    // MARK: - Triggers

    /// The home button: to the background. Returns the state after.
    @discardableResult
    func moveToBackground() -> ApplicationState {
        inner.withLock { inner in
            inner.frontAtLock = false
            toBackground(&inner)
            return inner.state
        }
    }

    /// Back to the front. Refused while the device is locked (as no app comes to the front over
    /// the lock screen) or the app is terminating.
    @discardableResult
    func moveToForeground() throws -> ApplicationState {
        try inner.withLock { inner in
            guard !inner.deviceLocked else {
                throw LifecycleError.refused("the device is locked: \(identifier) comes to the front after an unlock")
            }
            guard !inner.terminating, !inner.ended else { throw LifecycleError.refused("\(identifier) is terminating") }
            toForeground(&inner)
            return inner.state
        }
    }

    func deviceDidLock() {
        inner.withLock { inner in
            guard !inner.deviceLocked else { return }
            inner.deviceLocked = true
            if inner.state == .active || inner.state == .inactive {
                inner.frontAtLock = true
                toBackground(&inner)
            }
        }
    }

    func deviceDidUnlock() {
        inner.withLock { inner in
            guard inner.deviceLocked else { return }
            inner.deviceLocked = false
            if inner.frontAtLock, !inner.terminating {
                inner.frontAtLock = false
                toForeground(&inner)
            }
        }
    }

    /// Stops the app: `willTerminate` and `SIGTERM` to each of its processes, then `SIGKILL`
    /// after `grace` (the settings' ``LifecycleSettings/terminationDeadline`` when `nil`) unless
    /// it ends first.
    func terminate(grace: TimeInterval? = nil) {
        let grace = max(0, grace ?? settings.terminationDeadline)
        let deadline: Date? = inner.withLock { inner in
            guard !inner.terminating, !inner.ended else { return nil }
            inner.terminating = true
            inner.timer?.cancel()
            inner.timer = nil
            if inner.state == .suspended { self.run.resume() }
            if inner.state == .active { emit(.willResignActive, &inner) }
            emit(.willTerminate, &inner)
            return self.clock.now().addingTimeInterval(grace)
        }
        guard let deadline else { return }
        // Every program of the app hears it (a Swift app that follows the lifecycle takes
        // SIGTERM as the willTerminate it was just sent, AppLifecycle).
        run.askToEnd()
        let clock = self.clock
        Task {
            try? await clock.sleep(until: deadline)
            guard !self.inner.withLock({ $0.ended }) else { return }
            self.logger.notice(
                "\(self.identifier) did not exit within \(Self.describe(grace)) of willTerminate and SIGTERM; killed")
            self.run.kill()
        }
    }

    /// `5 s`, `0.5 s`.
    static func describe(_ seconds: TimeInterval) -> String {
        seconds == seconds.rounded() ? "\(Int(seconds)) s" : String(format: "%.1f s", seconds)
    }

    func launched() {
        logger.debug("\(identifier) launched; suspension by \(run.suspension.rawValue)")
    }

    func ended() {
        let (subscribers, waiters) = inner.withLock { inner in
            inner.ended = true
            inner.timer?.cancel()
            inner.timer = nil
            inner.tasks = [:]
            defer { inner.subscribers = []; inner.waiters = [] }
            return (inner.subscribers, inner.waiters)
        }
        inhibitor.release()
        for fd in subscribers { shutdown(fd, Int32(SHUT_RDWR)) }
        for (_, waiter) in waiters { waiter.resume() }
    }

    // MARK: - Requests from the app

    /// Adds a subscriber: answered with the state, under the lock, so no event slips between.
    func subscribe(_ fd: Int32) -> Bool {
        inner.withLock { inner in
            guard !inner.ended, (try? IPCFrame.write(fd, LifecycleProtocol.ok + [inner.state.rawValue])) != nil else {
                return false
            }
            inner.subscribers.insert(fd)
            return true
        }
    }

    func unsubscribe(_ fd: Int32) {
        _ = inner.withLock { $0.subscribers.remove(fd) }
    }

    /// `beginBackgroundTask`: an ID, or `.invalid` when this trip's budget is spent.
    func beginTask(named name: String) -> BackgroundTaskIdentifier {
        inner.withLock { inner in
            let now = clock.now()
            if let entered = inner.enteredBackground, now >= entered.addingTimeInterval(settings.backgroundTimeBudget) {
                logger.info("\(identifier): background task '\(name)' not started: its time in the background is spent")
                return .invalid
            }
            guard !inner.ended else { return .invalid }
            guard inner.tasks.count < Self.maxTasks else {
                logger.info("\(identifier): background task '\(name)' not started: \(Self.maxTasks) are running")
                return .invalid
            }
            let id = inner.nextTaskID
            inner.nextTaskID = inner.nextTaskID == UInt32.max ? 1 : inner.nextTaskID + 1
            inner.tasks[id] = TaskRecord(name: name, started: now)
            if inner.tasks.count == 1 { inhibitor.acquire(who: identifier, why: "background task '\(name)'") }
            reschedule(&inner)
            return BackgroundTaskIdentifier(rawValue: id)
        }
    }

    /// `endBackgroundTask`: unknown IDs are ignored (as UIKit logs and ignores them).
    func endTask(_ id: UInt32) {
        inner.withLock { inner in
            guard inner.tasks.removeValue(forKey: id) != nil else { return }
            if inner.tasks.isEmpty { inhibitor.release() }
            reschedule(&inner)
        }
    }

    // MARK: - Transitions (under the lock)

    private func toBackground(_ inner: inout Inner) {
        guard inner.state == .active || inner.state == .inactive, !inner.terminating, !inner.ended else { return }
        if inner.state == .active { emit(.willResignActive, &inner) }
        emit(.didEnterBackground, &inner)
        inner.enteredBackground = clock.now()
        for id in inner.tasks.keys { inner.tasks[id]?.warned = false }
        reschedule(&inner)
    }

    private func toForeground(_ inner: inout Inner) {
        guard inner.state == .background || inner.state == .suspended else { return }
        if inner.state == .suspended {
            run.resume()
            logger.info("\(identifier) resumed")
        }
        inner.timer?.cancel()
        inner.timer = nil
        inner.enteredBackground = nil
        emit(.willEnterForeground, &inner)
        emit(.didBecomeActive, &inner)
    }

    private func emit(_ event: LifecycleEvent, _ inner: inout Inner) {
        setState(event.resultingState, &inner)
        var w = ByteWriter()
        w.u8(LifecycleProtocol.version)
        w.u8(LifecycleProtocol.Status.event.rawValue)
        w.u8(event.rawValue)
        _ = IPCFrame.broadcast(w.bytes, to: &inner.subscribers)
        logger.debug("\(identifier): \(event)")
    }

    private func setState(_ state: ApplicationState, _ inner: inout Inner) {
        inner.state = state
        let ready = inner.waiters.filter { $0.0 == state }
        inner.waiters.removeAll { $0.0 == state }
        for (_, waiter) in ready { waiter.resume() }
    }

    /// Arms the one timer for the next thing due in the background (suspension, the tasks'
    /// warning, the budget's end), or none.
    private func reschedule(_ inner: inout Inner) {
        inner.timer?.cancel()
        inner.timer = nil
        guard inner.state == .background, !inner.terminating, let entered = inner.enteredBackground else { return }
        let end = entered.addingTimeInterval(settings.backgroundTimeBudget)
        let due: Date
        if inner.tasks.isEmpty {
            due = entered.addingTimeInterval(settings.suspensionDelay)
        } else if inner.tasks.values.contains(where: { !$0.warned }) {
            due = end.addingTimeInterval(-settings.expirationWarning)
        } else {
            due = end
        }
        let clock = self.clock
        inner.timer = Task { [weak self] in
            do { try await clock.sleep(until: due) } catch { return }
            self?.timerFired()
        }
    }

    private func timerFired() {
        inner.withLock { inner in
            guard inner.state == .background, !inner.terminating, let entered = inner.enteredBackground else { return }
            let now = clock.now()
            let end = entered.addingTimeInterval(settings.backgroundTimeBudget)
            if !inner.tasks.isEmpty, now >= end.addingTimeInterval(-settings.expirationWarning) {
                for (id, task) in inner.tasks.sorted(by: { $0.key < $1.key }) where !task.warned {
                    inner.tasks[id]?.warned = true
                    var w = ByteWriter()
                    w.u8(LifecycleProtocol.version)
                    w.u8(LifecycleProtocol.Status.event.rawValue)
                    w.u8(LifecycleProtocol.taskExpiring)
                    w.u32(id)
                    _ = IPCFrame.broadcast(w.bytes, to: &inner.subscribers)
                }
            }
            if !inner.tasks.isEmpty, now >= end {
                for (id, task) in inner.tasks.sorted(by: { $0.key < $1.key }) {
                    logger.warning(
                        "\(identifier): background task '\(task.name)' (\(id)) was still running when its \(Int(settings.backgroundTimeBudget)) s in the background ran out; ended by the system"
                    )
                }
                inner.tasks = [:]
                inhibitor.release()
            }
            if inner.tasks.isEmpty, now >= entered.addingTimeInterval(settings.suspensionDelay) {
                if run.suspend() {
                    setState(.suspended, &inner)
                    logger.info("\(identifier) suspended (\(run.suspension.rawValue))")
                } else {
                    // It could not be stopped whole (processes that keep forking away from the
                    // stop signal): ended, as iOS ends an app it cannot suspend — never reported
                    // suspended while a part of it runs.
                    logger.warning("\(identifier) could not be suspended (\(run.suspension.rawValue)): ended")
                    run.kill()
                }
                return
            }
            reschedule(&inner)
        }
    }
}
