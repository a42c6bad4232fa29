import DataProtectionTestSupport
import Foundation
import Testing

/// The sandbox attacked from inside by a real hostile app (Python calling the kernel directly
/// through ctypes): what iOS would never give an app stays out of reach.
@Suite struct SandboxHardeningTests {
    /// Calls the kernel as a hostile app would and prints, for each attempt, the errno it got
    /// ("ok" when the call succeeded). x86-64 system-call numbers.
    static let hostileApp = """
        import ctypes, json, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        def call(*args):
            ctypes.set_errno(0)
            r = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
            return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
        out = {}
        SESSION = -3
        out["keyctl search"] = call(250, 10, SESSION, b"user", b"dp-test-key", 0)
        out["keyctl read user keyring"] = call(250, 11, -4, 0, 0)
        out["add_key"] = call(248, b"user", b"planted-by-app", b"evil", 4, SESSION)
        out["request_key"] = call(249, b"user", b"dp-test-key", None, 0)
        out["unshare user"] = call(272, 0x10000000)
        out["unshare net+mount"] = call(272, 0x40000000 | 0x00020000)
        out["setns"] = call(308, 0, 0)
        out["mount"] = call(165, b"none", b"/tmp", b"tmpfs", 0, None)
        out["ptrace"] = call(101, 16, 1, 0, 0)
        out["perf_event_open"] = call(298, None, 0, -1, -1, 0)
        out["bpf"] = call(321, 0, None, 0)
        out["userfaultfd"] = call(323, 0)
        out["io_uring_setup"] = call(425, 1, None)
        out["personality bsd"] = call(135, 0x0006)
        out["clone3"] = call(435, None, 0)
        pid = libc.syscall(ctypes.c_long(56), ctypes.c_long(0x40000000 | 17), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
        if pid == 0:
            os._exit(0)
        out["clone newnet"] = "ok" if pid > 0 else os.strerror(ctypes.get_errno())
        if pid > 0:
            os.waitpid(pid, 0)
        child = os.fork()
        if child == 0:
            os._exit(0)
        out["fork"] = "ok" if os.waitpid(child, 0)[1] == 0 else "failed"
        out["plain work"] = "ok" if open("/etc/hostname" if os.path.exists("/etc/hostname") else "/proc/self/status").read() is not None else "failed"
        print(json.dumps(out, sort_keys=True))
        """

    /// Starts `dpctl app run ID -- python3 -c HOSTILE` from a session keyring of its own that holds
    /// a key, then checks the key from outside: unchanged, nothing linked beside it.
    static let launcher = """
        import ctypes, subprocess, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        def call(*args): return libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        assert call(250, 1, b"dp-test-session") >= 0                          # KEYCTL_JOIN_SESSION_KEYRING
        key = call(248, b"user", b"dp-test-key", b"kerberos ticket", 15, -3)   # add_key into it
        assert key >= 0
        app = subprocess.run(sys.argv[1:], capture_output=True, text=True)
        sys.stdout.write(app.stdout)
        sys.stderr.write(app.stderr)
        buf = ctypes.create_string_buffer(64)
        n = call(250, 11, key, buf, 64)                                         # KEYCTL_READ
        found = call(250, 10, -3, b"user", b"planted-by-app", 0)                # KEYCTL_SEARCH
        print("host: payload=%s planted=%s" % (buf.raw[:n].decode() if n >= 0 else "?", "yes" if found >= 0 else "no"))
        sys.exit(app.returncode)
        """

