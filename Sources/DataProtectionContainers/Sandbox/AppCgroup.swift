import DataProtectionKeybag
import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A cgroup (v2) of one app's own, below the supervisor's, so that the app can be frozen whole
/// — every process it started, at once, by the kernel (`cgroup.freeze`) — and killed whole
/// (`cgroup.kill`), and held to its ``AppResourceLimits`` (`pids.max`, `memory.max`). Made only
/// where this user may create cgroups (root, or a delegated subtree such as `systemd-run --user
/// --scope -p Delegate=yes`); elsewhere ``make(name:limits:)`` is `nil` and ``RunningApp`` stops
/// the app with `SIGSTOP` instead.
///
/// On a hybrid system, where the `pids` and `memory` controllers are in cgroup v1 hierarchies
/// of their own, the app also gets a cgroup of the same name in each, holding the same processes.
final class AppCgroup: Sendable {
    /// The cgroup's directory.
    let path: String
    /// The supervisor's own cgroup directory, which it returns to after a spawn.
    let home: String
    /// The app's cgroups in v1 hierarchies (hybrid systems), with the supervisor's own there.
    private let legacy: [(path: String, home: String)]
    /// Which limits the kernel holds the app to through this cgroup.
    let limitsTasks: Bool, limitsMemory: Bool
    /// Where the kernel counts the app's out-of-memory kills (`oom_kill N`).
    private let memoryEvents: String?

    private init(path: String, home: String, legacy: [(path: String, home: String)] = [],
                 limitsTasks: Bool = false, limitsMemory: Bool = false, memoryEvents: String? = nil) {
        self.path = path
        self.home = home
        self.legacy = legacy
        self.limitsTasks = limitsTasks
        self.limitsMemory = limitsMemory
        self.memoryEvents = memoryEvents
    }

    /// Spawns are serialized: the supervisor process stands in the new app's cgroup while it
    /// spawns (the child starts there, before it can fork), and nowhere else.
    private static let spawning = Mutex(())

    /// Creates `name` below this process's cgroup, with `limits`, or `nil` where cgroup v2 is
    /// missing or not writable by this user.
    static func make(name: String, limits: AppResourceLimits? = nil) -> AppCgroup? {
        guard let mount = cgroup2Mount(), let own = ownCgroup(in: "0::") else { return nil }
        let home = mount + (own == "/" ? "" : own)
        let path = home + "/" + name
        guard mkdir(path, 0o755) == 0 || errno == EEXIST else { return nil }
        guard access(path + "/cgroup.freeze", W_OK) == 0, access(path + "/cgroup.procs", W_OK) == 0,
              access(home + "/cgroup.procs", W_OK) == 0 else {
            rmdir(path)
            return nil
        }
        guard let limits else { return AppCgroup(path: path, home: home) }
        // cgroup v2's controllers, where the supervisor's cgroup hands them down.
        var tasks = write(String(limits.tasks), to: path + "/pids.max")
        var memory = write(String(limits.memoryBytes), to: path + "/memory.max")
        var events: String? = memory ? path + "/memory.events" : nil
        // Else a hybrid system's v1 hierarchies.
        var legacy: [(path: String, home: String)] = []
        for (controller, file, value) in [("pids", "pids.max", String(limits.tasks)), ("memory", "memory.limit_in_bytes", String(limits.memoryBytes))] {
            if controller == "pids" ? tasks : memory { continue }
            guard let v1 = legacyHierarchy(controller) else { continue }
            let directory = v1 + "/" + name
            guard mkdir(directory, 0o755) == 0 || errno == EEXIST else { continue }
            guard write(value, to: directory + "/" + file), access(directory + "/cgroup.procs", W_OK) == 0,
                  access(v1 + "/cgroup.procs", W_OK) == 0 else {
                rmdir(directory)
                continue
            }
            legacy.append((directory, v1))
            if controller == "pids" { tasks = true } else { memory = true; events = directory + "/memory.oom_control" }
        }
        return AppCgroup(path: path, home: home, legacy: legacy, limitsTasks: tasks, limitsMemory: memory, memoryEvents: events)
    }

    /// Whether the kernel ended one of the app's processes for going over its memory limit.
    var memoryLimitWasHit: Bool {
        guard let memoryEvents, let text = try? String(contentsOfFile: memoryEvents, encoding: .utf8) else { return false }
        return text.split(separator: "\n").contains { $0.hasPrefix("oom_kill ") && $0 != "oom_kill 0" }
    }

    /// Runs `spawn` with this process inside the cgroup, so the child it starts is born there;
    /// moves back afterwards. Throws what `spawn` throws; returns whether the child was born
    /// inside (`false`: the move itself failed, and it was spawned outside).
    func spawn(_ spawn: () throws -> Void) rethrows -> Bool {
        try Self.spawning.withLock { _ in
            let me = String(getpid())
            let entered = Self.write(me, to: path + "/cgroup.procs")
            defer { if entered { _ = Self.write(me, to: home + "/cgroup.procs") } }
            // The v1 cgroups too: a process that could not enter one is outside its limit.
            let enteredLegacy = legacy.filter { Self.write(me, to: $0.path + "/cgroup.procs") }
            defer { for group in enteredLegacy { _ = Self.write(me, to: group.home + "/cgroup.procs") } }
            try spawn()
            return entered && enteredLegacy.count == legacy.count
        }
    }

    /// Freezes (`true`) or thaws the cgroup; `false` when the kernel refused.
    func freeze(_ frozen: Bool) -> Bool { Self.write(frozen ? "1" : "0", to: path + "/cgroup.freeze") }

