import DataProtectionTestSupport
import Foundation
import Testing

@Suite(.serialized) struct DPCtlTests {
    @Test func initStatusWriteCatLsAcrossRuns() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let status = try cli.run(["status"])
        #expect(status.out.contains("before-first-unlock"))
        #expect(status.out.contains("passcode:         set"))

        let secret = cli.file("secret.txt")
        // Locked: class A cannot be created; with the passcode it can.
        let denied = try cli.run(["write", secret, "--class", "complete"], input: Data("top secret".utf8))
        #expect(denied.status == 3)
        #expect(denied.stderr.split(separator: "\n").count == 1)
        #expect(try cli.run(["write", secret, "--class", "complete", "--passcode-file", passcode], input: Data("top secret".utf8)).status == 0)
        // Every run starts before first unlock.
        let locked = try cli.run(["cat", secret])
        #expect(locked.status == 3)
        #expect(locked.stderr.hasPrefix("dpctl: "))
        #expect(locked.stderr.contains("cannot be read"))
        #expect(locked.stdout.isEmpty)
        #expect(try cli.run(["cat", secret, "--passcode-file", passcode]).out == "top secret")
        // Class B can be written while locked; C cannot; D can and reads back without a passcode.
        #expect(try cli.run(["write", cli.file("b.bin"), "--class", "complete-unless-open"], input: Data("b".utf8)).status == 0)
        #expect(try cli.run(["write", cli.file("c.bin"), "--class", "until-first-unlock"], input: Data("c".utf8)).status == 3)
        #expect(try cli.run(["write", cli.file("d.bin"), "--class", "none"], input: Data("d".utf8)).status == 0)
        #expect(try cli.run(["cat", cli.file("d.bin")]).out == "d")
        #expect(try cli.run(["cat", cli.file("b.bin")]).status == 3)
        #expect(try cli.run(["cat", cli.file("b.bin"), "--passcode-file", passcode]).out == "b")

        let ls = try cli.run(["ls", cli.work.path])
        #expect(ls.status == 0)
        #expect(ls.out.contains("complete (A)"))
        #expect(ls.out.contains("complete-unless-open (B)"))
        #expect(ls.out.contains("none (D)"))
        #expect(ls.out.contains("plain (unprotected)"))