    @Test func theKernelsDangerousCallsAndTheUsersKeyringAreOutOfReach() throws {
        let world = try AppWorld.make()
        try world.install("com.example.hostile")
        let run = try ChildProcess.run("python3", ["-c", Self.launcher, CLI.executable.path, "--root", world.cli.root,
                                                    "app", "run", "com.example.hostile", "--", "/usr/bin/python3", "-c", Self.hostileApp])
        #expect(run.status == 0, "\(run.err)")
        let lines = run.out.split(separator: "\n")
        let json = try #require(lines.first { $0.hasPrefix("{") })
        let results = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: String])
        let permission = "Operation not permitted"
        for call in ["keyctl search", "keyctl read user keyring", "add_key", "request_key", "unshare user", "unshare net+mount", "setns",
                     "mount", "ptrace", "perf_event_open", "bpf", "userfaultfd", "io_uring_setup", "clone newnet"] {
            #expect(results[call] == permission, "\(call): \(results[call] ?? "missing")")
        }
        #expect(results["personality bsd"] == "Invalid argument")
        #expect(results["clone3"] == "Function not implemented")
        #expect(results["fork"] == "ok" && results["plain work"] == "ok", "an ordinary program must still run: \(results)")
        // From the host: the user's key is as it was, and nothing was linked beside it.
        #expect(lines.contains("host: payload=kerberos ticket planted=no"), "\(run.out)")
    }

    @Test func ordinaryProgramsStillRunUnderTheFilter() throws {
        let world = try AppWorld.make()
        try world.install("com.example.plain")
        let shell = try world.shell("com.example.plain", "echo hi > Documents/a && cat Documents/a && ls Documents >/dev/null && sleep 0 && echo done")
        #expect(shell.status == 0 && shell.out == "hi\ndone\n", "\(shell.stderr)")
        let python = try world.dpctl(["app", "run", "com.example.plain", "--passcode-file", world.passcode, "--", "/usr/bin/python3", "-c",
                                      "import sqlite3, subprocess, threading; c = sqlite3.connect('Documents/d.db'); c.execute('create table t(x)'); "
                                      + "t = threading.Thread(target=lambda: None); t.start(); t.join(); print(subprocess.run(['true']).returncode)"])
        #expect(python.status == 0 && python.out == "0\n", "\(python.stderr)")
    }
}

/// What one app does must not cost the supervisor — outside the sandbox and the app's cgroup —
/// memory that grows with it.
@Suite struct SupervisorBoundsTests {
    /// Opens a lifecycle channel through the supervisor socket, sends `count` sleep requests far
    /// in the future, waits until the supervisor has read them all (a `state` request answered
    /// after them), says "flooded" and waits for its standard input to close.
    static let flood = """
        import os, socket, struct, sys
        def frame(p): return struct.pack(">I", len(p)) + p
        def read_frame(s):
            n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
            return s.recv(n, socket.MSG_WAITALL)
        supervisor = socket.socket(fileno=int(os.environ["DATAPROTECTION_SUPERVISOR_FD"]))
        supervisor.sendall(frame(bytes([1, 3, 2])))
        message, ancillary, _, _ = supervisor.recvmsg(16, socket.CMSG_LEN(4))
        assert message == b"\\x00", message
        channel = socket.socket(fileno=struct.unpack("i", ancillary[0][2][:4])[0])
        batch = frame(bytes([1, 6]) + struct.pack(">d", 4e9)) * 1000
        try:
            for _ in range(int(sys.argv[1]) // 1000):
                channel.sendall(batch)
        except OSError:
            pass
        try:
            channel.sendall(frame(bytes([1, 5])))   # now: answered once every sleep before it was read
            read_frame(channel)
        except (OSError, struct.error):
            pass                                     # or the supervisor closed the channel: also bounded
        print("flooded", flush=True)
        sys.stdin.read()
        """

