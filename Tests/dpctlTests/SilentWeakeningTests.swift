import DataProtectionTestSupport
import Foundation
import Testing

/// Protection that silently got weaker, or a working file that silently stopped working (issue
/// "Protection that silently gets weaker"): each promise is kept, or refused with a word. Every
/// test runs the real `dpctl`.
@Suite struct SilentWeakeningTests {
    static func mode(_ path: String) -> mode_t {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_mode & 0o7777 : 0
    }

    /// A device without a passcode and a source tree holding one file.
    static func deviceWithSource() throws -> (CLI, String) {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        try Data("x".utf8).write(to: URL(fileURLWithPath: source + "/a"))
        return (cli, source)
    }

    // MARK: - init

    @Test func initMakesAnExistingDataRootPrivateOrRefuses() throws {
        let cli = CLI.make()
        try FileManager.default.createDirectory(atPath: cli.root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        #expect(Self.mode(cli.root) == 0o755)
        let made = try cli.run(["init", "--no-passcode"])
        #expect(made.status == 0, "\(made.stderr)")
        #expect(Self.mode(cli.root) == 0o700)
        let audit = try cli.run(["audit", cli.root])
        #expect(!audit.out.contains("DP603"), "\(audit.out)")

        // A data root that belongs to someone else is refused, and nothing is written in it.
        guard getuid() == 0 else { return }
        let other = CLI.make()
        try FileManager.default.createDirectory(atPath: other.root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        #expect(chown(other.root, 65534, 65534) == 0)
        let refused = try other.run(["init", "--no-passcode"])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("belongs to uid 65534") && refused.stderr.split(separator: "\n").count == 1, "\(refused.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: other.root).isEmpty)
    }

    /// On a full disk (a real tmpfs, filled) the right passcode still unlocks, and a wrong one is
    /// still counted: the keybag is written through its spare, whose blocks exist already.
    @Test(.enabled(if: CrashAndDiskTests.canMount, "needs root and mount(8) to make a small tmpfs"))
    func aFullDiskStillTakesTheRightPasscodeAndCountsWrongOnes() throws {
        let work = CLI.make()
        let disk = work.file("disk")
        try FileManager.default.createDirectory(atPath: disk, withIntermediateDirectories: true)
        #expect(CrashAndDiskTests.shell("mount -t tmpfs -o size=256k tmpfs '\(disk)'") == 0)
        defer { CrashAndDiskTests.shell("umount '\(disk)'") }
        let cli = CLI(root: disk + "/root", work: work.work)
        let passcode = cli.writeFile("p", "123456"), wrong = cli.writeFile("w", "9999")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        CrashAndDiskTests.shell("dd if=/dev/zero of='\(disk)/fill' bs=4k")
        #expect(CrashAndDiskTests.shell("echo x > '\(disk)/one-more'") != 0, "the disk is not full")
        func failures() throws -> Int? {
            (try JSONSerialization.jsonObject(with: try cli.run(["status", "--json"]).stdout) as? [String: Any])?["failedAttempts"] as? Int
        }
        let right = try cli.run(["status", "--passcode-file", passcode])
        #expect(right.status == 0 && right.out.contains("state:            unlocked"), "\(right.stderr)")
        let guess = try cli.run(["status", "--passcode-file", wrong])
        #expect(guess.status == 5, "\(guess.stderr)")
        #expect(try failures() == 1, "a wrong passcode on a full disk was not counted")
        #expect(try cli.run(["status", "--passcode-file", passcode]).status == 0)
        #expect(try failures() == 0)
    }

    // MARK: - backup destinations

    @Test func backupRefusesADirectoryThatIsNeitherEmptyNorARepository() throws {
        let (cli, source) = try Self.deviceWithSource()
        let mine = cli.file("mine")
        try FileManager.default.createDirectory(atPath: mine, withIntermediateDirectories: true)
        try Data("my file".utf8).write(to: URL(fileURLWithPath: mine + "/keep.txt"))
        for extra in [[], ["--dry-run"]] {
            let refused = try cli.run(["backup", source, mine] + extra)
            #expect(refused.status == 1, "\(refused.stderr)")
            #expect(refused.stderr.contains("neither empty nor a backup repository"), "\(refused.stderr)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: mine) == ["keep.txt"])
        }
        // Absent, empty, and an existing repository all work.
        let empty = cli.file("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: true)
        for repo in [cli.file("absent"), empty, empty] {
            let made = try cli.run(["backup", source, repo])
            #expect(made.status == 0, "\(made.stderr)")
        }
    }

    @Test func restoreKeepsDirectoryDefaults() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let docs = cli.file("docs")
        try FileManager.default.createDirectory(atPath: docs + "/sub/deeper", withIntermediateDirectories: true)
        try Data("hi".utf8).write(to: URL(fileURLWithPath: docs + "/sub/a"))
        #expect(try cli.run(["protect", "-R", docs, "--class", "complete", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["protect", docs + "/sub/deeper", "--class", "completeUnlessOpen"]).status == 0)
        let repo = cli.file("repo")
        #expect(try cli.run(["backup", docs, repo]).status == 0)
        let out = cli.file("out")
        let restored = try cli.run(["restore", repo, out, "--passcode-file", passcode])
        #expect(restored.status == 0, "\(restored.stderr)")
        let listing = try cli.run(["ls", "-R", out]).out
        func row(_ name: String) -> String { listing.split(separator: "\n").first { $0.hasSuffix("  " + name) }.map(String.init) ?? "" }
        #expect(row("./").hasPrefix("dir default: complete "), "\(listing)")
        #expect(row("sub/").hasPrefix("dir default: complete "), "\(listing)")
        #expect(row("sub/deeper/").hasPrefix("dir default: complete-unless-open "), "\(listing)")
        // A file written there later gets the class the directory promised, not class C.
        for (directory, expected) in [(out, "complete (A)"), (out + "/sub", "complete (A)"), (out + "/sub/deeper", "(B)")] {
            let path = directory + "/later"
            #expect(try cli.run(["write", path, "--passcode-file", passcode], input: Data("later".utf8)).status == 0)
            #expect(try cli.run(["ls", path]).out.contains(expected), "\(path)")
        }
        // An empty destination made stronger beforehand keeps its own default.
        let plainTree = cli.file("plain-tree")
        try FileManager.default.createDirectory(atPath: plainTree, withIntermediateDirectories: true)
        try Data("x".utf8).write(to: URL(fileURLWithPath: plainTree + "/x"))
        let repo2 = cli.file("repo2")
        #expect(try cli.run(["backup", plainTree, repo2]).status == 0)
        let prepared = cli.file("prepared")
        try FileManager.default.createDirectory(atPath: prepared, withIntermediateDirectories: true)
        #expect(try cli.run(["protect", prepared, "--class", "complete"]).status == 0)
        #expect(try cli.run(["restore", repo2, prepared, "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["ls", prepared]).out.split(separator: "\n").contains { $0.hasPrefix("dir default: complete ") && $0.hasSuffix("./") })
    }

    @Test func aBackupNeverHoldsTheDevicesKeysWhateverTheSource() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["backup-password", "--passcode-file", passcode, "--password-file", cli.writeFile("bp", "backup password")]).status == 0)
        // The data root itself, a directory above it, and another spelling of it.
        let link = cli.file("root-link")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: cli.root)
        for (index, source) in [cli.root, cli.work.path, link].enumerated() {
            let repo = NSTemporaryDirectory() + "dp-repo-\(UUID().uuidString)"
            let made = try cli.run(["backup", source, repo, "--log"])
            #expect(made.status == 0, "\(made.stderr)")
            #expect(made.out.contains("Not backed up (the device's own keys and keybag are never backed up)") && made.out.contains("/keybag"), "\(made.out)")
            #expect(made.out.contains("left out"), "\(made.out)")
            let out = NSTemporaryDirectory() + "dp-out-\(index)-\(UUID().uuidString)"
            let restored = try cli.run(["restore", repo, out, "--passcode-file", passcode])
            #expect(restored.status == 0, "\(restored.stderr)")
            let found = FileManager.default.enumerator(atPath: out)?.compactMap { $0 as? String } ?? []
            for name in ["device.secret", "keybag", "backup-keybag", "keybag.lock", "layout"] {
                #expect(!found.contains { $0 == name || $0.hasSuffix("/" + name) }, "\(source): \(name) was backed up: \(found)")
            }
        }
    }

    /// `exclude` then `protect -R` encrypted the cache directory tag, and `cp` dropped the mark:
    /// `tar --exclude-caches` then backed the photos up again.
    @Test func marksSurviveProtectionAndCopies() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let docs = cli.file("docs")
        try FileManager.default.createDirectory(atPath: docs + "/photos", withIntermediateDirectories: true)
        try Data("PHOTO-BYTES".utf8).write(to: URL(fileURLWithPath: docs + "/photos/cat.jpg"))
        try Data("NOTES".utf8).write(to: URL(fileURLWithPath: docs + "/notes.txt"))
        try Data("SCRATCH".utf8).write(to: URL(fileURLWithPath: docs + "/scratch.tmp"))
        #expect(try cli.run(["exclude", docs + "/photos", docs + "/scratch.tmp"]).status == 0)
        let protected = try cli.run(["protect", "-R", docs, "--class", "complete", "--passcode-file", passcode])
        #expect(protected.status == 0, "\(protected.stderr)")
        let copy = cli.file("docs2")
        #expect(try cli.run(["cp", docs, copy, "--passcode-file", passcode]).status == 0)

        for tree in [docs, copy] {
            let tag = try Data(contentsOf: URL(fileURLWithPath: tree + "/photos/CACHEDIR.TAG"))
            #expect(tag.starts(with: Data("Signature: 8a477f597d28d172789f06886806bc55".utf8)), "\(tree): the tag was encrypted")
            for marked in [tree + "/photos", tree + "/scratch.tmp"] {
                let attribute = try ChildProcess.run("getfattr", ["--only-values", "-n", "user.xdg.robots.backup", marked])
                #expect(attribute.status == 0 && attribute.out == "false", "\(marked) lost its mark: \(attribute.out) \(attribute.err)")
            }
            // The real tool judges: tar leaves the photos out.
            let archive = cli.file("a-\(UUID().uuidString).tar")
            let tar = try ChildProcess.run("tar", ["--exclude-caches", "-cf", archive, "-C", tree, "."])
            #expect(tar.status == 0, "\(tar.err)")
            let listed = try ChildProcess.run("tar", ["-tf", archive]).out
            #expect(!listed.contains("cat.jpg") && listed.contains("notes.txt"), "\(tree): \(listed)")
            let exclusions = try cli.run(["exclusions", tree]).out
            #expect(exclusions.contains(tree + "/photos") && exclusions.contains(tree + "/scratch.tmp"), "\(exclusions)")
            // Everything else is protected.
            #expect(try cli.run(["ls", tree + "/notes.txt"]).out.contains("complete (A)"))
            #expect(try cli.run(["ls", tree + "/photos/cat.jpg"]).out.contains("complete (A)"))
        }
    }

    /// SQLCipher 4 itself (sqlcipher3 in the oracle venv) reads `database` with `passphrase`.
    static func sqlcipherReads(_ database: String, passphrase: String, query: String) throws -> String {
        let script = """
            import sys, sqlcipher3
            c = sqlcipher3.connect(sys.argv[1]); c.execute("PRAGMA key = '%s'" % sys.argv[2].replace("'", "''"))
            print("|".join(str(v) for row in c.execute(sys.argv[3]) for v in row))
            """
        let run = try ChildProcess.run(oraclePython, ["-c", script, database, passphrase, query])
        return run.status == 0 ? run.out.trimmingCharacters(in: .newlines) : "error: \(run.err)"
    }

    /// `audit --fix` wrapped an SQLCipher database and its passphrase file, and files of an app
    /// that reads them as they are: nothing any program used may stop working.
    @Test func auditFixNeverBreaksWhatAnotherProgramReads() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let tree = cli.file("tree")
        try FileManager.default.createDirectory(atPath: tree, withIntermediateDirectories: true)
        let passphrase = tree + "/db.key", database = tree + "/chat.db"
        try Data("correct horse\n".utf8).write(to: URL(fileURLWithPath: passphrase))
        #expect(try cli.run(["sql", database, "--passphrase-file", passphrase, "CREATE TABLE m(t); INSERT INTO m VALUES('hello')"]).status == 0)
        #expect(try Self.sqlcipherReads(database, passphrase: "correct horse", query: "SELECT t FROM m") == "hello")
        try FileManager.default.createDirectory(atPath: tree + "/notes", withIntermediateDirectories: true)
        try Data("an ordinary note".utf8).write(to: URL(fileURLWithPath: tree + "/notes/Notes.md"))   // elsewhere, the usual fix
        let app = try cli.run(["app", "install", "com.example.shell"])
        #expect(app.status == 0, "\(app.stderr)")
        let info = try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.shell", "--json"]).stdout) as? [String: Any]
        let container = try #require(info?["container"] as? String)
        #expect(info?["usesProtectedFiles"] as? Bool == false)
        let script = container + "/Documents/run.sh"
        try Data("echo from a shell app\n".utf8).write(to: URL(fileURLWithPath: script))
        let before = try [database, passphrase, script].map { try Data(contentsOf: URL(fileURLWithPath: $0)) }

        for target in [[tree], []] {
            let fixed = try cli.run(["audit"] + target + ["--fix", "--passcode-file", passcode])
            #expect([0, 6].contains(fixed.status), "\(fixed.stderr)")
        }
        let after = try [database, passphrase, script].map { try Data(contentsOf: URL(fileURLWithPath: $0)) }
        #expect(after == before, "audit --fix changed a file another program reads")
        #expect(try Self.sqlcipherReads(database, passphrase: "correct horse", query: "SELECT t FROM m") == "hello")
        #expect(try cli.run(["sql", database, "--passphrase-file", passphrase, "SELECT t FROM m"]).out == "hello\n")
        #expect(try cli.run(["app", "run", "com.example.shell", "--no-sandbox", "--", "/bin/sh", script]).out == "from a shell app\n")
        #expect(try cli.run(["ls", tree + "/notes/Notes.md"]).out.contains("(C)"), "an ordinary file is still fixed")

        // What is left is reported with what to do, and the database as a database, not a plain file.
        let report = try cli.run(["audit", tree]).out
        #expect(report.contains("DP204") && report.contains("chat.db"), "\(report)")
        #expect(!report.contains("DP101  chat.db"), "\(report)")
        #expect(report.contains("once no program reads it directly"), "\(report)")
        // An app declared to read its files through the library gets the automatic fix.
        #expect(try cli.run(["app", "install", "com.example.client", "--uses-protected-files"]).status == 0)
        let client = try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.client", "--json"]).stdout) as? [String: Any]
        #expect(client?["usesProtectedFiles"] as? Bool == true)
        let note = try #require(client?["container"] as? String) + "/Documents/note.txt"
        try Data("client note".utf8).write(to: URL(fileURLWithPath: note))
        #expect([0, 6].contains(try cli.run(["audit", "--fix", "--passcode-file", passcode]).status))
        #expect(try cli.run(["ls", note]).out.contains("(C)"), "the client app's plain file was not protected")
        #expect(try cli.run(["cat", note, "--passcode-file", passcode]).out == "client note")
    }

    /// `sql` made a plaintext database without a word, `ls` called an SQLCipher database plain,
    /// and the audit's fix for a plain database was a Swift call.
    @Test func plainDatabasesAreNamedAndEncryptedInPlaceFromTheCLI() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let plain = cli.file("plain.db"), cipher = cli.file("cipher.db"), key = cli.writeFile("key", "s3cret")
        let made = try cli.run(["sql", plain, "CREATE TABLE t(x); INSERT INTO t VALUES(42)"])
        #expect(made.status == 0 && made.stderr.contains("plain database (not encrypted)"), "\(made.stderr)")
        #expect(try cli.run(["sql", plain, "SELECT x FROM t"]).stderr.isEmpty, "said again for an existing database")
        #expect(try cli.run(["sql", cipher, "--passphrase-file", key, "CREATE TABLE t(x)"]).stderr.isEmpty)
        #expect(try cli.run(["ls", cipher]).out.contains("sqlcipher "), "an SQLCipher database shown as plain")
        #expect(try cli.run(["ls", plain]).out.contains("plain (unprotected)"))

        let audit = try cli.run(["audit", cli.work.path]).out
        #expect(audit.contains("DP201 plain.db: dpctl sql --root \(cli.root) \(plain) --import-plaintext --class C"), "\(audit)")
        let imported = try cli.run(["sql", plain, "--import-plaintext", "--class", "A", "--passcode-file", passcode])
        #expect(imported.status == 0, "\(imported.stderr)")
        let head = try Data(contentsOf: URL(fileURLWithPath: plain)).prefix(16)
        #expect(!head.starts(with: Data("SQLite format 3".utf8)))
        #expect(try cli.run(["ls", plain]).out.contains("complete (A), database"))
        #expect(try cli.run(["sql", plain, "SELECT x FROM t", "--passcode-file", passcode]).out == "42\n")
        #expect(!(try cli.run(["audit", cli.work.path]).out.contains("DP201")))
        // SQLCipher 4 opens it with the raw key dpctl gives for it.
        let rawKey = try cli.run(["sql-key", plain, "--passcode-file", passcode]).out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(rawKey.count >= 64)
        // Refused: what is not a plain database, and SQL given with the import.
        #expect(try cli.run(["sql", plain, "--import-plaintext", "--class", "A", "--passcode-file", passcode]).status == 1)
        #expect(try cli.run(["sql", cipher, "--import-plaintext", "--class", "A", "--passcode-file", passcode]).status == 1)
        #expect(try cli.run(["sql", plain, "--import-plaintext", "SELECT 1"]).status == 64)
        // With a key of its own instead: SQLCipher 4 reads what was imported.
        let other = cli.file("other.db")
        #expect(try cli.run(["sql", other, "CREATE TABLE u(y); INSERT INTO u VALUES('kept')"]).status == 0)
        #expect(try cli.run(["sql", other, "--import-plaintext", "--passphrase-file", key]).status == 0)
        #expect(try Self.sqlcipherReads(other, passphrase: "s3cret", query: "SELECT y FROM u") == "kept")
    }

    @Test func aBackupRunningIntoTheRepositoryIsBusyNotForgery() throws {
        let (cli, source) = try Self.deviceWithSource()
        let repo = cli.file("repo")
        #expect(try cli.run(["backup", source, repo]).status == 0)

        // A second backup holds the repository's writer lock: a real process, as `dpctl backup`
        // would (flock, its pid in the file).
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
        holder.arguments = [repo + "/lock", "/bin/sh", "-c", "echo $$ > '\(repo)/lock'; echo locked; read line"]
        let input = Pipe(), output = Pipe()
        holder.standardInput = input
        holder.standardOutput = output
        try holder.run()
        defer { try? input.fileHandleForWriting.close(); holder.waitUntilExit() }
        #expect(output.fileHandleForReading.availableData.starts(with: Data("locked".utf8)))
        let pid = try #require(Int32(String(decoding: try Data(contentsOf: URL(fileURLWithPath: repo + "/lock")), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)))

        let busy = try cli.run(["backup", source, repo])
        #expect(busy.status == 75, "\(busy.status) \(busy.stderr)")
        #expect(busy.stderr.contains("another backup or prune of this repository is running (pid \(pid) (/bin/sh -c"), "\(busy.stderr)")
        #expect(!busy.stderr.contains("verify") && !busy.stderr.contains("forged"), "\(busy.stderr)")
        #expect(try cli.run(["--help"]).out.contains("75 busy"))

        try input.fileHandleForWriting.close()
        holder.waitUntilExit()
        #expect(try cli.run(["backup", source, repo]).status == 0)
    }
}

