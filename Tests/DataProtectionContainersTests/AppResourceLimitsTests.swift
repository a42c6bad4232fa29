import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// One app taking what every app needs — processes, memory, inotify instances — stops at its
/// own budget, and the user's other apps and the host still get theirs. Real hostile apps, as
/// root (the pids and memory cgroups) and as an ordinary user (the app's user namespace).
@Suite(.serialized) struct AppResourceLimitsTests {
    /// A hostile app: `fork` forks (children that wait) until the kernel refuses, `inotify`
    /// makes inotify instances until refused, `some N` forks N waiting children, `memory M`
    /// touches M MiB; each prints what it holds, then keeps it until its standard input closes.
    static let hostile = """
        import ctypes, os, signal, sys
        mode = sys.argv[1]
        libc = ctypes.CDLL(None, use_errno=True)
        held, why = 0, "-"
        if mode in ("fork", "some"):
            limit = int(sys.argv[2]) if mode == "some" else 5000
            while held < limit:
                try:
                    if os.fork() == 0:
                        signal.pause()
                        os._exit(0)
                    held += 1
                except OSError as e:
                    why = e.strerror
                    break
        elif mode == "inotify":
            while held < 5000:
                if libc.inotify_init1(0) < 0:
                    why = os.strerror(ctypes.get_errno())
                    break
                held += 1
        elif mode == "memory":
            block = bytearray(int(sys.argv[2]) << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            held = len(block) >> 20
        print("held %d %s" % (held, why), flush=True)
        sys.stdin.read()
        """

    /// Runs `dpctl` (as `user` when given) and keeps it running; its standard input is held open.
    struct Running {
        let process: Process
        let input: Pipe
        let output: Pipe
        let errors: PipeReader
        /// Standard error, once it has finished.
        var errorText: String { String(decoding: errors.result(), as: UTF8.self) }
        var line: String { get throws { try readLine(output.fileHandleForReading.fileDescriptor, timeout: 60) } }
        func finish() -> Int32 {
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
            return process.terminationStatus
        }
    }

    static func start(_ cli: CLI, _ args: [String], asUser user: String? = nil) throws -> Running {
        let process = Process()
        if let user {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(user)", "--regid=nogroup", "--clear-groups", CLI.executable.path, "--root", cli.root] + args
        } else {
            process.executableURL = CLI.executable
            process.arguments = ["--root", cli.root] + args
        }
        let input = Pipe(), output = Pipe(), errors = Pipe()
        (process.standardInput, process.standardOutput, process.standardError) = (input, output, errors)
        try process.run()
        return Running(process: process, input: input, output: output, errors: PipeReader(errors.fileHandleForReading))
    }

    static func run(_ cli: CLI, _ app: String, _ mode: [String], asUser user: String? = nil) throws -> Running {
        try start(cli, ["app", "run", app, "--", "/usr/bin/python3", "-c", hostile] + mode, asUser: user)
    }

    /// A data root of the ordinary user `nobody`, with apps installed by it.
    static func nobodysWorld(installing apps: [(String, [String])]) throws -> CLI {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
        #expect(chown(cli.work.path, 65534, 65534) == 0 && chown(passcode, 65534, 65534) == 0)
        let initialized = try cli.run(["init", "--passcode-file", passcode], asUser: "nobody")
        guard initialized.status == 0 else { throw TestFailure("init as nobody: \(initialized.stderr)") }
        for (id, options) in apps {
            let installed = try cli.run(["app", "install", id] + options, asUser: "nobody")
            guard installed.status == 0 else { throw TestFailure("install as nobody: \(installed.stderr)") }
        }
        return cli
    }

    static func held(_ line: String) -> Int { Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1 }

    /// A fork flood stops at the app's tasks budget; meanwhile another app of the same user
    /// starts 200 processes, and `app state` says which mechanism holds the limit.
    func forkFlood(_ cli: CLI, asUser user: String?, mechanism: String) throws {
        let hostile = try Self.run(cli, "com.example.hostile", ["fork"], asUser: user)
        let line = try hostile.line
        // 32 tasks in the sandbox: the app, the sandbox's init, and the rest children.
        #expect((20...31).contains(Self.held(line)) && line.hasSuffix("Resource temporarily unavailable"), "\(line)")
        let state = try cli.run(["app", "state", "com.example.hostile", "--json"], asUser: user)
        #expect(state.out.contains("tasks 32 (\(mechanism))"), "\(state.out) \(state.stderr)")
        let other = try Self.run(cli, "com.example.other", ["some", "200"], asUser: user)
        #expect(try other.line == "held 200 -", "another app is not held to the hostile one's budget")
        #expect(other.finish() == 0)
        #expect(hostile.finish() == 0)
    }