    static func residentKiB(_ pid: Int32) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    @Test func aFloodOfSleepsLeavesTheSupervisorsMemoryAsItWas() throws {
        let world = try AppWorld.make()
        try world.install("com.example.flood")
        var rss: [Int] = []
        for count in [1_000, 200_000] {
            let process = Process()
            process.executableURL = CLI.executable
            process.arguments = ["--root", world.cli.root, "app", "run", "com.example.flood", "--", "/usr/bin/python3", "-c", Self.flood, String(count)]
            let out = Pipe(), input = Pipe()
            process.standardOutput = out
            process.standardInput = input
            try process.run()
            let said = String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
            #expect(said == "flooded\n", "\(said)")
            rss.append(Self.residentKiB(process.processIdentifier))
            try input.fileHandleForWriting.close()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
        }
        // 200,000 sleeps kept as tasks cost the supervisor hundreds of megabytes.
        #expect(rss[1] - rss[0] < 10_000, "the supervisor grew from \(rss[0]) KiB to \(rss[1]) KiB")
    }
}

/// A 200-byte file must not cost the audit minutes and gigabytes.
@Suite struct AuditBoundsTests {
    @Test func aPropertyListOfSharedReferencesIsTooComplexNotEndless() throws {
        let world = try AppWorld.make()
        try world.install("com.example.bomb", ["--group", "group.com.example.bomb"])
        let group = try world.groupContainer(of: "com.example.bomb", "group.com.example.bomb")
        let plist = group + "/Library/Preferences/group.com.example.bomb.plist"
        // {k0: d, k1: d} twenty levels deep, each dictionary written once: 2^20 key paths.
        let made = try ChildProcess.run("python3", ["-c", """
            import plistlib, sys
            d = {"password": "hunter2"}
            for _ in range(20): d = {"k0": d, "k1": d}
            open(sys.argv[1], "wb").write(plistlib.dumps(d, fmt=plistlib.FMT_BINARY))
            """, plist])
        #expect(made.status == 0, "\(made.err)")
        let size = (try FileManager.default.attributesOfItem(atPath: plist)[.size] as? Int) ?? 0
        #expect(size < 1_000)

        let audit = Process()
        audit.executableURL = CLI.executable
        audit.arguments = ["--root", world.cli.root, "audit", group]
        let out = Pipe()
        audit.standardOutput = out
        try audit.run()
        let reader = PipeReader(out.fileHandleForReading)
        let finished = DispatchSemaphore(value: 0)
        Thread { audit.waitUntilExit(); finished.signal() }.start()
        let inTime = finished.wait(timeout: .now() + .seconds(60)) == .success
        if !inTime { kill(audit.processIdentifier, SIGKILL); audit.waitUntilExit() }
        #expect(inTime, "the audit of a \(size)-byte file ran for a minute")
        let report = String(decoding: reader.result(), as: UTF8.self)
        #expect(audit.terminationStatus == 6, "\(report)")
        #expect(report.contains("too complex to scan"), "\(report)")
        #expect(report.contains("DP403"))
    }
}

