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
    /// A data root unlocked through its keybagd, and a mount following it.
    func setUp() throws -> (CLI, KeybagdProcess, MountedDirectory, String) {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
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
        let holder = try FileHolder(in: mount.mountPoint + "/a")
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

    /// A program holding a class-A SQLite database open in WAL mode across lock + grace and the
    /// next unlock is never killed: SQLite maps the database's `-shm` (its WAL index, no row
    /// data), which gets class C (FORMAT.md §14) and so is never revoked at the lock; while
    /// locked its statements fail (`SQLITE_IOERR`: `EACCES` underneath), after the unlock it
    /// goes on, and the database passes `integrity_check`.
    @Test func aProgramWithAClassADatabaseOpenSurvivesTheLock() throws {
        let (cli, daemon, mount, passcode) = try setUp()
        defer { daemon.stop() }
        #expect(try mount.shell("mkdir a && setfattr -n user.dataprotection.class -v complete a").status == 0)
        // A WAL index left class A (by an earlier version) is made class C as the program opens it.
        let planted = try mount.shell("cd a && : > db.sqlite && printf '\\030\\342\\055\\000' > db.sqlite-shm"   // a WAL index's version, 3007000
            + " && setfattr -n user.dataprotection.class -v complete db.sqlite-shm && getfattr --only-values -n user.dataprotection.class db.sqlite-shm")
        #expect(planted.out == "complete", "\(planted.out) \(planted.err)")
        let program = try FileHolder(in: mount.mountPoint + "/a", script: FileHolder.databaseScript)
        #expect(try program.send("open") == "ok")
        for _ in 0..<20 { #expect(try program.send("insert") == "ok") }
        let classes = try mount.shell("cd a && for f in db.sqlite db.sqlite-wal db.sqlite-shm; do getfattr --only-values -n user.dataprotection.class $f; echo; done")
        #expect(classes.out == "complete\ncomplete\nuntil-first-unlock\n", "\(classes.out) \(classes.err)")
        try lockPastGrace(cli, daemon)
        #expect(try program.await("insert", "error") == "error", "a write while class A is locked fails")
        #expect(program.process.isRunning, "alive after the lock")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try program.await("insert", "ok") == "ok", "and goes on after the unlock")
        #expect(try program.send("check") == "ok")
        #expect(Int(try program.send("count")) ?? 0 >= 21)
        #expect(program.process.isRunning)
        program.close()
        #expect(program.process.terminationReason == .exit && program.process.terminationStatus == 0)
        let integrity = try mount.shell("sqlite3 a/db.sqlite 'pragma integrity_check'")
        #expect(integrity.out == "ok\n", "\(integrity.out) \(integrity.err)")
        try mount.unmount()
    }

    /// keybagd restarted under a live mount (killed, as a crash; then stopped, as an upgrade): the
    /// mount follows the new daemon — before first unlock when it appears, classes A and C back
    /// after its unlock, class A gone again at its next lock + grace — and says so, once each.
    @Test func aMountFollowsKeybagdThroughRestarts() throws {
        let (cli, first, mount, passcode) = try setUp()
        defer { first.stop() }
        #expect(try mount.shell("mkdir a c && setfattr -n user.dataprotection.class -v complete a && printf 'class A' > a/f"
                                + " && setfattr -n user.dataprotection.class -v until-first-unlock c && printf 'class C' > c/f").status == 0)
        var daemon = first
        for ending in ["killed", "stopped"] {
            if ending == "killed" { daemon.kill() } else { daemon.stop() }
            daemon = try KeybagdProcess(cli: cli)   // the same runtime directory: the same socket
            let probe = try FileHolder(in: mount.mountPoint)
            #expect(try probe.await("cat a/f", "EACCES") == "EACCES", "\(ending): class A before the new daemon's first unlock")
            #expect(try probe.send("cat c/f") == "EACCES", "\(ending): class C before the new daemon's first unlock")
            #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
            #expect(try probe.await("cat a/f", "class A") == "class A", "\(ending): class A after the unlock")
            #expect(try probe.send("cat c/f") == "class C", "\(ending): class C after the unlock")
            try lockPastGrace(cli, daemon)
            #expect(try probe.await("cat a/f", "EACCES") == "EACCES", "\(ending): class A after the next lock + grace")
            #expect(try probe.send("cat c/f") == "class C", "\(ending): class C stays after the first unlock")
            #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
            probe.close()
        }
        // Gone, then back, unlocked and locked again: whenever the mount hears of it (before the
        // unlock, or — its tries spaced out — after the lock, when only the classes the daemon
        // has tell it), class C is open again and class A is not.
        daemon.kill()
        let probe = try FileHolder(in: mount.mountPoint)
        #expect(try probe.await("cat c/f", "EACCES") == "EACCES", "class C while no daemon serves")
        daemon = try KeybagdProcess(cli: cli)
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        try lockPastGrace(cli, daemon)
        #expect(try probe.await("cat c/f", "class C") == "class C", "class C once the daemon, locked after its first unlock, is heard again")
        #expect(try probe.send("cat a/f") == "EACCES", "class A stays locked")
        probe.close()
        defer { daemon.stop() }
        let log = try mount.unmount()
        #expect(log.components(separatedBy: "went away").count == 4 && log.components(separatedBy: "is back").count == 4, "\(log.replacingOccurrences(of: "\n", with: " // "))")
    }

    @Test func classBIsWritableWhileOpenAndCreatableWhileLockedButNotReopened() throws {
        let (cli, daemon, mount, passcode) = try setUp()
        defer { daemon.stop() }
        #expect(try mount.shell("mkdir b && setfattr -n user.dataprotection.class -v completeUnlessOpen b && echo closed-before > b/closed.txt").status == 0)
        let holder = try FileHolder(in: mount.mountPoint + "/b")
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
        let passcode = cli.writeFile("passcode", "123456")
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
