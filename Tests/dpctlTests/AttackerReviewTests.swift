import DataProtectionTestSupport
import Foundation
import Testing

/// What an attacker's review of dpctl found (session 12): each case broke something (a trap, a
/// replaced device node, a copy that filled the disk, a restore that lost a whole backup) and
/// now ends in one line, an exit status from the table, and nothing lost.
@Suite struct AttackerReviewTests {
    static func device() throws -> (CLI, String) {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        return (cli, passcode)
    }

    static func isOneLine(_ text: String) -> Bool { text.split(separator: "\n").count == 1 && !text.contains("Fatal error") }

    /// `dpctl write /dev/null` as root replaced the system's /dev/null with a regular file.
    @Test func writeNeverReplacesADeviceAFIFOOrALink() throws {
        let (cli, passcode) = try Self.device()
        let device = cli.file("null"), fifo = cli.file("fifo"), link = cli.file("link"), target = cli.writeFile("target", "kept")
        #expect(mknod(device, S_IFCHR | 0o666, 0x103) == 0)   // 1:3, as /dev/null
        #expect(mkfifo(fifo, 0o644) == 0)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: "target")
        for (path, kind) in [(device, "a character device"), (fifo, "a FIFO"), (link, "a symbolic link to target")] {
            let result = try cli.run(["write", path, "--passcode-file", passcode], input: Data("x".utf8))
            #expect(result.status == 1 && Self.isOneLine(result.stderr) && result.stderr.contains(kind), "\(result.stderr)")
        }
        var st = stat()
        #expect(stat(device, &st) == 0 && st.st_mode & S_IFMT == S_IFCHR)
        #expect(lstat(fifo, &st) == 0 && st.st_mode & S_IFMT == S_IFIFO)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == "target")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "kept")

        // protect: a link to a plain file would be replaced by a protected copy, leaving the
        // plaintext target behind. Refused before anything changes; the target itself works.
        let protect = try cli.run(["protect", cli.file("other"), link, "--class", "A", "--passcode-file", passcode])
        #expect(protect.status == 1, "\(protect.stderr)")
        let refused = try cli.run(["protect", link, "--class", "A", "--passcode-file", passcode])
        #expect(refused.status == 1 && refused.stderr.contains("symbolic link") && Self.isOneLine(refused.stderr), "\(refused.stderr)")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == "target")
        #expect(try cli.run(["protect", target, "--class", "A", "--passcode-file", passcode]).status == 0)
        // A link to a protected file: its header is rewritten where it lies, the link stays.
        #expect(try cli.run(["protect", link, "--class", "B", "--passcode-file", passcode]).status == 0)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == "target")
        #expect(try cli.run(["ls", target]).out.contains("complete-unless-open"))
    }

    /// `dpctl cp . inside` recursed until the disk was full; a failing copy left half a tree.
    @Test func cpOfATreeNeverGoesIntoItselfCopiesLinksAsLinksAndIsWholeOrAbsent() throws {
        let (cli, passcode) = try Self.device()
        let tree = cli.file("tree")
        try FileManager.default.createDirectory(atPath: tree + "/sub", withIntermediateDirectories: true)
        #expect(try cli.run(["write", tree + "/a", "--class", "C", "--passcode-file", passcode], input: Data("alpha".utf8)).status == 0)
        try FileManager.default.createSymbolicLink(atPath: tree + "/abs", withDestinationPath: "/etc/hostname")
        try FileManager.default.createSymbolicLink(atPath: tree + "/sub/dangling", withDestinationPath: "../../nowhere")

        for destination in [tree + "/inside", tree + "/sub/deeper"] {
            let result = try cli.run(["cp", tree, destination, "--passcode-file", passcode])
            #expect(result.status == 1 && result.stderr.contains("into itself") && Self.isOneLine(result.stderr), "\(result.stderr)")
            #expect(!FileManager.default.fileExists(atPath: destination))
        }
        // Private stays private: the source's permission bits, less the umask, as cp does.
        #expect(chmod(tree + "/sub", 0o700) == 0 && chmod(tree + "/a", 0o600) == 0)
        let copy = cli.file("copy")
        #expect(try cli.run(["cp", tree, copy, "--passcode-file", passcode]).status == 0)
        var st = stat()
        #expect(stat(copy + "/sub", &st) == 0 && st.st_mode & 0o777 == 0o700)
        #expect(stat(copy + "/a", &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: copy + "/abs") == "/etc/hostname")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: copy + "/sub/dangling") == "../../nowhere")
        #expect(try cli.run(["cat", copy + "/a", "--passcode-file", passcode]).out == "alpha")

        // A FIFO inside stops the copy: nothing at the destination, no hidden leftovers.
        #expect(mkfifo(tree + "/sub/fifo", 0o644) == 0)
        let stopped = try cli.run(["cp", tree, cli.file("second"), "--passcode-file", passcode])
        #expect(stopped.status == 1 && stopped.stderr.contains("FIFO") && Self.isOneLine(stopped.stderr), "\(stopped.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: cli.work.path).filter { $0.contains("second") }.isEmpty)
    }