    /// Whether the kernel reports every process of the cgroup frozen (`cgroup.events`).
    var isFrozen: Bool {
        guard let events = try? String(contentsOfFile: path + "/cgroup.events", encoding: .utf8) else { return false }
        return events.split(separator: "\n").contains("frozen 1")
    }

    /// The processes in the cgroup.
    var processes: [pid_t] {
        ((try? String(contentsOfFile: path + "/cgroup.procs", encoding: .utf8)) ?? "").split(separator: "\n").compactMap { pid_t($0) }
    }

    /// Kills every process in the cgroup (`cgroup.kill`, Linux 5.14; else `SIGKILL` to each).
    func kill() {
        if !Self.write("1", to: path + "/cgroup.kill") {
            for pid in processes { _ = Glibc.kill(pid, SIGKILL) }
        }
        _ = freeze(false)   // a frozen process dies only once thawed
    }

    /// Removes the cgroup. Its last processes may still be exiting when the app's first process
    /// has been reaped (the cgroup is "populated" until they are gone): it waits for the kernel's
    /// `populated 0` in `cgroup.events` (a `poll` notification, at most `timeout` seconds),
    /// killing what is left, then removes it. `false` when it could not be removed.
    @discardableResult
    func remove(timeout: Int32 = 5) -> Bool {
        defer { removeLegacy() }
        if rmdir(path) == 0 || errno == ENOENT { return true }
        guard errno == EBUSY else { return false }
        let events = open(path + "/cgroup.events", O_RDONLY | O_CLOEXEC)
        guard events >= 0 else { return rmdir(path) == 0 }
        defer { close(events) }
        var deadline = timeout * 1000
        var killed = false
        while true {
            var buffer = [UInt8](repeating: 0, count: 256)
            let n = pread(events, &buffer, buffer.count, 0)
            if n > 0, String(decoding: buffer[0..<n], as: UTF8.self).split(separator: "\n").contains("populated 0") { break }
            if deadline <= 0 {
                if killed { break }
                kill()   // still populated: what is left of the app goes now
                killed = true
                deadline = timeout * 1000
            }
            var descriptor = pollfd(fd: events, events: Int16(POLLPRI), revents: 0)
            _ = poll(&descriptor, 1, 100)
            deadline -= 100
        }
        return rmdir(path) == 0
    }

    /// Removes a cgroup's directory, waiting (at most a second) while the kernel still counts a
    /// process in it.
    private static func removeDirectory(_ path: String) {
        for _ in 0..<200 {
            if rmdir(path) == 0 || errno != EBUSY { return }
            usleep(5_000)
        }
    }

    /// The v1 cgroups, once the app's processes are gone (their `cgroup.procs` empty).
    private func removeLegacy() {
        for group in legacy {
            Self.removeDirectory(group.path)
        }
    }

    /// The cgroups of app `uuid` that supervisors killed outright (`SIGKILL`) left behind — with
    /// their processes, which may even be frozen for good — are killed and removed. A cgroup is
    /// left alone while the supervisor its name records (`dataprotection-UUID-PID-…`) still runs
    /// (even under an exclusive running lock: another data root copied from this one has the
    /// same app UUIDs). Only cgroups below this process's own are seen.
    static func reapOrphans(ofApp uuid: UUID) {
        guard let mount = cgroup2Mount(), let own = ownCgroup(in: "0::") else { return }
        let home = mount + (own == "/" ? "" : own)
        let prefix = "dataprotection-\(uuid.uuidString)-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: home)) ?? [] where name.hasPrefix(prefix) {
            guard let pid = pid_t(name.dropFirst(prefix.count).split(separator: "-").first ?? "") else { continue }
            if pid == getpid() || Glibc.kill(pid, 0) == 0 || errno == EPERM { continue }
            let legacy = ["pids", "memory"].compactMap(legacyHierarchy).map { (path: $0 + "/" + name, home: $0) }
                .filter { access($0.path, F_OK) == 0 }
            let orphan = AppCgroup(path: home + "/" + name, home: home, legacy: legacy)
            orphan.kill()
            // cgroup.kill is asynchronous: the directory goes once the last process has exited.
            Self.removeDirectory(orphan.path)
            orphan.removeLegacy()
        }
    }

    /// Writes `text` to a cgroup file; `false` when it is not there (a controller's file, which
    /// the parent may not hand down) or the kernel refused.
    private static func write(_ text: String, to file: String) -> Bool {
        let fd = open(file, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return text.withCString { Glibc.write(fd, $0, strlen($0)) } == text.utf8.count
    }

    /// This process's cgroup in the v1 hierarchy of `controller` (hybrid systems), when one is
    /// mounted.
    private static func legacyHierarchy(_ controller: String) -> String? {
        for entry in MountTable.entries() ?? [] where entry.type == "cgroup" && entry.superOptions.contains(controller) {
            guard entry.root == "/", let own = ownCgroup(in: ":\(controller):") else { continue }
            return entry.mountPoint + (own == "/" ? "" : own)
        }
        return nil
    }

    /// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `…/unified` on a hybrid system).
    private static func cgroup2Mount() -> String? {
        MountTable.entries()?.first { $0.type == "cgroup2" }?.mountPoint
    }

    /// This process's cgroup path in a hierarchy of `/proc/self/cgroup`: `0::` for cgroup v2,
    /// `:pids:` for a v1 controller's (the line `N:pids:/path`).
    private static func ownCgroup(in hierarchy: String) -> String? {
        guard let text = try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") {
            if hierarchy == "0::" { if line.hasPrefix("0::") { return String(line.dropFirst(3)) } ; continue }
            guard let range = line.range(of: hierarchy) else { continue }
            return String(line[range.upperBound...])
        }
        return nil
    }
}
