import Foundation
import Synchronization

/// The time source of a ``Keybag``: grace periods and passcode delays are measured on it.
///
/// Wall-clock time (`Date`) is used because failed-attempt delays must survive restarts.
/// Tests and `dpctl tour` inject a ``ManualClock`` so that nothing ever sleeps on real time.
public protocol KeybagClock: Sendable {
    /// The current time.
    func now() -> Date
    /// Suspends until `deadline` (or throws `CancellationError`).
    func sleep(until deadline: Date) async throws
}

/// The real clock: `Date()` and `Task.sleep`.
public struct SystemClock: KeybagClock {
    public init() {}
    public func now() -> Date { Date() }
    public func sleep(until deadline: Date) async throws {
        let seconds = deadline.timeIntervalSinceNow
        if seconds > 0 { try await Task.sleep(for: .milliseconds(Int64((seconds * 1000).rounded(.up)))) }
    }
}

/// A virtual clock that only moves when told to.
///
/// ```swift
/// let clock = ManualClock()
/// let keybag = try await Keybag.open(root: root, clock: clock)
/// await keybag.lock()
/// clock.advance(by: 10)            // the grace period ends: class-A keys are discarded
/// ```
public final class ManualClock: KeybagClock {
    private struct Sleeper { let deadline: Date; let continuation: CheckedContinuation<Void, any Error> }
    private struct State { var now: Date; var sleepers: [UUID: Sleeper] = [:] }
    private let state: Mutex<State>

    /// Starts at `start` (by default 2026-01-01T00:00:00Z, so runs are reproducible).
    public init(start: Date = Date(timeIntervalSince1970: 1_767_225_600)) {
        state = Mutex(State(now: start))
    }

    public func now() -> Date { state.withLock { $0.now } }

    /// Moves time forward and wakes every sleeper whose deadline has passed.
    public func advance(by seconds: TimeInterval) {
        let due: [CheckedContinuation<Void, any Error>] = state.withLock { state in
            state.now += seconds
            let now = state.now
            let ready = state.sleepers.filter { $0.value.deadline <= now }
            for key in ready.keys { state.sleepers[key] = nil }
            return ready.values.map(\.continuation)
        }
        for continuation in due { continuation.resume() }
    }

    public func sleep(until deadline: Date) async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: Bool = state.withLock { state in
                    if deadline <= state.now || Task.isCancelled { return true }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let continuation = state.withLock { $0.sleepers.removeValue(forKey: id)?.continuation }
            continuation?.resume(throwing: CancellationError())
        }
        try Task.checkCancellation()
    }
}