        let json = try cli.run(["status", "--json", "--passcode-file", passcode])
        let object = try JSONSerialization.jsonObject(with: json.stdout) as? [String: Any]
        #expect(object?["state"] as? String == "unlocked")
        #expect(object?["passcodeSet"] as? Bool == true)
    }

    @Test func wrongPasscodesAreCountedAcrossProcessesAndDelayed() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--passcode-file", cli.writeFile("p", "right-passcode")]).status == 0)
        var fifthStarted = ContinuousClock.now
        for n in 1...5 {
            fifthStarted = ContinuousClock.now
            let result = try cli.run(["status", "--passcode-file", cli.writeFile("bad\(n)", "wrong\(n)")])
            #expect(result.status == 5)
            #expect(result.stderr.contains("wrong passcode (\(n) consecutive"))
        }
        let delayed = try cli.run(["status", "--passcode-file", cli.file("p")])
        // dpctl runs on the real clock: the 1-minute delay began during the fifth run, so the
        // right passcode is refused unless a loaded machine took a minute since then.
        let status = try cli.run(["status", "--json"])
        if ContinuousClock.now - fifthStarted < .seconds(60) {
            #expect(delayed.status == 5)
            #expect(delayed.stderr.contains("try again in"))
            let object = try JSONSerialization.jsonObject(with: status.stdout) as? [String: Any]
            #expect(object?["failedAttempts"] as? Int == 5)
            #expect((object?["delayRemainingSeconds"] as? Double ?? 0) > 0)
        }
    }

    @Test func noPasscodeStatusSaysProtectionIsInactive() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let status = try cli.run(["status"])
        #expect(status.out.contains("INACTIVE"))
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete"], input: Data("x".utf8)).status == 0)
        #expect(try cli.run(["cat", cli.file("a")]).out == "x")
        // Setting a passcode activates protection; the same file is then locked after a restart.
        #expect(try cli.run(["set-passcode", "--new-passcode-file", cli.writeFile("p", "000000")]).status == 0)
        #expect(try cli.run(["cat", cli.file("a")]).status == 3)
        #expect(try cli.run(["change-passcode", "--passcode-file", cli.file("p"), "--new-passcode-file", cli.writeFile("q", "111111")]).status == 0)
        #expect(try cli.run(["cat", cli.file("a"), "--passcode-file", cli.file("q")]).out == "x")
        #expect(try cli.run(["remove-passcode", "--passcode-file", cli.file("q")]).status == 0)
        #expect(try cli.run(["cat", cli.file("a")]).out == "x")
    }

    @Test func protectRecursiveCopyAndErase() throws {
        let cli = CLI.make()
        let p = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", p]).status == 0)
        let tree = cli.work.appendingPathComponent("tree")
        try FileManager.default.createDirectory(at: tree.appendingPathComponent("sub"), withIntermediateDirectories: true)
        try Data("one".utf8).write(to: tree.appendingPathComponent("one.txt"))
        try Data("two".utf8).write(to: tree.appendingPathComponent("sub/two.txt"))
        let result = try cli.run(["protect", "-R", tree.path, "--class", "complete", "--passcode-file", p])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.out.contains("2 files changed"))
        let ls = try cli.run(["ls", "-R", tree.path])
        #expect(ls.out.components(separatedBy: "complete (A)").count == 3)
        #expect(ls.out.contains("dir default: complete"))
        // A copy into a weaker directory keeps class A.
        let weak = cli.work.appendingPathComponent("weak")
        try FileManager.default.createDirectory(at: weak, withIntermediateDirectories: true)
        #expect(try cli.run(["protect", weak.path, "--class", "none"]).status == 0)
        #expect(try cli.run(["cp", tree.appendingPathComponent("one.txt").path, weak.appendingPathComponent("one.txt").path, "--passcode-file", p]).status == 0)
        #expect(try cli.run(["ls", weak.appendingPathComponent("one.txt").path]).out.contains("complete (A)"))
        // Erase: the keybag is gone and the files are unrecoverable.
        #expect(try cli.run(["erase", "--yes"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: cli.root + "/keybag"))
        let after = try cli.run(["cat", tree.appendingPathComponent("one.txt").path, "--passcode-file", p])
        #expect(after.status != 0)
        #expect(after.stderr.contains("no keybag"))
    }

    @Test func badInputGetsOneLineAndAnExitStatus() throws {
        let cli = CLI.make()
        // Missing root.
        let missing = try cli.run(["status"])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("no keybag"))
        #expect(missing.stderr.split(separator: "\n").count == 1)
        let p = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", p]).status == 0)
        #expect(try cli.run(["init", "--passcode-file", p]).status == 1)
        // Missing file, directory as file.
        #expect(try cli.run(["cat", cli.file("nope")]).stderr.contains("no such file"))
        #expect(try cli.run(["cat", cli.work.path]).status != 0)
        // A damaged protected file: exit 4, nothing on stdout.
        #expect(try cli.run(["write", cli.file("d"), "--class", "none"], input: Data(repeating: 7, count: 100_000)).status == 0)
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: cli.file("d"))))
        bytes[70_000] ^= 1
        try Data(bytes).write(to: URL(fileURLWithPath: cli.file("d")))
        let damaged = try cli.run(["cat", cli.file("d")])
        #expect(damaged.status == 4)
        #expect(damaged.stdout.isEmpty, "no byte of a damaged file is printed")
        #expect(damaged.stderr.contains("damaged"))
        // Damage past the first 4 MiB of a 5 MiB file: `cat` decrypts once, so it prints the
        // authentic 4 MiB before it meets the damage (exit 4); --verify-first prints nothing;
        // standard output redirected to a file is cut back to what it held.
        let big = Data((0..<(5 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) })
        #expect(try cli.run(["write", cli.file("big"), "--class", "none"], input: big).status == 0)
        #expect(try cli.run(["cat", cli.file("big")]).stdout == big)
        var sealed = [UInt8](try Data(contentsOf: URL(fileURLWithPath: cli.file("big"))))
        sealed[160 + 70 * (65_536 + 28) + 100] ^= 1
        try Data(sealed).write(to: URL(fileURLWithPath: cli.file("big")))
        let streamed = try cli.run(["cat", cli.file("big")])
        #expect(streamed.status == 4)
        #expect(streamed.stdout == big.prefix(4 << 20), "only authenticated bytes, up to the damaged segment")
        let verified = try cli.run(["cat", "--verify-first", cli.file("big")])
        #expect(verified.status == 4)
        #expect(verified.stdout.isEmpty)
        let out = cli.writeFile("out.txt", "kept\n")
        let redirected = try cli.run(["cat", cli.file("big")], shellPrefix: "exec >>'\(out)'")
        #expect(redirected.status == 4)
        #expect(try String(contentsOfFile: out, encoding: .utf8) == "kept\n", "the partial copy is cut off again")
        // A garbage keybag.
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: cli.root + "/keybag"))
        let corrupt = try cli.run(["status"])
        #expect(corrupt.status == 4)
        #expect(corrupt.stderr.contains("keybag rejected"))
    }
}