    @Test(.enabled(if: getuid() == 0, "root's apps are held by a pids cgroup"))
    func aForkFloodAsRootStopsAtTheAppsPidsCgroup() throws {
        let world = try AppWorld.make()
        try world.install("com.example.hostile", ["--tasks-max", "32"])
        try world.install("com.example.other")
        try forkFlood(world.cli, asUser: nil, mechanism: "pids cgroup")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to become nobody"))
    func aForkFloodAsAnOrdinaryUserStopsAtTheAppsUserNamespace() throws {
        let cli = try Self.nobodysWorld(installing: [("com.example.hostile", ["--tasks-max", "32"]), ("com.example.other", [])])
        try forkFlood(cli, asUser: "nobody", mechanism: "user namespace")
    }

    /// The app takes a quarter of the user's inotify instances at most; the user's desktop (this
    /// process) and another app still make theirs.
    @Test(.enabled(if: getuid() == 0, "needs root to become nobody"))
    func anInotifyFloodTakesOnlyTheAppsShare() throws {
        let cli = try Self.nobodysWorld(installing: [("com.example.hostile", []), ("com.example.other", [])])
        let budget = max(8, (Int((try? String(contentsOfFile: "/proc/sys/fs/inotify/max_user_instances", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 128) / 4)
        let hostile = try Self.run(cli, "com.example.hostile", ["inotify"], asUser: "nobody")
        let line = try hostile.line
        #expect(Self.held(line) == budget && line.hasSuffix("Too many open files"), "\(line); budget \(budget)")
        let other = try Self.run(cli, "com.example.other", ["inotify"], asUser: "nobody")
        #expect(Self.held(try other.line) == budget, "another app gets its own budget")
        // The user, outside every app, still has instances (Python as nobody, as a desktop would).
        let host = try ChildProcess.run("/usr/bin/setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c",
            "import ctypes; libc = ctypes.CDLL(None); print(sum(1 for _ in range(8) if libc.inotify_init1(0) >= 0))"])
        #expect(host.out == "8\n", "\(host.out) \(host.err)")
        #expect(other.finish() == 0 && hostile.finish() == 0)
    }

    static var memoryCgroupAvailable: Bool {
        guard getuid() == 0 else { return false }
        let cgroups = (try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)) ?? ""
        if cgroups.split(separator: "\n").contains(where: { $0.contains(":memory:") }) { return true }   // a v1 hierarchy
        let own = cgroups.split(separator: "\n").first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) } ?? "/"
        let control = (try? String(contentsOfFile: "/sys/fs/cgroup" + (own == "/" ? "" : own) + "/cgroup.subtree_control", encoding: .utf8)) ?? ""
        return control.contains("memory")
    }

    /// An app going over its memory limit is ended by the kernel, and `app run` says why; another
    /// app using more than that limit runs on.
    @Test(.enabled(if: memoryCgroupAvailable, "needs a memory cgroup (root)"))
    func anAppOverItsMemoryLimitIsEndedAndOthersRunOn() throws {
        let world = try AppWorld.make()
        try world.install("com.example.hostile", ["--memory-max", "64M"])
        try world.install("com.example.other")
        let info = try world.dpctl(["app", "info", "com.example.hostile"])
        #expect(info.out.contains("limits:           1024 tasks, 64 MiB of memory"), "\(info.out)")
        let other = try Self.run(world.cli, "com.example.other", ["memory", "128"])
        #expect(try other.line == "held 128 -")
        let hostile = try Self.run(world.cli, "com.example.hostile", ["memory", "256"])
        #expect(try hostile.line == "", "ended before it could say it held anything")
        #expect(hostile.finish() == 137)
        #expect(hostile.errorText.contains("com.example.hostile was ended by the kernel: it went over its memory limit (64 MiB)"), "\(hostile.errorText)")
        #expect(other.finish() == 0)
        let refused = try world.dpctl(["app", "install", "com.example.tiny", "--memory-max", "1M"])
        #expect(refused.status != 0 && refused.stderr.contains("the memory limit 1 MiB is outside 16 MiB"), "\(refused.stderr)")
        let nonsense = try world.dpctl(["app", "install", "com.example.tiny", "--memory-max", "lots"])
        #expect(nonsense.status != 0 && nonsense.stderr.contains("expected a size such as 512M"), "\(nonsense.stderr)")
    }
}