/// A member app rewrote `user.dataprotection.class` on the group's directory (Landlock does not
/// mediate setxattr), and another member's new files were written in class D: now the file
/// system refuses it, and new files keep the class the user chose either way.
@Suite struct ClassFloorTests {
    /// The one file allowed below a class-A floor is a database's WAL index (class C: SQLite maps
    /// it, and class A's lock would revoke it). An app cannot use that to lower anything else:
    /// a file named `NAME-shm` cannot be renamed or linked to another name, and a class-A file
    /// renamed or linked to such a name is never lowered (only a lone link, beside a protected
    /// `NAME`, whose content is a WAL index's, opened for writing).
    @Test func anAppCannotLowerAFileThroughTheWALIndexRule() throws {
        let world = try AppWorld.make()
        let app = try world.install("com.example.shm", ["--default-protection", "complete"])
        let docs = app + "/Documents"
        let attempts = try world.shell("com.example.shm", """
            cd Documents
            c() { getfattr --only-values -n user.dataprotection.class "$1"; echo; }
            echo a > x && echo secret > x-shm && c x-shm
            mv x-shm notes.txt 2>/dev/null && echo renamed || echo "rename refused"
            ln x-shm linked.txt 2>/dev/null && echo linked || echo "link refused"
            echo s3 > z && mv z z-shm && cat z-shm >/dev/null && echo more >> z-shm && mv z-shm z && c z
            echo s4 > w && ln w w2-shm && echo more >> w2-shm && c w
            echo d > y && echo s5 > y-shm.txt && mv y-shm.txt y-shm && echo more >> y-shm && c y-shm
            """, extra: ["--passcode-file", world.passcode])
        #expect(attempts.out == "until-first-unlock\nrename refused\nlink refused\ncomplete\ncomplete\ncomplete\n",
                "\(attempts.out) \(attempts.stderr)")
        for name in ["x", "z", "w", "y", "y-shm"] {
            #expect(try world.dpctl(["ls", docs + "/" + name]).out.contains("complete (A)"), "\(name)")
        }
        #expect(!FileManager.default.fileExists(atPath: docs + "/notes.txt") && !FileManager.default.fileExists(atPath: docs + "/linked.txt"))
    }

    @Test func anAppCannotLowerTheClassTheUserChose() throws {
        let world = try AppWorld.make()
        let group = "group.com.example.floor"
        let a = try world.install("com.example.lowerer", ["--group", group, "--default-protection", "complete"])
        try world.install("com.example.victim", ["--group", group])
        #expect(try world.dpctl(["group", "set-protection", group, "complete"]).status == 0)
        let shared = try world.groupContainer(of: "com.example.victim", group)
        let unlock = ["--passcode-file", world.passcode]

        // The hostile member tries to lower the group's root, its Library, and its own Documents:
        // the file system refuses a class below the one the user chose.
        let lowered = try world.dpctl(["app", "run", "com.example.lowerer"] + unlock + ["--", "/usr/bin/python3", "-c", """
            import errno, os, sys
            for path in sys.argv[1:]:
                try: os.setxattr(path, "user.dataprotection.class", b"none"); print("lowered")
                except OSError as e: print(errno.errorcode[e.errno])
            """, shared, shared + "/Library", a + "/Documents"])
        #expect(lowered.out == "EPERM\nEPERM\nEPERM\n", "\(lowered.out) \(lowered.stderr)")

        // The other member's new file in the group, and the hostile app's own new file, keep the
        // classes the user chose.
        let written = try world.testApp("com.example.victim", ["write", shared + "/Library/note.txt", "shared note"], extra: unlock)
        #expect(written.out.contains("class complete"), "\(written.out) \(written.stderr)")
        let own = try world.testApp("com.example.lowerer", ["write", a + "/Documents/own.txt", "own note"], extra: unlock)
        #expect(own.out.contains("class complete"), "\(own.out) \(own.stderr)")
        #expect(try world.dpctl(["ls", shared + "/Library/note.txt"]).out.contains("complete (A)"))
        // What the device reports of the group stays the user's choice.
        let info = try JSONSerialization.jsonObject(with: try world.dpctl(["app", "info", "com.example.victim", "--json"]).stdout) as? [String: Any]
        let groups = info?["groups"] as? [[String: Any]] ?? []
        #expect(groups.first?["defaultProtection"] as? String == "complete", "\(groups)")
    }
}

/// An app made set-user-ID files, FIFOs and sockets in its container, and the audit said nothing.
@Suite struct SpecialFilesTests {
    static let attempts = """
        import json, os, socket
        out = {}
        def attempt(name, body):
            try:
                body(); out[name] = "ok"
            except OSError as error:
                out[name] = os.strerror(error.errno)
        open("Documents/tool", "w").write("#!/bin/sh\\n")
        attempt("chmod setuid", lambda: os.chmod("Documents/tool", 0o4755))
        attempt("chmod setgid", lambda: os.chmod("Documents/tool", 0o2755))
        attempt("create setuid", lambda: os.close(os.open("Documents/made", os.O_CREAT | os.O_WRONLY, 0o6755)))
        attempt("mkdir setgid", lambda: os.mkdir("Documents/dir", 0o2755))
        attempt("fifo in Documents", lambda: os.mkfifo("Documents/fifo"))
        attempt("socket in Library", lambda: socket.socket(socket.AF_UNIX).bind("Library/sock"))
        attempt("fifo in tmp", lambda: os.mkfifo("tmp/fifo"))
        attempt("socket in tmp", lambda: socket.socket(socket.AF_UNIX).bind("tmp/sock"))
        attempt("plain chmod", lambda: os.chmod("Documents/tool", 0o755))
        print(json.dumps(out, sort_keys=True))
        """

