import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One run of an app under a supervisor: its container, and once launched, its processes —
/// which the supervisor's services may suspend (the app stops getting CPU), resume and end.
///
/// Suspension uses the kernel's cgroup freezer when the supervisor could give the app a cgroup
/// of its own (``Suspension/cgroupFreezer``): every process of the app stops at once and cannot
/// notice. Elsewhere it sends `SIGSTOP` to each process of the app's tree
/// (``Suspension/stopSignal``), and `SIGCONT` to resume it.
public final class RunningApp: Sendable {
    /// How this run's processes are suspended.
    public enum Suspension: String, Sendable {
        case cgroupFreezer = "cgroup freezer"
        case stopSignal = "SIGSTOP"
    }

    /// The app's container.
    public let app: AppContainer
    /// Distinguishes runs of the same app.
    public let id = UUID()
    private let cgroupIfMade: AppCgroup?
    /// The app's cgroup, when it was born in one.
    private var cgroup: AppCgroup? { bornInCgroup.withLock { $0 } ? cgroupIfMade : nil }
    private let bornInCgroup = Mutex(true)
    private let state = Mutex<(pid: pid_t?, suspended: Bool, ended: Bool)>((nil, false, false))

    init(app: AppContainer, cgroup: AppCgroup?) {
        self.app = app
        self.cgroupIfMade = cgroup
    }

    /// The process the supervisor started (bubblewrap, or the app itself unconfined); `nil`
    /// before launch.
    public var pid: pid_t? { state.withLock { $0.pid } }

    /// How suspension works for this run.
    public var suspension: Suspension { cgroup == nil ? .stopSignal : .cgroupFreezer }

    /// Whether the supervisor has suspended the app (and not resumed it).
    public var isSuspended: Bool { state.withLock { $0.suspended } }

    /// Whether the kernel shows every process of the app stopped: the cgroup's `frozen 1`, or
    /// each process in state `T`.
    public var isStoppedByKernel: Bool {
        if let cgroup { return cgroup.isFrozen }
        let tree = processTree(pid)
        return !tree.isEmpty && tree.allSatisfy { Self.processState($0) == "T" }
    }

    /// Runs `start` (which spawns the app) inside the run's cgroup, if it has one; returns
    /// whether the app was born there.
    func spawn(_ start: () throws -> Void) throws -> Bool {
        guard let cgroup else {
            try start()
            return false
        }
        return try cgroup.spawn(start)
    }

    func launched(pid: pid_t, inCgroup: Bool) {
        bornInCgroup.withLock { $0 = inCgroup }
        state.withLock { $0.pid = pid }
        if !inCgroup { cgroupIfMade?.remove() }
    }

    func ended() {
        state.withLock { $0.ended = true; $0.suspended = false }
        cgroupIfMade?.remove()
    }

    /// Stops the app's processes (they keep their memory and descriptors). `false` when the app
    /// is not running or the kernel refused.
    @discardableResult
    public func suspend() -> Bool {
        state.withLock { state in
            guard state.pid != nil, !state.ended else { return false }
            if let cgroup {
                guard cgroup.freeze(true) else { return false }
                // Freezing takes effect as each process reaches a safe point; report suspended
                // once the kernel says all have (bounded: a process stuck in the kernel is
                // frozen when it leaves it).
                for _ in 0..<2000 where !cgroup.isFrozen { usleep(500) }
            } else {
                // Parents first, repeated until no new process appears: a process cannot fork
                // once stopped, so the tree stops growing.
                var stopped = Set<pid_t>()
                for _ in 0..<16 {
                    let fresh = processTree(state.pid).filter { !stopped.contains($0) }
                    if fresh.isEmpty { break }
                    for pid in fresh {
                        _ = Glibc.kill(pid, SIGSTOP)
                        stopped.insert(pid)
                    }
                }
                // A stop signal is delivered asynchronously: report suspended once each
                // process shows it (bounded).
                let shown = { stopped.allSatisfy { Self.processState($0).map { $0 == "T" } ?? true } }
                for _ in 0..<2000 where !shown() { usleep(500) }
            }
            state.suspended = true
            return true
        }
    }

    /// Lets the app's processes run again.
    public func resume() {
        state.withLock { state in
            guard state.suspended else { return }
            state.suspended = false
            if let cgroup {
                _ = cgroup.freeze(false)
            } else {
                for pid in processTree(state.pid).reversed() { _ = Glibc.kill(pid, SIGCONT) }
            }
        }
    }

    /// Ends every process of the app at once (`SIGKILL`; a suspended app is killed too).
    public func kill() {
        guard let pid = self.pid else { return }
        if let cgroup {
            cgroup.kill()
        } else {
            for member in processTree(pid) { _ = Glibc.kill(member, SIGKILL) }
            _ = Glibc.kill(pid, SIGKILL)
        }
    }

    /// The launched process and its descendants, parents before children.
    private func processTree(_ root: pid_t?) -> [pid_t] {
        guard let root else { return [] }
        if let cgroup { return cgroup.processes }
        var children: [pid_t: [pid_t]] = [:]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = pid_t(entry), let parent = Self.parent(of: pid) else { continue }
            children[parent, default: []].append(pid)
        }
        var order = [root]
        var index = 0
        while index < order.count {
            order += children[order[index]] ?? []
            index += 1
        }
        return order.filter { Self.processState($0) != nil }
    }

    /// Fields of `/proc/PID/stat` after the command name (which may hold spaces and parentheses).
    private static func statFields(_ pid: pid_t) -> [Substring]? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }

    private static func processState(_ pid: pid_t) -> String? { statFields(pid)?.first.map(String.init) }
    private static func parent(of pid: pid_t) -> pid_t? { statFields(pid).flatMap { $0.count > 1 ? pid_t($0[1]) : nil } }
}