    /// `BEGIN` without `COMMIT` trapped in GRDB (exit 132) and left a hot journal.
    @Test func sqlRollsBackATransactionLeftOpen() throws {
        let (cli, passcode) = try Self.device()
        let db = cli.file("n.db"), plain = cli.file("plain.db")
        #expect(try cli.run(["sql", db, "--class", "A", "--passcode-file", passcode, "CREATE TABLE t(a)"]).status == 0)
        for sql in ["BEGIN", "BEGIN; INSERT INTO t VALUES (1);", "INSERT INTO t VALUES (2); BEGIN; INSERT INTO t VALUES (3); SELECT nosuchfunction()"] {
            let result = try cli.run(["sql", db, "--passcode-file", passcode, sql])
            #expect(result.status == 1 && Self.isOneLine(result.stderr), "\(sql): \(result.stderr)")
        }
        #expect(try cli.run(["sql", db, "--passcode-file", passcode, "SELECT a FROM t"]).out == "2\n")
        #expect(try cli.run(["sql", plain, "CREATE TABLE x(a); BEGIN; INSERT INTO x VALUES (1)"]).status == 1)
        #expect(try cli.run(["sql", plain, "SELECT count(*) FROM x"]).out == "0\n")
        #expect(!FileManager.default.fileExists(atPath: plain + "-journal"))
        #expect(try cli.run(["sql", db, "--passcode-file", passcode, "BEGIN; INSERT INTO t VALUES (4); COMMIT; SELECT count(*) FROM t"]).out == "2\n")

        // Page 1 of a class-managed database changed: its own key is right, so it is damage (4).
        var bytes = try Data(contentsOf: URL(fileURLWithPath: db))
        bytes[100] ^= 1
        try bytes.write(to: URL(fileURLWithPath: db))
        let damaged = try cli.run(["sql", db, "--passcode-file", passcode, "SELECT 1"])
        #expect(damaged.status == 4 && damaged.stderr.contains("damaged") && Self.isOneLine(damaged.stderr), "\(damaged.stderr)")
    }

    @Test(arguments: [["--large-file", "nan"], ["--large-file", "inf"], ["--large-file", "1e308"], ["--inbox-age", "nan"], ["--inbox-age", "inf"]])
    func auditRefusesNumbersItCannotUse(option: [String]) throws {
        let (cli, _) = try Self.device()
        let result = try cli.run(["audit", cli.work.path] + option)
        #expect(result.status == 64 && !result.stderr.contains("Fatal error"), "\(result.stderr)")
    }

    /// A backup of a tree with an absolute link verified but could not be restored at all.
    @Test func aBackupWithALinkLeadingOutsideRestoresEverythingElse() throws {
        let (cli, passcode) = try Self.device()
        let source = cli.file("source")
        try FileManager.default.createDirectory(atPath: source + "/d", withIntermediateDirectories: true)
        try Data("hi".utf8).write(to: URL(fileURLWithPath: source + "/d/file"))
        try FileManager.default.createSymbolicLink(atPath: source + "/abs", withDestinationPath: "/etc/hostname")
        try FileManager.default.createSymbolicLink(atPath: source + "/near", withDestinationPath: "d/file")
        let repository = cli.file("repo"), restored = cli.file("restored")
        #expect(try cli.run(["backup", source, repository, "-q"]).status == 0)
        let restore = try cli.run(["restore", repository, restored, "--passcode-file", passcode])
        #expect(restore.status == 0, "\(restore.stderr)")
        #expect(restore.out.contains("Not restored (a link leading outside the restored tree): \(restored)/abs -> /etc/hostname"), "\(restore.out)")
        #expect(restore.out.contains("1 link leading outside left out"))
        #expect(try String(contentsOfFile: restored + "/d/file", encoding: .utf8) == "hi")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: restored + "/near") == "d/file")
        var st = stat()
        #expect(lstat(restored + "/abs", &st) != 0)
    }