    @Test func noSetIDFilesNorSpecialFilesAmongDataAndTheAuditSeesThem() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.special")
        let run = try world.dpctl(["app", "run", "com.example.special", "--passcode-file", world.passcode, "--", "/usr/bin/python3", "-c", Self.attempts])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try JSONSerialization.jsonObject(with: run.stdout) as? [String: String], "\(run.out)")
        for refused in ["chmod setuid", "chmod setgid", "create setuid", "mkdir setgid"] {
            #expect(results[refused] == "Operation not permitted", "\(refused): \(results[refused] ?? "-")")
        }
        for refused in ["fifo in Documents", "socket in Library"] {
            #expect(results[refused] == "Permission denied", "\(refused): \(results[refused] ?? "-")")
        }
        for allowed in ["fifo in tmp", "socket in tmp", "plain chmod"] {
            #expect(results[allowed] == "ok", "\(allowed): \(results[allowed] ?? "-")")
        }
        // What something outside the sandbox leaves there, the audit reports (tmp aside).
        #expect(mkfifo(container + "/Library/planted-fifo", 0o600) == 0)
        try Data("#!/bin/sh\n".utf8).write(to: URL(fileURLWithPath: container + "/Documents/planted"))
        #expect(chmod(container + "/Documents/planted", 0o4700) == 0)
        let audit = try world.dpctl(["audit", container]).out
        #expect(audit.contains("DP604") && audit.contains("Library/planted-fifo") && audit.contains("Documents/planted"), "\(audit)")
        #expect(!audit.contains("tmp/fifo"), "\(audit)")
        #expect([0, 6].contains(try world.dpctl(["audit", container, "--fix", "--passcode-file", world.passcode]).status))
        var st = stat()
        #expect(stat(container + "/Documents/planted", &st) == 0 && st.st_mode & 0o6000 == 0)
    }
}

/// Every run left one empty cgroup behind: its last processes were still exiting when the
/// supervisor tried to remove it.
@Suite struct CgroupCleanupTests {
    static var cgroupHome: String? {
        guard let mounts = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8),
              let line = mounts.split(separator: "\n").first(where: { $0.split(separator: " ").dropFirst(2).first == "cgroup2" }) else { return nil }
        let mount = String(line.split(separator: " ")[1])
        let own = (try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8))?.split(separator: "\n")
            .first { $0.hasPrefix("0::") }.map { String($0.dropFirst(3)) } ?? "/"
        let home = mount + (own == "/" ? "" : own)
        return access(home, W_OK) == 0 ? home : nil
    }

    @Test(.enabled(if: cgroupHome != nil, "needs a writable cgroup v2 (root, or a delegated subtree)"))
    func noCgroupIsLeftBehindByARun() throws {
        let world = try AppWorld.make()
        try world.install("com.example.cgroup")
        let info = try JSONSerialization.jsonObject(with: try world.dpctl(["app", "info", "com.example.cgroup", "--json"]).stdout) as? [String: Any]
        let uuid = try #require(info?["uuid"] as? String)
        let home = try #require(Self.cgroupHome)
        for _ in 0..<5 {
            // A child still alive when the app's first process ends: the cgroup is busy a moment longer.
            let run = try world.shell("com.example.cgroup", "sleep 5 & exit 0")
            #expect(run.status == 0, "\(run.stderr)")
        }
        let left = try FileManager.default.contentsOfDirectory(atPath: home).filter { $0.hasPrefix("dataprotection-\(uuid)-") }
        #expect(left.isEmpty, "left behind: \(left)")
    }
}

