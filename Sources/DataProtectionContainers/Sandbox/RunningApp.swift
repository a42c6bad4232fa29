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

    /// The budgets this run was given (``AppResourceLimits``).
    public let limits: AppResourceLimits
    /// Whether the app runs in its own user namespace (sandboxed), where the tasks and inotify
    /// budgets hold.
    let ownUserNamespace: Bool
    private let endedByMemoryLimit = Mutex(false)

    /// Where the protected file system serves a container path, when it serves this run's
    /// containers (``ContainerFileSystem``): what is handed to the app is opened there, so the
    /// app reads plaintext and never needs a key. `nil`: the app sees the directories themselves.
    public let servedPath: (@Sendable (String) -> String)?

    init(
        app: AppContainer, cgroup: AppCgroup?, limits: AppResourceLimits, ownUserNamespace: Bool,
        servedPath: (@Sendable (String) -> String)? = nil
    ) {
        self.servedPath = servedPath
        self.app = app
        self.cgroupIfMade = cgroup
        self.limits = limits
        self.ownUserNamespace = ownUserNamespace
    }

    /// Which of ``limits`` the kernel holds this run to, and how, in one line: `tasks 1024
    /// (user namespace), memory 512 MiB (memory cgroup), inotify 32 instances and 48134
    /// watches (user namespace)`; a limit nothing holds says `not limited` and why.
    public var limitsInForce: String {
        let cgroup = self.cgroup
        var parts: [String] = []
        if cgroup?.limitsTasks == true {
            parts.append("tasks \(limits.tasks) (pids cgroup)")
        } else if ownUserNamespace && getuid() != 0 {
            parts.append("tasks \(limits.tasks) (user namespace)")
        } else {
            parts.append(
                "tasks not limited (\(ownUserNamespace ? "root is exempt from RLIMIT_NPROC, and no pids cgroup could be made" : "unconfined"))"
            )
        }
        if cgroup?.limitsMemory == true {
            parts.append("memory \(AppResourceLimits.describe(bytes: limits.memoryBytes)) (memory cgroup)")
        } else {
            parts.append(
                "memory not limited (no memory cgroup: root, or a delegated cgroup such as systemd-run --user --scope -p Delegate=yes)"
            )
        }
        parts.append(
            ownUserNamespace
                ? "inotify \(limits.inotifyInstances) instances and \(limits.inotifyWatches) watches (user namespace)"
                : "inotify not limited (unconfined)")
        return parts.joined(separator: ", ")
    }

    /// Whether the kernel ended the app (or one of its processes) for going over its memory limit.
    public var exceededMemoryLimit: Bool { endedByMemoryLimit.withLock { $0 } || (cgroup?.memoryLimitWasHit ?? false) }

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
        let members = appProcesses(pid)
        return !members.isEmpty && members.allSatisfy { Self.processState($0).map { $0 == "T" || $0 == "t" } ?? true }
    }

    /// The app's own processes, without the sandbox's: bubblewrap's monitor (the run's pid) and
    /// the pid namespace's init (pid 1 inside), which must keep reaping what the app's
    /// processes leave — stopped, it would collect zombies until the system's pids ran out.
    private func appProcesses(_ root: pid_t?) -> [pid_t] {
        processTree(root).filter { $0 != root && Self.innermostPID($0).map { $0 != 1 } ?? false }
    }

    /// A process's pid in its innermost pid namespace (`NSpid`'s last field in `/proc/PID/status`).
    private static func innermostPID(_ pid: pid_t) -> pid_t? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("NSpid:") })
        else { return nil }
        return line.split(whereSeparator: { $0 == "\t" || $0 == " " }).last.flatMap { pid_t($0) }
    }

    /// Starts `child` (the app) inside the run's cgroup, if it has one; returns whether the app
    /// was born there.
    func spawn(_ child: ChildProcess) throws -> Bool {
        guard let cgroup else {
            try child.start()
            return false
        }
        return try cgroup.withBirthplace { try child.start(in: $0) }
    }

    func launched(pid: pid_t, inCgroup: Bool) {
        bornInCgroup.withLock { $0 = inCgroup }
        state.withLock { $0.pid = pid }
        if !inCgroup { cgroupIfMade?.remove() }
    }

    func ended() {
        state.withLock {
            $0.ended = true; $0.suspended = false
        }
        if cgroup?.memoryLimitWasHit == true { endedByMemoryLimit.withLock { $0 = true } }
        cgroupIfMade?.remove()
    }

    /// Stops the app's processes (they keep their memory and descriptors). `false` when the app
    /// is not running or the kernel refused.
    @discardableResult
    public func suspend() -> Bool {
        state.withLock { state in
            guard state.pid != nil, !state.ended else { return false }
            // Suspended is reported only once the kernel shows it; an app that cannot be stopped
            // is not reported suspended (the caller ends it, as iOS ends apps it cannot suspend).
            if let cgroup {
                guard cgroup.freeze(true) else { return false }
                // Freezing takes effect as each process reaches a safe point (bounded: a process
                // stuck in the kernel is frozen when it leaves it).
                for _ in 0..<2000 where !cgroup.isFrozen { usleep(500) }
                guard cgroup.isFrozen else {
                    _ = cgroup.freeze(false)
                    return false
                }
            } else {
                // Stop every process of the app, then look again, until one look finds them all
                // stopped: a stopped process cannot fork, so such a look is the whole app. A chain
                // of processes that each fork a successor and exit is chased until it is caught,
                // or the rounds run out and the app is not suspended.
                var verified = false
                let deadline = Date().addingTimeInterval(Self.stopTimeLimit)
                while Date() < deadline {
                    let members = appProcesses(state.pid)
                    let running = members.filter { Self.processState($0).map { $0 != "T" && $0 != "t" } ?? false }
                    if running.isEmpty { verified = true; break }
                    for pid in running { _ = Glibc.kill(pid, SIGSTOP) }
                    usleep(200)   // a stop signal is delivered asynchronously
                }
                guard verified else { return false }
            }
            state.suspended = true
            return true
        }
    }

    /// How long the supervisor chases the app's processes before giving up on stopping it.
    static let stopTimeLimit: TimeInterval = 2

    /// Lets the app's processes run again.
    public func resume() {
        state.withLock { state in
            guard state.suspended else { return }
            state.suspended = false
            if let cgroup {
                _ = cgroup.freeze(false)
            } else {
                for pid in appProcesses(state.pid).reversed() { _ = Glibc.kill(pid, SIGCONT) }
            }
        }
    }

    /// Asks every process of the app to end (`SIGTERM`), as a service manager stops a service: a
    /// shell's `trap … TERM`, Python's signal handlers and the like run. Not the sandbox's own
    /// bubblewrap (which would take the app down with it at once); its init inside the sandbox
    /// ignores the signal, as a PID namespace's init does without a handler. Resume a suspended
    /// app first.
    public func askToEnd() {
        guard let pid = self.pid else { return }
        for member in processTree(pid) where !(ownUserNamespace && member == pid) { _ = Glibc.kill(member, SIGTERM) }
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
            let close = text.lastIndex(of: ")")
        else { return nil }
        return text[text.index(after: close)...].split(separator: " ")
    }

    private static func processState(_ pid: pid_t) -> String? { statFields(pid)?.first.map(String.init) }
    private static func parent(of pid: pid_t) -> pid_t? {
        statFields(pid).flatMap { $0.count > 1 ? pid_t($0[1]) : nil }
    }
}