@Suite struct DPCtlBackupMarkTests {
    @Test func excludeIncludeAndExclusionLists() throws {
        let cli = CLI.make()
        let offline = cli.work.appendingPathComponent("Documents/offline")
        try FileManager.default.createDirectory(at: offline, withIntermediateDirectories: true)
        try Data("pdf".utf8).write(to: offline.appendingPathComponent("book.pdf"))
        let missing = try cli.run(["exclude", cli.file("nope")])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("no such file"))
        #expect(try cli.run(["exclude", offline.path]).status == 0)
        #expect(FileManager.default.fileExists(atPath: offline.appendingPathComponent("CACHEDIR.TAG").path))
        let ls = try cli.run(["ls", "-R", cli.work.path])
        #expect(ls.out.contains("no (marked)"))
        #expect(ls.out.contains("no (inherited)"))
        let borg = try cli.run(["exclusions", cli.work.path, "--format", "borg"])
        #expect(borg.out == "pp:\(offline.path)\n")
        #expect(try cli.run(["exclusions", cli.work.path, "--format", "zip"]).status == 64)   // a usage error
        let inner = try cli.run(["include", offline.appendingPathComponent("book.pdf").path])
        #expect(inner.stderr.contains("still excluded by its ancestor"))
        #expect(try cli.run(["include", offline.path]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: offline.appendingPathComponent("CACHEDIR.TAG").path))
        #expect(try cli.run(["exclusions", cli.work.path]).out.isEmpty)
    }
}