/// With Landlock ABI 6 the sandbox kept the host's network namespace: an app reached a
/// loopback-only service of the host, read the host's /proc/net, and bound an abstract name a
/// host process then trusted.
@Suite struct NetworkIsolationTests {
    /// The host's side: a TCP service on 127.0.0.1 and an abstract Unix socket, each counting the
    /// connections it gets; prints its port, then serves until its standard input closes.
    static let hostServices = """
        import os, socket, sys, threading
        tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen(8)
        abstract = socket.socket(socket.AF_UNIX); abstract.bind(b"\\0" + sys.argv[1].encode()); abstract.listen(8)
        counts = {"tcp": 0, "abstract": 0}
        def serve(s, name):
            while True:
                c, _ = s.accept(); counts[name] += 1; c.close()
        for s, name in ((tcp, "tcp"), (abstract, "abstract")):
            threading.Thread(target=serve, args=(s, name), daemon=True).start()
        print(tcp.getsockname()[1], flush=True)
        sys.stdin.read()
        print("tcp=%d abstract=%d" % (counts["tcp"], counts["abstract"]), flush=True)
        """

    static let hostileApp = """
        import json, os, socket, sys
        port, name = int(sys.argv[1]), sys.argv[2]
        out = {}
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close(); out["tcp"] = "reached"
        except OSError as error:
            out["tcp"] = os.strerror(error.errno) if error.errno else str(error)
        try:
            s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(b"\\0" + name.encode()); out["abstract"] = "reached"
        except OSError as error:
            out["abstract"] = os.strerror(error.errno) if error.errno else str(error)
        out["proc net unix"] = "seen" if name in open("/proc/net/unix").read() else "not seen"
        out["interfaces"] = sorted(n for _, n in socket.if_nameindex())
        print(json.dumps(out, sort_keys=True))
        """

    @Test func anAppReachesNoHostServiceAndSeesNoHostSocket() throws {
        let world = try AppWorld.make()
        try world.install("com.example.netprobe")
        let name = "dp-host-service-\(UUID().uuidString.prefix(8))"
        let host = Process()
        host.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        host.arguments = ["-c", Self.hostServices, name]
        let out = Pipe(), input = Pipe()
        host.standardOutput = out
        host.standardInput = input
        try host.run()
        let reader = out.fileHandleForReading
        let port = try #require(Int(String(decoding: reader.availableData, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))

        let probe = try world.dpctl(["app", "run", "com.example.netprobe", "--", "/usr/bin/python3", "-c", Self.hostileApp, String(port), name])
        try input.fileHandleForWriting.close()
        let served = String(decoding: reader.readDataToEndOfFile(), as: UTF8.self)
        host.waitUntilExit()
        #expect(probe.status == 0, "\(probe.stderr)")
        let results = try #require(try JSONSerialization.jsonObject(with: probe.stdout) as? [String: Any], "\(probe.out)")
        #expect(results["tcp"] as? String != "reached" && results["abstract"] as? String != "reached", "\(results)")
        #expect(results["proc net unix"] as? String == "not seen")
        #expect(results["interfaces"] as? [String] == ["lo"], "\(results)")
        // From the host's side: nobody connected.
        #expect(served.contains("tcp=0 abstract=0"), "\(served)")
    }
}

/// The network entitlement (off by default): the app reaches the outside world through
/// user-mode networking, never the host's loopback services. "The outside world" is a host of
/// the test's own, in a network namespace it makes.
@Suite(.serialized) struct NetworkEntitlementTests {
    static var canRun: Bool {
        getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/slirp4netns") && FileManager.default.isExecutableFile(atPath: "/usr/sbin/ip")
    }

    @discardableResult
    static func sh(_ script: String) throws -> ChildProcess { try ChildProcess.run("/bin/sh", ["-c", script]) }

