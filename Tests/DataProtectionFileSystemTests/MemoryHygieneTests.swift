import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Root (to read every process's memory), and what an ordinary user's mount needs.
let memoryHygieneTestsCanRun: Bool = {
    var st = stat()
    return geteuid() == 0 && stat("/dev/fuse", &st) == 0 && st.st_mode & 0o006 == 0o006
        && FileManager.default.isExecutableFile(atPath: "/usr/bin/fusermount3") && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")
}()

/// What a lock leaves in the memory of the processes that served class-A data, judged as an
/// attacker would: the mount run by an ordinary user (`nobody`), another process of that user
/// trying to read its memory, and root reading all of it after lock + grace.
@Suite(.serialized, .enabled(if: memoryHygieneTestsCanRun, "needs root, /dev/fuse open to every user, fusermount3 and setpriv"))
struct MemoryHygieneTests {

    static let user: uid_t = 65534   // nobody

    /// `ARGV…` as `nobody`, with `environment`.
    static func asUser(_ arguments: [String]) -> [String] {
        ["--reuid=\(user)", "--regid=\(user)", "--clear-groups"] + arguments
    }

    /// How many times `marker` occurs in the readable memory of process `pid` (read as root).
    static func occurrences(of marker: String, inProcess pid: pid_t) throws -> Int {
        let script = """
            import sys
            pid, marker = int(sys.argv[1]), sys.argv[2].encode()
            count = 0
            with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb", 0) as mem:
                for line in maps:
                    parts = line.split()
                    if "r" not in parts[1]: continue
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    try:
                        mem.seek(start); count += mem.read(end - start).count(marker)
                    except OSError: pass
            print(count)
            """
        let run = try ChildProcess.run("/usr/bin/python3", ["-c", script, String(pid), marker])
        guard run.status == 0, let count = Int(run.out.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw TestFailure("memory scan of \(pid): \(run.err)")
        }
        return count
    }

    @Test func noClassAPlaintextOrReadableMemoryAfterLockAndGrace() throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("dp-memory-\(UUID().uuidString)").path
        defer { _ = try? ChildProcess.run("/bin/rm", ["-rf", base]) }
        for directory in ["", "/data", "/mnt", "/run"] {
            try FileManager.default.createDirectory(atPath: base + directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        try Data("123456".utf8).write(to: URL(fileURLWithPath: base + "/passcode"))
        #expect(chown(base, Self.user, Self.user) == 0)
        for item in ["/data", "/mnt", "/run", "/passcode"] { #expect(chown(base + item, Self.user, Self.user) == 0) }
        let environment = ["XDG_RUNTIME_DIR": base + "/run", "HOME": base]
        let dpctl = CLI.executable.path
        func run(_ arguments: [String]) throws -> ChildProcess {
            try ChildProcess.run("/usr/bin/setpriv", Self.asUser(arguments), environment: environment)
        }
        #expect(try run([dpctl, "--root", base + "/root", "init", "--passcode-file", base + "/passcode"]).status == 0)
        #expect(try run([dpctl, "--root", base + "/root", "policy", "--grace-period", "0", "--passcode-file", base + "/passcode"]).status == 0)

        // The mount, as nobody, with no keybagd running: it starts one and unlocks it.
        let mount = Process()
        mount.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        mount.arguments = Self.asUser([dpctl, "--root", base + "/root", "mount", base + "/data", base + "/mnt", "--passcode-file", base + "/passcode"])
        mount.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let errors = Pipe()
        mount.standardError = errors
        mount.standardOutput = FileHandle.nullDevice
        try mount.run()
        defer {
            if mount.isRunning {
                _ = try? run([dpctl, "--root", base + "/root", "umount", base + "/mnt"])
                kill(mount.processIdentifier, SIGKILL)
                mount.waitUntilExit()
            }
        }
        let log = try readUntilMountServes(errors.fileHandleForReading.fileDescriptor).joined(separator: "\n")
        #expect(log.contains("started one for this mount"), "\(log)")
        let reader = PipeReader(errors.fileHandleForReading)

        let marker = "MARKER-\(UInt32.random(in: 0...UInt32.max))-"
        // A program writes and reads a class-A file in pieces small and large, and holds it open
        // (and mapped) across the lock.
        let program = Process()
        program.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        program.arguments = Self.asUser(["/usr/bin/python3", "-c", """
            import mmap, os, sys
            mnt, marker = sys.argv[1], sys.argv[2].encode()
            os.mkdir(mnt + "/a")
            os.setxattr(mnt + "/a", "user.dataprotection.class", b"complete")
            with open(mnt + "/a/secret", "wb") as f: f.write(marker * 3000)
            with open(mnt + "/a/big", "wb") as f: f.write(marker * 200000)
            fd = os.open(mnt + "/a/secret", os.O_RDWR)
            for i in range(200):
                os.pwrite(fd, marker * (1 + i % 60), (i * 7919) % 40000)
                os.pread(fd, 1 + (i * 131) % 9000, (i * 104729) % 40000)
            mapped = mmap.mmap(fd, 0); mapped[0:len(marker)] = marker; mapped.flush()
            print(open(mnt + "/a/big", "rb").read().count(marker) == 200000, flush=True)
            sys.stdin.readline()
            # After the lock: a write refused (EACCES) leaves nothing of its bytes behind either.
            try: os.pwrite(fd, marker.replace(b"MARKER", b"LATE") * 500, 0); print("written", flush=True)
            except OSError as e: print(e.errno == 13, flush=True)
            sys.stdin.readline()
            """, base + "/mnt", marker])
        program.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let programInput = Pipe(), programOutput = Pipe()
        program.standardInput = programInput
        program.standardOutput = programOutput
        try program.run()
        #expect(try readLine(programOutput.fileHandleForReading.fileDescriptor, timeout: 60) == "True")

        // Another process of the same user cannot read the server's memory, nor its keybagd's.
        let keybagd = try ChildProcess.run("/usr/bin/pgrep", ["-f", "keybagd --root \(base)/root"]).out
            .split(separator: "\n").compactMap { pid_t($0) }
        #expect(keybagd.count == 1)
        for pid in [mount.processIdentifier] + keybagd {
            let peek = try run(["/usr/bin/python3", "-c", """
                import sys
                try:
                    with open("/proc/%s/mem" % sys.argv[1], "rb") as mem: print("read")
                except OSError as e: print("refused")
                """, String(pid)])
            #expect(peek.out == "refused\n", "process \(pid): \(peek.out) \(peek.err)")
        }

        // Lock; with a grace period of 0 class A goes at once. Once the mount refuses the file,
        // no copy of its plaintext is left in the server's memory (nor was one ever in keybagd's).
        #expect(try run([dpctl, "--root", base + "/root", "lock"]).status == 0)
        var refused = false
        for _ in 0..<2000 where !refused {
            refused = try run(["/bin/cat", base + "/mnt/a/secret"]).status != 0
        }
        #expect(refused, "class A refused after the lock")
        #expect(try Self.occurrences(of: marker, inProcess: mount.processIdentifier) == 0, "plaintext left in the mount's memory")
        try programInput.fileHandleForWriting.write(contentsOf: Data("write\n".utf8))
        #expect(try readLine(programOutput.fileHandleForReading.fileDescriptor, timeout: 60) == "True", "a write after the lock is refused")
        let late = marker.replacingOccurrences(of: "MARKER", with: "LATE")
        #expect(try Self.occurrences(of: late, inProcess: mount.processIdentifier) == 0, "a refused write's bytes left in the mount's memory")
        for pid in keybagd { #expect(try Self.occurrences(of: marker, inProcess: pid) == 0, "plaintext in keybagd's memory") }

        try programInput.fileHandleForWriting.close()
        program.waitUntilExit()
        #expect(try run([dpctl, "--root", base + "/root", "umount", base + "/mnt"]).status == 0)
        mount.waitUntilExit()
        _ = reader.result()
        // The keybagd started for the mount ended with it.
        #expect(keybagd.allSatisfy { kill($0, 0) != 0 }, "keybagd stopped with the mount")
    }
}