@Suite(.serialized) struct DPCtlBackupTests {
    /// The seed's container (an installed app's), written through dpctl on device 1.
    func container(_ cli: CLI, passcode: String) throws -> URL {
        #expect(try cli.run(["app", "install", "com.example.seed"]).status == 0)
        let info = try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.seed", "--json"]).stdout) as? [String: Any]
        let c = URL(fileURLWithPath: try #require(info?["container"] as? String))
        let offline = c.appendingPathComponent("Documents/offline")
        try FileManager.default.createDirectory(at: offline, withIntermediateDirectories: true)
        #expect(try cli.run(["exclude", offline.path]).status == 0)
        #expect(try cli.run(["write", offline.appendingPathComponent("guide.pdf").path, "--class", "none"], input: Data("pdf".utf8)).status == 0)
        #expect(try cli.run(["exclude", offline.appendingPathComponent("guide.pdf").path]).status == 0)
        #expect(try cli.run(["write", c.appendingPathComponent("Documents/notes.txt").path, "--class", "complete", "--passcode-file", passcode],
                            input: Data("my notes".utf8)).status == 0)
        try Data("cache".utf8).write(to: c.appendingPathComponent("Library/Caches/c.db"))
        return c
    }

    @Test func backupRestoreVerifyAcrossDevices() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
        let password = cli.writeFile("password", "backup secret")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let c = try container(cli, passcode: passcode)
        #expect(try cli.run(["backup-password", "--passcode-file", passcode, "--password-file", password]).status == 0)
        let repo = cli.work.appendingPathComponent("repo")
        let backup = try cli.run(["backup", c.path, repo.path, "--log"])
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(backup.out.contains("Not backed up (attribute): \(c.path)/Documents/offline"))
        #expect(backup.out.contains("Not backed up (blacklist): \(c.path)/Library/Caches"))
        let json = try cli.run(["backup", c.path, repo.path, "--json"])
        let summary = try JSONSerialization.jsonObject(with: json.stdout) as? [String: Any]
        #expect(summary?["filesCopied"] as? Int == 0)
        let id = try #require(try FileManager.default.contentsOfDirectory(atPath: repo.appendingPathComponent("backups").path).sorted().first)
        let backupDir = repo.appendingPathComponent("backups/" + id).path
        #expect(try cli.run(["verify", backupDir]).out.hasPrefix("ok:"))

        // Device 2: another root.
        let other = CLI(root: cli.work.appendingPathComponent("root-2").path, work: cli.work)
        #expect(try other.run(["init", "--passcode-file", passcode]).status == 0)
        let noPassword = try other.run(["restore", backupDir, cli.file("r1")])
        #expect(noPassword.status == 1)
        #expect(noPassword.stderr.contains("backup password"))
        let restored = try other.run(["restore", backupDir, cli.file("r2"), "--password-file", password, "--passcode-file", passcode])
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(try other.run(["cat", cli.file("r2") + "/Documents/notes.txt", "--passcode-file", passcode]).out == "my notes")
        #expect(try other.run(["ls", cli.file("r2") + "/Documents"]).out.contains("complete (A)"))
    }

    @Test func aBackupKilledHalfWayIsIncompleteAndEarlierOnesSurvive() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let tree = cli.work.appendingPathComponent("tree")
        try FileManager.default.createDirectory(at: tree, withIntermediateDirectories: true)
        try Data("first".utf8).write(to: tree.appendingPathComponent("a.txt"))
        let repo = cli.work.appendingPathComponent("repo")
        #expect(try cli.run(["backup", tree.path, repo.path]).status == 0)
        // Many new files, then kill the backup once it has begun storing objects.
        for i in 0..<3000 { try Data(repeating: UInt8(i % 251), count: 4096 + i).write(to: tree.appendingPathComponent("f\(i)")) }
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", cli.root, "backup", tree.path, repo.path]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let objects = repo.appendingPathComponent("objects")
        let giveUp = ContinuousClock.now + .seconds(120)
        while ContinuousClock.now < giveUp,
              (FileManager.default.enumerator(atPath: objects.path)?.allObjects.count ?? 0) < 50 { sched_yield() }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        let names = try FileManager.default.contentsOfDirectory(atPath: repo.appendingPathComponent("backups").path).sorted()
        #expect(names.count == 2)
        let incomplete = try #require(names.first { $0.hasSuffix(".incomplete") })
        let refused = try cli.run(["restore", repo.appendingPathComponent("backups/" + incomplete).path, cli.file("out")])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("incomplete"))
        let finished = try #require(names.first { !$0.hasSuffix(".incomplete") })
        #expect(try cli.run(["verify", repo.appendingPathComponent("backups/" + finished).path]).status == 0)
        #expect(try cli.run(["restore", repo.appendingPathComponent("backups/" + finished).path, cli.file("out")]).status == 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: cli.file("out") + "/a.txt")) == Data("first".utf8))
    }
}