/// keybagd: one data root, one daemon; an erased device is served no longer.
@Suite struct OneDaemonPerRootTests {
    /// Waits (bounded) for a process to end; `false` if it is still running after `seconds`.
    static func ended(_ process: Process, within seconds: Int = 30) -> Bool {
        let done = DispatchSemaphore(value: 0)
        Thread { process.waitUntilExit(); done.signal() }.start()
        return done.wait(timeout: .now() + .seconds(seconds)) == .success
    }

    @Test func eraseThroughTheDaemonEndsItAndInitWorksAfterwards() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        let erased = try cli.run(["erase", "--yes"], environment: daemon.environment)
        #expect(erased.status == 0, "\(erased.stderr)")
        #expect(Self.ended(daemon.process), "keybagd still serves the erased device")
        #expect(daemon.process.terminationStatus == 0)
        #expect(!FileManager.default.fileExists(atPath: daemon.socket))
        let again = try cli.run(["init", "--passcode-file", passcode], environment: daemon.environment)
        #expect(again.status == 0, "\(again.stderr)")
        #expect(try cli.run(["status"], environment: daemon.environment).out.contains("this process only"))
    }

    @Test func aSecondDaemonForTheSameRootRefusesAndClientsSayWhereItIs() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let keybagd = CLI.executable.deletingLastPathComponent().appendingPathComponent("keybagd").path
        // The same root from a session without XDG_RUNTIME_DIR (cron, ssh, su), and by another spelling.
        let link = cli.file("root-link")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: cli.root)
        for (root, environment) in [(cli.root, ["XDG_RUNTIME_DIR": ""]), (link, daemon.environment)] {
            let second = try ChildProcess.run(keybagd, ["--root", root, "--manual-clock"], environment: environment)
            #expect(second.status == 1, "\(second.out) \(second.err)")
            #expect(second.err.contains("another keybagd (pid \(daemon.process.processIdentifier)) on \(daemon.socket) already serves"), "\(second.err)")
        }
        // A client that looks elsewhere refuses instead of keeping a lock state of its own.
        let elsewhere = try cli.run(["status"], environment: ["XDG_RUNTIME_DIR": ""])
        #expect(elsewhere.status == 1)
        #expect(elsewhere.stderr.contains("keybagd (pid \(daemon.process.processIdentifier)) on \(daemon.socket) serves")
                && elsewhere.stderr.contains("XDG_RUNTIME_DIR"), "\(elsewhere.stderr)")
        #expect(try cli.run(["status"], environment: daemon.environment).status == 0)
        daemon.stop()
        // With the daemon gone, the lock is free again.
        #expect(try cli.run(["status"], environment: ["XDG_RUNTIME_DIR": ""]).status == 0)
    }

    /// A passcode file in the environment undid `dpctl lock` for every process, unseen.
    @Test func aPasscodeInTheEnvironmentNeverUnlocksTheDeviceForEveryProcess() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        let secret = cli.file("secret")
        #expect(try cli.run(["write", secret, "--class", "complete"], input: Data("diary".utf8), environment: daemon.environment).status == 0)
        #expect(try cli.run(["lock"], environment: daemon.environment).status == 0)
        try daemon.advance(60, root: cli.root)

        var environment = daemon.environment
        environment["DP_PASSCODE_FILE"] = passcode
        let refused = try cli.run(["cat", secret], environment: environment)
        #expect(refused.status == 3, "\(refused.status) \(refused.out) \(refused.stderr)")
        #expect(refused.stderr.contains("$DP_PASSCODE_FILE does not unlock the device for every process"), "\(refused.stderr)")
        #expect(try cli.run(["status", "--check"], environment: daemon.environment).status == 3, "the device was unlocked")

        // A passcode given to the command itself unlocks, and says so.
        let given = try cli.run(["cat", secret, "--passcode-file", passcode], environment: daemon.environment)
        #expect(given.status == 0 && given.out == "diary", "\(given.stderr)")
        #expect(given.stderr.contains("unlocked the device for every process"), "\(given.stderr)")
        #expect(try cli.run(["status", "--check"], environment: daemon.environment).status == 0)
        // Without keybagd the environment's passcode unlocks this run only, as before.
        daemon.stop()
        let alone = try cli.run(["cat", secret], environment: ["DP_PASSCODE_FILE": passcode])
        #expect(alone.status == 0 && alone.out == "diary" && alone.stderr.isEmpty, "\(alone.stderr)")
    }
}