    /// A repository whose only backup was forged exited 1 ("no finished backup"), and
    /// `verify --json` printed nothing at all.
    @Test func aForgedRepositoryIsDamageAndJSONStillAnswers() throws {
        let (cli, passcode) = try Self.device()
        let source = cli.file("source"), repository = cli.file("repo")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        try Data("hi".utf8).write(to: URL(fileURLWithPath: source + "/f"))
        #expect(try cli.run(["backup", source, repository, "-q"]).status == 0)
        let id = try #require(try FileManager.default.contentsOfDirectory(atPath: repository + "/backups").first)
        let manifest = URL(fileURLWithPath: repository + "/backups/" + id + "/manifest.sealed")
        var bytes = try Data(contentsOf: manifest)
        bytes[20] ^= 1
        try bytes.write(to: manifest)
        for target in [repository, repository + "/backups/" + id] {
            let plain = try cli.run(["verify", target])
            #expect(plain.status == 4, "\(plain.stderr)")
            let json = try cli.run(["verify", "--json", target])
            let object = try #require(try JSONSerialization.jsonObject(with: json.stdout) as? [String: Any], "\(json.out)")
            #expect(json.status == 4 && object["authentic"] as? Bool == false && object["backup"] as? String == target)
        }
        #expect(try cli.run(["restore", repository, cli.file("out"), "--passcode-file", passcode]).status == 4)
        let missing = try cli.run(["verify", cli.file("nothing-here")])
        #expect(missing.status == 1 && missing.stderr.contains("no such file"), "\(missing.stderr)")
        // An ordinary directory is a wrong path (1), not a damaged backup (4).
        try FileManager.default.createDirectory(atPath: cli.file("ordinary"), withIntermediateDirectories: true)
        let ordinary = try cli.run(["verify", cli.file("ordinary")])
        #expect(ordinary.status == 1 && ordinary.stderr.contains("not a backup"), "\(ordinary.stderr)")
    }

    /// `exclusions` failed on any tree holding a dangling link; JSON carried display forms
    /// (`n\\nl`, `bad\\xFE`) that name other files.
    @Test func namesInJSONAreTheRealNames() throws {
        let (cli, _) = try Self.device()
        let tree = cli.file("tree")
        try FileManager.default.createDirectory(atPath: tree + "/n\nl", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: tree + "/b\\x", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: tree + "/dangling", withDestinationPath: "/nonexistent")
        #expect(try cli.run(["exclude", tree + "/n\nl", tree + "/b\\x"]).status == 0)
        let exclusions = try cli.run(["exclusions", "--json", tree])
        let paths = try #require(try JSONSerialization.jsonObject(with: exclusions.stdout) as? [[String: Any]], "\(exclusions.stderr)").map { $0["path"] as? String }
        #expect(paths == [tree + "/b\\x", tree + "/n\nl"])
        // A text list cannot hold a newline in a name: said so. Without it, the dangling link is no error.
        let inexpressible = try cli.run(["exclusions", tree])
        #expect(inexpressible.status == 1 && inexpressible.stderr.contains("cannot be written"), "\(inexpressible.stderr)")
        #expect(try cli.run(["include", tree + "/n\nl"]).status == 0)
        #expect(try cli.run(["exclusions", tree]).out == tree + "/b\\x\n")

        // A name that is not UTF-8 (made by bash from bytes): `\udcfe` in JSON, as borg writes it;
        // Python's os.fsencode gives the bytes back.
        #expect(try ChildProcess.run("bash", ["-c", "touch \"$0\"/$'bad\\xfe'", tree]).status == 0)
        let listed = try cli.run(["ls", "--json", tree])
        #expect(listed.out.contains(#""name" : "bad\udcfe""#), "\(listed.out)")
        let check = try ChildProcess.run("python3", ["-c", """
            import json, os, sys
            names = sorted(os.fsencode(item["name"]) for item in json.loads(sys.argv[1]))
            print(names == sorted([b"./", b"b\\\\x/", b"bad\\xfe", b"dangling", b"n\\nl/"]), names)
            """, listed.out])
        #expect(check.out.hasPrefix("True"), "\(check.out)\(check.err)")
        #expect(listed.out.contains("dangling link"))
    }

