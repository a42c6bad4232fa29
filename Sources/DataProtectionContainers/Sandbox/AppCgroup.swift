import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A cgroup (v2) of one app's own, below the supervisor's, so that the app can be frozen whole
/// — every process it started, at once, by the kernel (`cgroup.freeze`) — and killed whole
/// (`cgroup.kill`). Made only where this user may create cgroups (root, or a delegated subtree
/// such as `systemd-run --user --scope -p Delegate=yes`); elsewhere ``make(name:)`` is `nil`
/// and ``RunningApp`` stops the app with `SIGSTOP` instead.
final class AppCgroup: Sendable {
    /// The cgroup's directory.
    let path: String
    /// The supervisor's own cgroup directory, which it returns to after a spawn.
    let home: String

    private init(path: String, home: String) {
        self.path = path
        self.home = home
    }

    /// Spawns are serialized: the supervisor process stands in the new app's cgroup while it
    /// spawns (the child starts there, before it can fork), and nowhere else.
    private static let spawning = Mutex(())

    /// Creates `name` below this process's cgroup, or `nil` where cgroup v2 is missing or not
    /// writable by this user.
    static func make(name: String) -> AppCgroup? {
        guard let mount = cgroup2Mount(), let own = ownCgroup() else { return nil }
        let home = mount + (own == "/" ? "" : own)
        let path = home + "/" + name
        guard mkdir(path, 0o755) == 0 || errno == EEXIST else { return nil }
        guard access(path + "/cgroup.freeze", W_OK) == 0, access(path + "/cgroup.procs", W_OK) == 0,
              access(home + "/cgroup.procs", W_OK) == 0 else {
            rmdir(path)
            return nil
        }
        return AppCgroup(path: path, home: home)
    }

    /// Runs `spawn` with this process inside the cgroup, so the child it starts is born there;
    /// moves back afterwards. Throws what `spawn` throws; returns whether the child was born
    /// inside (`false`: the move itself failed, and it was spawned outside).
    func spawn(_ spawn: () throws -> Void) rethrows -> Bool {
        try Self.spawning.withLock { _ in
            let me = String(getpid())
            let entered = write(me, to: path + "/cgroup.procs")
            defer { if entered { _ = write(me, to: home + "/cgroup.procs") } }
            try spawn()
            return entered
        }
    }

    /// Freezes (`true`) or thaws the cgroup; `false` when the kernel refused.
    func freeze(_ frozen: Bool) -> Bool { write(frozen ? "1" : "0", to: path + "/cgroup.freeze") }

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
        if !write("1", to: path + "/cgroup.kill") {
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

    /// The cgroups of app `uuid` that supervisors killed outright (`SIGKILL`) left behind — with
    /// their processes, which may even be frozen for good — are killed and removed. A cgroup is
    /// left alone while the supervisor its name records (`dataprotection-UUID-PID-…`) still runs
    /// (even under an exclusive running lock: another data root copied from this one has the
    /// same app UUIDs). Only cgroups below this process's own are seen.
    static func reapOrphans(ofApp uuid: UUID) {
        guard let mount = cgroup2Mount(), let own = ownCgroup() else { return }
        let home = mount + (own == "/" ? "" : own)
        let prefix = "dataprotection-\(uuid.uuidString)-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: home)) ?? [] where name.hasPrefix(prefix) {
            guard let pid = pid_t(name.dropFirst(prefix.count).split(separator: "-").first ?? "") else { continue }
            if pid == getpid() || Glibc.kill(pid, 0) == 0 || errno == EPERM { continue }
            let orphan = AppCgroup(path: home + "/" + name, home: home)
            orphan.kill()
            // cgroup.kill is asynchronous: the directory goes once the last process has exited.
            for _ in 0..<200 where rmdir(orphan.path) != 0 && errno == EBUSY { usleep(5_000) }
        }
    }

    private func write(_ text: String, to file: String) -> Bool {
        let fd = open(file, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return text.withCString { Glibc.write(fd, $0, strlen($0)) } == text.utf8.count
    }

    /// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `…/unified` on a hybrid system).
    private static func cgroup2Mount() -> String? {
        guard let info = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
        for line in info.split(separator: "\n") {
            let halves = line.components(separatedBy: " - ")
            guard halves.count == 2, halves[1].hasPrefix("cgroup2 ") else { continue }
            let fields = halves[0].split(separator: " ")
            if fields.count > 4 { return String(fields[4]) }
        }
        return nil
    }

    /// This process's cgroup v2 path (the `0::` line of `/proc/self/cgroup`).
    private static func ownCgroup() -> String? {
        guard let text = try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8) else { return nil }
        return text.split(separator: "\n").first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) }
    }
}
