import DataProtectionKeybag
import DataProtectionSystem
import Foundation

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
    /// The supervisor's own cgroup directory.
    let home: String
    /// The app's cgroups in v1 hierarchies (hybrid systems), with the supervisor's own there.
    private let legacy: [(path: String, home: String)]
    /// Which limits the kernel holds the app to through this cgroup.
    let limitsTasks: Bool, limitsMemory: Bool
    /// Where the kernel counts the app's out-of-memory kills (`oom_kill N`).
    private let memoryEvents: String?

    private init(
        path: String, home: String, legacy: [(path: String, home: String)] = [],
        limitsTasks: Bool = false, limitsMemory: Bool = false, memoryEvents: String? = nil
    ) {
        self.path = path
        self.home = home
        self.legacy = legacy
        self.limitsTasks = limitsTasks
        self.limitsMemory = limitsMemory
        self.memoryEvents = memoryEvents
    }

    /// Creates `name` below this process's cgroup, with `limits`, or `nil` where cgroup v2 is
    /// missing or not writable by this user.
    static func make(
        name: String, limits: AppResourceLimits? = nil, in hierarchies: Hierarchies = .current()
    ) -> AppCgroup? {
        guard let home = hierarchies.unified else { return nil }
        let path = home + "/" + name
        guard mkdir(path, 0o755) == 0 || errno == EEXIST else { return nil }
        guard access(path + "/cgroup.freeze", W_OK) == 0, access(path + "/cgroup.procs", W_OK) == 0,
            access(home + "/cgroup.procs", W_OK) == 0
        else {
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
        for (controller, file, value) in [
            ("pids", "pids.max", String(limits.tasks)), ("memory", "memory.limit_in_bytes", String(limits.memoryBytes)),
        ] {
            if controller == "pids" ? tasks : memory { continue }
            guard let v1 = hierarchies.legacy[controller] else { continue }
            let directory = v1 + "/" + name
            guard mkdir(directory, 0o755) == 0 || errno == EEXIST else { continue }
            // The child enters through `tasks` (one thread), and leaves the same way if it must.
            guard write(value, to: directory + "/" + file), access(directory + "/tasks", W_OK) == 0,
                access(v1 + "/tasks", W_OK) == 0
            else {
                rmdir(directory)
                continue
            }
            legacy.append((directory, v1))
            if controller == "pids" { tasks = true } else { memory = true; events = directory + "/memory.oom_control" }
        }
        return AppCgroup(
            path: path, home: home, legacy: legacy, limitsTasks: tasks, limitsMemory: memory, memoryEvents: events)
    }

    /// Whether the kernel ended one of the app's processes for going over its memory limit.
    var memoryLimitWasHit: Bool {
        guard let memoryEvents, let text = try? String(contentsOfFile: memoryEvents, encoding: .utf8) else {
            return false
        }
        return text.split(separator: "\n").contains { $0.hasPrefix("oom_kill ") && $0 != "oom_kill 0" }
    }

    /// Where a child is born inside this cgroup (``ChildProcess/start(in:)``): its directory,
    /// open while `body` runs, and its v1 cgroups. No process is ever moved into the cgroup — a
    /// move waits for the kernel's RCU grace period, milliseconds each — and the supervisor never
    /// stands in it.
    func withBirthplace<T>(_ body: (SystemCall.Birthplace) throws -> T) throws -> T {
        let directory = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw ContainerError.launchFailed("\(path): \(String(cString: strerror(errno)))") }
        defer { close(directory) }
        return try body(
            SystemCall.Birthplace(
                directory: directory, procs: path + "/cgroup.procs", home: home + "/cgroup.procs",
                legacy: legacy.map(\.path)))
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
        ((try? String(contentsOfFile: path + "/cgroup.procs", encoding: .utf8)) ?? "").split(separator: "\n").compactMap
        { pid_t($0) }
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
            if n > 0, String(decoding: buffer[0..<n], as: UTF8.self).split(separator: "\n").contains("populated 0") {
                break
            }
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

    /// Removes a cgroup's directory, waiting (about a second at most) while the kernel still
    /// counts a process in it: an exited process leaves a v1 cgroup a moment after its parent has
    /// reaped it, so the first waits are short (0.1 ms, doubling to 5 ms).
    private static func removeDirectory(_ path: String) {
        var pause: UInt32 = 100
        var waited: UInt32 = 0
        while waited < 1_000_000 {
            if rmdir(path) == 0 || errno != EBUSY { return }
            usleep(pause)
            waited += pause
            pause = min(pause * 2, 5_000)
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
    static func reapOrphans(ofApp uuid: UUID, in hierarchies: Hierarchies = .current()) {
        guard let home = hierarchies.unified else { return }
        let prefix = "dataprotection-\(uuid.uuidString)-"
        for name in directoryNames(home, prefix: prefix) {
            guard let pid = pid_t(name.dropFirst(prefix.count).split(separator: "-").first ?? "") else { continue }
            if pid == getpid() || Glibc.kill(pid, 0) == 0 || errno == EPERM { continue }
            let legacy = ["pids", "memory"].compactMap { hierarchies.legacy[$0] }.map {
                (path: $0 + "/" + name, home: $0)
            }
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

    /// The names in `directory` that start with `prefix` (`readdir`: a cgroup directory lists
    /// its control files too, and this runs at every launch).
    private static func directoryNames(_ directory: String, prefix: String) -> [String] {
        guard let stream = opendir(directory) else { return [] }
        defer { closedir(stream) }
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name.hasPrefix(prefix) { names.append(name) }
        }
        return names
    }

    /// Where this process stands in the cgroup hierarchies: its cgroup v2 directory (below
    /// `/sys/fs/cgroup`, or `…/unified` on a hybrid system) and, on a hybrid system, its
    /// directories in the v1 hierarchies of the `pids` and `memory` controllers. Read once per
    /// launch (`/proc/self/mountinfo` and `/proc/self/cgroup`).
    struct Hierarchies {
        var unified: String?
        var legacy: [String: String] = [:]

        static func current() -> Hierarchies {
            var hierarchies = Hierarchies()
            guard let mounts = MountTable.entries(),
                let text = try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
            else { return hierarchies }
            // Lines `ID:CONTROLLERS:PATH` (`0::PATH` for cgroup v2).
            var own: [String: String] = [:]
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
                guard fields.count == 3 else { continue }
                let path = fields[2] == "/" ? "" : String(fields[2])
                if fields[0] == "0" && fields[1].isEmpty { own[""] = path; continue }
                for controller in fields[1].split(separator: ",") { own[String(controller)] = path }
            }
            if let mount = mounts.first(where: { $0.type == "cgroup2" }), let path = own[""] {
                hierarchies.unified = mount.mountPoint + path
            }
            for controller in ["pids", "memory"] {
                guard let path = own[controller],
                    let mount = mounts.first(where: {
                        $0.type == "cgroup" && $0.root == "/" && $0.superOptions.contains(controller)
                    })
                else { continue }
                hierarchies.legacy[controller] = mount.mountPoint + path
            }
            return hierarchies
        }
    }
}