    /// Text arguments (SQL, preference values) that are not UTF-8 were stored as look-alike
    /// characters (0xFF became U+10FFFF); they are refused as standard input's are.
    @Test func textArgumentsThatAreNotUTF8AreRefused() throws {
        let (cli, passcode) = try Self.device()
        #expect(try cli.run(["app", "install", "com.example.text"]).status == 0)
        let script = "exec \"$0\" --root \"$1\" \"$2\" \"$3\" \"$4\" \"$5\" $'\\xff' --passcode-file \"$6\""
        let write = try ChildProcess.run("bash", ["-c", script, CLI.executable.path, cli.root, "defaults", "write", "com.example.text", "k", passcode])
        #expect(write.status == 64 && write.err.contains("UTF-8"), "\(write.err)")
        #expect(try cli.run(["defaults", "read", "com.example.text", "--passcode-file", passcode]).out.contains("k") == false)
        let sql = try ChildProcess.run("bash", ["-c", "exec \"$0\" --root \"$1\" sql \"$2\" \"SELECT hex('\"$'\\xff'\"')\"", CLI.executable.path, cli.root, cli.file("t.db")])
        #expect(sql.status == 64 && sql.err.contains("UTF-8"), "\(sql.err)")
    }

    /// The smaller findings: usage errors exit 64, an empty path names no file, Foundation's
    /// errors read as `PATH: reason`, a locked preferences file is named as itself.
    @Test func smallerFindings() throws {
        let (cli, passcode) = try Self.device()
        let key = String(repeating: "0", count: 64)
        for arguments in [["sql", cli.file("x.db"), "--raw-key-hex", "zz", "SELECT 1"], ["sql", cli.file("x.db"), "--cipher-compat", "5", "SELECT 1"],
                          ["sql", cli.file("x.db"), "--page-size", "100", "--raw-key-hex", key, "SELECT 1"], ["exclusions", cli.work.path, "--format", "xyz"],
                          ["backup", cli.work.path, ""], ["ls", ""], ["cp", "", cli.file("copy")], ["verify", ""], ["write", cli.work.path + "/dir/"],
                          ["app", "install", "a..b"], ["grants", "--app", "bad id"],
                          ["grant", "--from", "com.example.a", "--to", "com.example.b", "Documents/x", "--expires", "0s"]] {
            let result = try cli.run(arguments, input: Data("x".utf8))
            #expect(result.status == 64, "\(arguments): \(result.stderr)")
        }
        #expect(!FileManager.default.fileExists(atPath: cli.work.path + "/backups"))

        let file = cli.writeFile("file", "f")
        let intoFile = try cli.run(["backup", cli.work.path + "/root", file + "/repo", "-q"])
        #expect(intoFile.status == 1 && intoFile.stderr.hasSuffix("dpctl: \(file)/repo: Not a directory\n") && !intoFile.stderr.contains("NSCocoaErrorDomain"),
                "\(intoFile.stderr)")