    static let probe = """
        import json, os, socket, sys
        def attempt(host, port):
            try:
                socket.create_connection((host, port), timeout=5).close(); return "reached"
            except OSError as error:
                return os.strerror(error.errno) if error.errno else "timed out"
        print(json.dumps({"outside": attempt(sys.argv[1], int(sys.argv[2])),
                          "host loopback": attempt("10.0.2.2", int(sys.argv[3])),
                          "interfaces": sorted(n for _, n in socket.if_nameindex())}, sort_keys=True))
        """

    @Test(.enabled(if: canRun, "needs root, ip (iproute2) and slirp4netns"))
    func withTheEntitlementAnAppReachesTheOutsideButNeverTheHostLoopback() throws {
        let tag = String(UUID().uuidString.prefix(6)).lowercased()
        let namespace = "dp-out-\(tag)", hostEnd = "dpa\(tag)", outsideEnd = "dpb\(tag)"
        let setUp = try Self.sh("""
            set -e
            ip netns add \(namespace)
            ip link add \(hostEnd) type veth peer name \(outsideEnd)
            ip link set \(outsideEnd) netns \(namespace)
            ip addr add 10.213.77.1/30 dev \(hostEnd) && ip link set \(hostEnd) up
            ip netns exec \(namespace) ip addr add 10.213.77.2/30 dev \(outsideEnd)
            ip netns exec \(namespace) ip link set \(outsideEnd) up
            ip netns exec \(namespace) ip link set lo up
            """)
        defer { _ = try? Self.sh("ip netns del \(namespace); ip link del \(hostEnd) 2>/dev/null; true") }
        try #require(setUp.status == 0, "\(setUp.err)")
        // A service on the outside host, and one on the host's loopback.
        let server = "import socket, sys\ns = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8); print(s.getsockname()[1], flush=True)\nwhile True: s.accept()[0].close()"
        func serve(_ arguments: [String]) throws -> (Process, Int) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: arguments[0])
            process.arguments = Array(arguments.dropFirst())
            let out = Pipe()
            process.standardOutput = out
            try process.run()
            let port = Int(String(decoding: out.fileHandleForReading.availableData, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
            return (process, port)
        }
        let (outside, outsidePort) = try serve(["/usr/sbin/ip", "netns", "exec", namespace, "/usr/bin/python3", "-c", server, "10.213.77.2"])
        defer { kill(outside.processIdentifier, SIGKILL); outside.waitUntilExit() }
        let (loopback, loopbackPort) = try serve(["/usr/bin/python3", "-c", server, "127.0.0.1"])
        defer { kill(loopback.processIdentifier, SIGKILL); loopback.waitUntilExit() }
        #expect(outsidePort > 0 && loopbackPort > 0)

        let world = try AppWorld.make()
        try world.install("com.example.online", ["--network"])
        try world.install("com.example.offline")
        func run(_ id: String) throws -> [String: Any] {
            let result = try world.dpctl(["app", "run", id, "--", "/usr/bin/python3", "-c", Self.probe, "10.213.77.2", String(outsidePort), String(loopbackPort)])
            #expect(result.status == 0, "\(id): \(result.stderr)")
            return (try? JSONSerialization.jsonObject(with: result.stdout) as? [String: Any]) ?? [:]
        }
        let online = try run("com.example.online")
        #expect(online["outside"] as? String == "reached", "\(online)")
        #expect(online["host loopback"] as? String != "reached", "\(online)")
        #expect(online["interfaces"] as? [String] == ["lo", "tap0"], "\(online)")
        let offline = try run("com.example.offline")
        #expect(offline["outside"] as? String != "reached" && offline["host loopback"] as? String != "reached", "\(offline)")
        #expect(offline["interfaces"] as? [String] == ["lo"], "\(offline)")
        let info = try world.dpctl(["app", "info", "com.example.online"]).out
        #expect(info.contains("network:          yes"), "\(info)")
    }
}
