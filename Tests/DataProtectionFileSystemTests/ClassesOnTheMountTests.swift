import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The classes across a lock, on a mount following keybagd's lock state (a manual clock: the
/// grace period passes when the test says), with descriptors and maps a program opened before.
@Suite(.serialized, .enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct ClassesOnTheMountTests {
    /// A program holding files open: one command per line on standard input, one answer per line.
    /// `open NAME` (read-write), `create NAME` (new, then written), `read NAME`, `write NAME TEXT`
    /// (at offset 0), `map NAME`, `mapwrite NAME TEXT` (no msync), `mapread NAME` (in a child:
    /// SIGBUS shows as such), `reopen NAME` (a new open, closed at once), `cat NAME`.
    static let holder = """
        import errno, mmap, os, sys
        fds, maps = {}, {}
        def answer(text): print(text, flush=True)
        def err(e): return errno.errorcode.get(e.errno, str(e.errno))
        for line in sys.stdin:
            parts = line.rstrip("\\n").split(" ", 2)
            op, name = parts[0], parts[1]
            try:
                if op == "open": fds[name] = os.open(name, os.O_RDWR); answer("ok")
                elif op == "create":
                    fds[name] = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600); os.write(fds[name], parts[2].encode()); answer("ok")
                elif op == "read": answer(os.pread(fds[name], 64, 0).decode())
                elif op == "write": os.pwrite(fds[name], parts[2].encode(), 0); answer("ok")
                elif op == "map": maps[name] = mmap.mmap(fds[name], 0); answer("ok")
                elif op == "mapwrite": maps[name][0:len(parts[2])] = parts[2].encode(); answer("ok")
                elif op == "mapread":
                    pid = os.fork()
                    if pid == 0:
                        os.write(1, bytes(maps[name][0:5]) + b"\\n"); os._exit(0)
                    _, status = os.waitpid(pid, 0)
                    if os.WIFSIGNALED(status): answer("signal %d" % os.WTERMSIG(status))
                elif op == "reopen": os.close(os.open(name, os.O_RDONLY)); answer("ok")
                elif op == "cat": answer(open(name).read())
            except OSError as e:
                answer(err(e))
        """

    final class Holder {
        let process = Process()
        let input = Pipe(), output = Pipe()
        init(in directory: String) throws {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", ClassesOnTheMountTests.holder]
            process.currentDirectoryURL = URL(fileURLWithPath: directory)
            (process.standardInput, process.standardOutput) = (input, output)
            try process.run()
        }
        func send(_ command: String) throws -> String {
            try input.fileHandleForWriting.write(contentsOf: Data((command + "\n").utf8))
            return try readLine(output.fileHandleForReading.fileDescriptor, timeout: 60)
        }
        /// Asks `command` until it answers `expected` (the mount applies a lock a moment after
        /// the keybag discards the key): at most `attempts` times.
        func await(_ command: String, _ expected: String, attempts: Int = 2000) throws -> String {
            var last = ""
            for _ in 0..<attempts {
                last = try send(command)
                if last == expected { return last }
                usleep(1000)
            }
            return last
        }
        /// Ends the program (its descriptors and maps close: a lazily unmounted file system ends then).
        func close() {
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
        }
        deinit { close() }
    }

    /// A data root unlocked through its keybagd, and a mount following it.
    func setUp() throws -> (CLI, KeybagdProcess, MountedDirectory, String) {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "1234")
        guard try cli.run(["init", "--passcode-file", passcode]).status == 0 else { throw TestFailure("init") }
        let daemon = try KeybagdProcess(cli: cli)
        let unlocked = try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment)
        guard unlocked.status == 0 else { throw TestFailure("unlock: \(unlocked.stderr)") }
        let mount = try MountedDirectory(cli: cli, environment: daemon.environment)
        return (cli, daemon, mount, passcode)
    }

    func lockPastGrace(_ cli: CLI, _ daemon: KeybagdProcess) throws {
        #expect(try cli.run(["lock"], environment: daemon.environment).status == 0)
        try daemon.advance(3600, root: cli.root)
    }

    @Test func classAIsUnreadableThroughEveryPathAfterLockAndGraceAndKeepsDirtyPages() throws {
        let (cli, daemon, mount, passcode) = try setUp()
        defer { daemon.stop() }
        #expect(try mount.shell("mkdir a && setfattr -n user.dataprotection.class -v complete a").status == 0)
        let holder = try Holder(in: mount.mountPoint + "/a")
        #expect(try holder.send("create secret.txt class A secret, 4 KiB of it") == "ok")
        #expect(try holder.send("map secret.txt") == "ok")
        #expect(try holder.send("mapread secret.txt") == "class")
        #expect(try holder.send("mapwrite secret.txt DIRTY") == "ok")     // not synced: a dirty page at the lock
        #expect(try holder.send("read secret.txt") == "DIRTY A secret, 4 KiB of it")
        try lockPastGrace(cli, daemon)
        #expect(try holder.await("read secret.txt", "EACCES") == "EACCES", "a descriptor opened before the lock")
        #expect(try holder.send("mapread secret.txt") == "signal \(SIGBUS)", "a page mapped before the lock faults")
        #expect(try holder.send("reopen secret.txt") == "EACCES")
        #expect(try holder.send("write secret.txt late") == "EACCES")
        #expect(try mount.shell("cat a/secret.txt").status != 0)
        // After the next unlock: what the map wrote before the lock was kept.
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try holder.await("read secret.txt", "DIRTY A secret, 4 KiB of it") == "DIRTY A secret, 4 KiB of it")
        #expect(try holder.send("cat secret.txt") == "DIRTY A secret, 4 KiB of it")
        holder.close()
        try mount.unmount()
    }

    @Test func classBIsWritableWhileOpenAndCreatableWhileLockedButNotReopened() throws {
        let (cli, daemon, mount, passcode) = try setUp()
        defer { daemon.stop() }
        #expect(try mount.shell("mkdir b && setfattr -n user.dataprotection.class -v completeUnlessOpen b && echo closed-before > b/closed.txt").status == 0)
        let holder = try Holder(in: mount.mountPoint + "/b")
        #expect(try holder.send("create open.txt opened before the lock") == "ok")
        try lockPastGrace(cli, daemon)
        // A class-D neighbour shows the lock reached the mount; class B's open descriptor is unaffected.
        #expect(try holder.await("reopen closed.txt", "EACCES") == "EACCES", "an existing class-B file does not open while locked")
        #expect(try holder.send("read open.txt") == "opened before the lock")
        #expect(try holder.send("write open.txt written while the device was locked") == "ok")
        #expect(try holder.send("create new.txt made while locked") == "ok")
        #expect(try holder.send("read new.txt") == "made while locked")
        #expect(try holder.send("reopen new.txt") == "EACCES")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try holder.await("cat new.txt", "made while locked") == "made while locked")
        #expect(try holder.send("cat open.txt") == "written while the device was locked")
        holder.close()
        try mount.unmount()
    }

    @Test func classCOpensOnlyAfterTheFirstUnlockAndClassDAlways() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "1234")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        // Files written before: class C and D.
        let data = cli.file("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        #expect(try cli.run(["write", data + "/c.txt", "--class", "C", "--passcode-file", passcode], input: Data("class C".utf8)).status == 0)
        #expect(try cli.run(["write", data + "/d.txt", "--class", "D", "--passcode-file", passcode], input: Data("class D".utf8)).status == 0)
        let daemon = try KeybagdProcess(cli: cli)       // a fresh start: before the first unlock
        defer { daemon.stop() }
        let mount = try MountedDirectory(cli: cli, environment: daemon.environment, data: data)
        let before = try mount.shell("cat d.txt; echo; cat c.txt")
        #expect(before.out == "class D\n" && before.err.contains("Permission denied"), "\(before.out) \(before.err)")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try mount.shell("cat c.txt").out == "class C")
        try lockPastGrace(cli, daemon)
        #expect(try mount.shell("cat c.txt").out == "class C", "class C stays available after the first unlock")
        try mount.unmount()
    }
}