        #expect(try cli.run(["app", "install", "com.example.prefs"]).status == 0)
        #expect(try cli.run(["defaults", "write", "com.example.prefs", "k", "v", "--passcode-file", passcode]).status == 0)
        let locked = try cli.run(["defaults", "read", "com.example.prefs"], environment: ["DP_TERMINAL_PROMPT": "0"])
        #expect(locked.status == 3 && locked.stderr.contains("com.example.prefs.plist") && !locked.stderr.contains("/proc/self/fd"), "\(locked.stderr)")
    }

    /// `erase` under keybagd, then `init`, made a keybag the daemon never saw: every process
    /// went on getting the old, erased one. `init` is refused while a keybagd serves the root.
    @Test func initIsRefusedWhileKeybagdServesTheRoot() throws {
        let (cli, passcode) = try Self.device()
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let again = try cli.run(["init", "--passcode-file", passcode], environment: daemon.environment)
        #expect(again.status == 1 && again.stderr.contains("keybagd serves") && Self.isOneLine(again.stderr), "\(again.stderr)")
    }

    /// The TPM's device TCTI writes commands into whatever its path names: a passcode file named
    /// in DATAPROTECTION_TPM_TCTI was overwritten. Only a character device is handed to it.
    @Test func theTPMDevicePathMustBeACharacterDevice() throws {
        let (cli, passcode) = try Self.device()
        let victim = cli.writeFile("victim", "keep me")
        for spelling in ["device:", "libtss2-tcti-device.so.0:", "tcti-device:"] {
            let result = try cli.run(["tpm", "enroll", "--passcode-file", passcode], environment: ["DATAPROTECTION_TPM_TCTI": spelling + victim])
            #expect(result.status == 1 && result.stderr.contains("not a character device") && Self.isOneLine(result.stderr), "\(spelling): \(result.stderr)")
        }
        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "keep me")
        #expect(try String(contentsOfFile: passcode, encoding: .utf8) == "123456")
    }

    /// A supervisor killed outright (`SIGKILL`) left its app running, adopted by init (or frozen
    /// for good), and the app could then be uninstalled under it. Its cgroup records it: the
    /// next run of the app, or its uninstall, ends what was left.
    @Test func whatAKilledSupervisorLeftEndsWithTheUninstall() throws {
        let (cli, passcode) = try Self.device()
        #expect(try cli.run(["app", "install", "com.example.orphan"]).status == 0)
        let pidFile = cli.file("pid")
        let supervisor = Process()
        supervisor.executableURL = CLI.executable
        supervisor.arguments = ["--root", cli.root, "app", "run", "com.example.orphan", "--no-sandbox", "--passcode-file", passcode,
                                "--", "/bin/sh", "-c", "echo $$ > '\(pidFile)'; exec sleep 300"]
        supervisor.standardOutput = FileHandle.nullDevice
        supervisor.standardError = FileHandle.nullDevice
        try supervisor.run()
        var appPID: pid_t?
        for _ in 0..<3000 where appPID == nil {   // until the app has started (at most a minute)
            appPID = (try? String(contentsOfFile: pidFile, encoding: .utf8)).flatMap { pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            if appPID == nil { usleep(20_000) }
        }
        let pid = try #require(appPID)
        defer { _ = Glibc.kill(pid, SIGKILL) }
        let cgroup = (try? String(contentsOfFile: "/proc/\(pid)/cgroup", encoding: .utf8)) ?? ""
        _ = Glibc.kill(supervisor.processIdentifier, SIGKILL)
        supervisor.waitUntilExit()
        guard cgroup.contains("dataprotection-") else { return }   // no cgroups here: nothing records the app
        #expect(Self.isAlive(pid), "the app outlives its supervisor (what this test is about)")
        #expect(try cli.run(["app", "uninstall", "com.example.orphan"]).status == 0)
        var ended = false
        for _ in 0..<500 where !ended { ended = !Self.isAlive(pid); if !ended { usleep(10_000) } }
        #expect(ended, "the app left running was ended by the uninstall")
    }

    /// Alive and not a zombie (a killed orphan waits for init to reap it).
    static func isAlive(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
        let state = stat.split(separator: ")").last?.split(separator: " ").first
        return state != "Z" && state != "X"
    }

    /// A value with a newline printed as two lines and could imitate another key.
    @Test func defaultsReadQuotesAndEscapesAsMacOSDoes() throws {
        let (cli, passcode) = try Self.device()
        #expect(try cli.run(["app", "install", "com.example.quotes"]).status == 0)
        #expect(try cli.run(["defaults", "write", "com.example.quotes", "theme", "dark;\n    isAdmin = 1", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["defaults", "write", "com.example.quotes", "key with \"quote\" and \\", "plain", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["defaults", "write", "com.example.quotes", "nel", "a\u{85}b\u{9B}c", "--passcode-file", passcode]).status == 0)
        let read = try cli.run(["defaults", "read", "com.example.quotes", "--passcode-file", passcode])
        #expect(read.out == """
            {
                "key with \\"quote\\" and \\\\" = plain;
                nel = "a\\U0085b\\U009bc";
                theme = "dark;\\n    isAdmin = 1";
            }

            """, "\(read.out)")
    }
}
