import DataProtectionTestSupport
import Foundation
import Testing

/// What a new user hit on day one: exit statuses that disagreed with the documented table, a
/// mistyped command answered with the parser's words about `--root`, class names accepted in one
/// case only and not listed in the help.
@Suite struct DayOneTests {
    static func device() throws -> (CLI, String) {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        return (cli, passcode)
    }

    /// `--root ''` and `DP_ROOT=` are usage errors (64); `erase` with nobody to confirm is one too
    /// and erases nothing; `unlock` with no passcode and no terminal leaves protected data
    /// unavailable (3), as every command that needs a passcode does without a terminal.
    @Test func exitStatusesFollowTheDocumentedTable() throws {
        let (cli, _) = try Self.device()
        let emptyRoot = try ChildProcess.run(CLI.executable.path, ["--root", "", "status"])
        #expect(emptyRoot.status == 64 && emptyRoot.err.contains("empty path"), "\(emptyRoot.err)")
        let emptyVariable = try ChildProcess.run(CLI.executable.path, ["status"], environment: ["DP_ROOT": ""])
        #expect(emptyVariable.status == 64 && emptyVariable.err.contains("DP_ROOT"), "\(emptyVariable.err)")

        let erase = try cli.run(["erase"])
        #expect(erase.status == 64 && erase.stderr.contains("--yes"), "\(erase.stderr)")
        #expect(try cli.run(["status"]).status == 0)   // nothing erased

        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let unlock = try cli.run(["unlock"], environment: daemon.environment)
        #expect(unlock.status == 3 && unlock.stderr.contains("no passcode given"), "\(unlock.stderr)")
    }

    /// A mistyped command, or a group's subcommand, is named as such with the nearest commands
    /// (git's "did you mean"), exit 64; a word near nothing gets no guess.
    @Test func aMistypedCommandIsAnsweredWithTheNearestOnes() throws {
        let (cli, _) = try Self.device()
        let typo = try cli.run(["statsu"])
        #expect(typo.status == 64, "\(typo.stderr)")
        #expect(typo.stderr.hasPrefix("dpctl: 'statsu' is not a dpctl command. See 'dpctl --help'.") && typo.stderr.contains("\n\tstatus\n"), "\(typo.stderr)")
        #expect(!typo.stderr.contains("--root"))
        let group = try cli.run(["app", "lsit"])
        #expect(group.status == 64 && group.stderr.contains("'lsit' is not a dpctl app command") && group.stderr.contains("\tlist"), "\(group.stderr)")
        let far = try cli.run(["frobnicate"])
        #expect(far.status == 64 && !far.stderr.contains("most similar") && far.stderr.split(separator: "\n").count == 1, "\(far.stderr)")
        // Known commands, options and help are not second-guessed.
        #expect(try cli.run(["status"]).status == 0)
        #expect(try cli.run(["help", "status"]).status == 0)
    }

    /// Every spelling of a class, in any case, and the help says which.
    @Test func classesAreAcceptedInEverySpellingAndTheHelpSaysWhich() throws {
        let (cli, passcode) = try Self.device()
        for (index, spelling) in ["Complete", "NSFileProtectionComplete", "nsfileprotectioncomplete", "COMPLETE", "a"].enumerated() {
            let path = cli.file("f\(index)")
            let write = try cli.run(["write", path, "--class", spelling, "--passcode-file", passcode], input: Data("x".utf8))
            #expect(write.status == 0, "\(spelling): \(write.stderr)")
            #expect(try cli.run(["ls", path]).out.contains("complete (A)"), "\(spelling)")
        }
        #expect(try cli.run(["write", cli.file("bad"), "--class", "Completely"], input: Data("x".utf8)).status == 64)
        let help = try cli.run(["write", "--help"]).out
        #expect(help.contains("until-first-unlock (C, the default)") && help.contains("NSFileProtectionComplete") && help.contains("in any case"), "\(help)")
        #expect(!help.contains("(values:"))
    }

    /// Messages without internals: no doubled subject ("device secret: device secret …",
    /// "keybagd: keybagd serves"), no library log line without -v, counts in the right number.
    @Test func messagesSayThingsOnceAndInTheRightNumber() throws {
        let (cli, passcode) = try Self.device()
        let status = try cli.run(["status"]).out
        #expect(status.contains("device secret:    stored in a file: a copy") && !status.contains("device secret stored"), "\(status)")

        let daemon = try KeybagdProcess(cli: cli)
        let again = try cli.run(["init", "--passcode-file", passcode], environment: daemon.environment)
        daemon.stop()
        #expect(again.stderr.contains("keybagd serves") && !again.stderr.contains("keybagd: keybagd"), "\(again.stderr)")

        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        try Data("one".utf8).write(to: URL(fileURLWithPath: source + "/a.txt"))
        let backup = try cli.run(["backup", source, cli.file("repo")])
        #expect(backup.status == 0 && backup.out.contains(": 1 file (") && !backup.out.contains("1 files"), "\(backup.out) \(backup.stderr)")
        let restore = try cli.run(["restore", cli.file("repo"), cli.file("out"), "--passcode-file", passcode])
        #expect(restore.status == 0 && restore.out.contains("restored 1 file, 0 directories, 0 links; 0 protected files"), "\(restore.out) \(restore.stderr)")

        let erase = try cli.run(["erase", "--yes"])
        #expect(erase.status == 0 && erase.stderr.isEmpty, "\(erase.stderr)")
    }

    /// `cp FILE DIR/` copies into the directory, as every cp does; a `DIR/` that is not one is
    /// an error. `ls` says which class a directory without its own default inherits.
    @Test func copyIntoADirectoryAndTheInheritedClassNamed() throws {
        let (cli, passcode) = try Self.device()
        let file = cli.file("note.txt")
        #expect(try cli.run(["write", file, "--class", "complete", "--passcode-file", passcode], input: Data("hi".utf8)).status == 0)
        let directory = cli.file("box")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for destination in [directory + "/", directory] {
            let copy = try cli.run(["cp", file, destination, "--passcode-file", passcode])
            #expect(copy.status == 0, "\(destination): \(copy.stderr)")
            #expect(try cli.run(["cat", directory + "/note.txt", "--passcode-file", passcode]).out == "hi")
            try FileManager.default.removeItem(atPath: directory + "/note.txt")
        }
        let missing = try cli.run(["cp", file, cli.file("nowhere") + "/", "--passcode-file", passcode])
        #expect(missing.status == 1 && missing.stderr.contains("No such file or directory"), "\(missing.stderr)")
        #expect(!FileManager.default.fileExists(atPath: cli.file("nowhere")))

        let listed = try cli.run(["ls", cli.work.path]).out
        #expect(listed.contains("dir default: inherited (until-first-unlock)"), "\(listed)")
        #expect(try cli.run(["protect", directory, "--class", "complete", "--passcode-file", passcode]).status == 0)
        let inner = directory + "/inner"
        try FileManager.default.createDirectory(atPath: inner, withIntermediateDirectories: true)
        #expect(try cli.run(["ls", directory]).out.contains("dir default: inherited (complete)"))
    }

    /// A raw key given on the command line works, with a warning that it is visible to every user
    /// and where to put it instead; from a file, no warning.
    @Test func aKeyOnTheCommandLineIsWarnedAbout() throws {
        let (cli, _) = try Self.device()
        let key = String(repeating: "2b", count: 32)
        let onLine = try cli.run(["sql", cli.file("k.db"), "--raw-key-hex", key, "CREATE TABLE t(x)"])
        #expect(onLine.status == 0 && onLine.stderr.contains("--raw-key-hex puts the key where every user can read it") && onLine.stderr.contains("--raw-key-file"), "\(onLine.stderr)")
        let keyFile = cli.writeFile("key", key)
        let fromFile = try cli.run(["sql", cli.file("k.db"), "--raw-key-file", keyFile, "SELECT count(*) FROM t"])
        #expect(fromFile.status == 0 && fromFile.out == "0\n" && !fromFile.stderr.contains("warning"), "\(fromFile.stderr)")
    }

    /// A keybag that claims a newer format (its version field above ours) is named as such, with
    /// the versions this build reads, exit 4, the file left as it was. The claim is read before
    /// the MAC, so the message says it could be a modification too; erase still works.
    @Test func aKeybagFromANewerVersionIsRefusedByName() throws {
        let (cli, passcode) = try Self.device()
        let path = cli.root + "/keybag"
        let original = try Data(contentsOf: URL(fileURLWithPath: path))
        for extra in [0, 64] {
            var newer = original
            newer[9] = 4   // version 4, big-endian u16 after the 8-byte magic
            newer.append(Data(repeating: 0, count: extra))
            try newer.write(to: URL(fileURLWithPath: path))
            for arguments in [["status"], ["unlock", "--passcode-file", passcode]] {
                let result = try cli.run(arguments)
                #expect(result.status == 4, "\(arguments): \(result.stderr)")
                #expect(result.stderr.contains("claims format version 4") && result.stderr.contains("newer")
                        && result.stderr.contains("modified") && result.stderr.split(separator: "\n").count == 1, "\(result.stderr)")
            }
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == newer)   // nothing was changed
        }
        let erase = try cli.run(["erase", "--yes"])
        #expect(erase.status == 0, "\(erase.stderr)")
    }

    /// Runs `dpctl --root ROOT args…` on a terminal of its own, typing each answer once its
    /// prompt shows (Tests/oracle/answer_on_terminal.py).
    static func onTerminal(_ cli: CLI, _ answers: [(prompt: String, answer: String)], _ arguments: [String]) throws -> ChildProcess {
        let script = packageRoot.appendingPathComponent("Tests/oracle/answer_on_terminal.py").path
        return try ChildProcess.run(oraclePython, [script] + answers.map { "\($0.prompt)=\($0.answer)" } + ["--", CLI.executable.path, "--root", cli.root] + arguments)
    }

    /// init, change-passcode and backup-password ask on a terminal, a new secret twice, without
    /// echo; two different answers or an empty one change nothing (64); without a terminal the
    /// option to use is named (64).
    @Test func newSecretsAreAskedTwiceOnATerminal() throws {
        let cli = CLI.make()
        let keybag = cli.root + "/keybag"
        let differ = try Self.onTerminal(cli, [("New passcode: ", "s3cret-pass"), ("Repeat the new passcode: ", "s3cret-pasS")], ["init"])
        #expect(differ.status == 64 && differ.out.contains("the two passcodes typed differ: nothing was changed"), "\(differ.out)")
        let empty = try Self.onTerminal(cli, [("New passcode: ", "")], ["init"])
        #expect(empty.status == 64 && empty.out.contains("no passcode typed"), "\(empty.out)")
        #expect(!FileManager.default.fileExists(atPath: keybag))
        let noTerminal = try cli.run(["init"])
        #expect(noTerminal.status == 64 && noTerminal.stderr.contains("--passcode-file") && noTerminal.stderr.contains("--no-passcode"), "\(noTerminal.stderr)")
        #expect(!FileManager.default.fileExists(atPath: keybag))

        let made = try Self.onTerminal(cli, [("New passcode: ", "s3cret-pass"), ("Repeat the new passcode: ", "s3cret-pass")], ["init"])
        #expect(made.status == 0 && made.out.contains("passcode set"), "\(made.out)")
        #expect(!made.out.contains("s3cret-pass"))   // not echoed
        let typed = cli.writeFile("typed", "s3cret-pass")
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete", "--passcode-file", typed], input: Data("x".utf8)).status == 0)

        let change = try Self.onTerminal(cli, [("Current passcode: ", "s3cret-pass"), ("New passcode: ", "n3w-pass"), ("Repeat the new passcode: ", "n3w-pass")],
                                         ["change-passcode"])
        #expect(change.status == 0 && change.out.contains("passcode changed"), "\(change.out)")
        let newFile = cli.writeFile("new", "n3w-pass")
        #expect(try cli.run(["cat", cli.file("a"), "--passcode-file", newFile]).out == "x")
        let noTerminalChange = try cli.run(["change-passcode", "--passcode-file", newFile])
        #expect(noTerminalChange.status == 64 && noTerminalChange.stderr.contains("--new-passcode-file"), "\(noTerminalChange.stderr)")

        // The passcode first (the device is locked in this new run), then the password twice.
        let backup = try Self.onTerminal(cli, [("Passcode: ", "n3w-pass"), ("New backup password: ", "b4ckup"), ("Repeat the new backup password: ", "b4ckup")],
                                         ["backup-password"])
        #expect(backup.status == 0 && backup.out.contains("backup keybag written"), "\(backup.out)")
        if let passcode = backup.out.range(of: "Passcode: "), let password = backup.out.range(of: "New backup password: ") {
            #expect(passcode.lowerBound < password.lowerBound)
        }
        #expect(FileManager.default.fileExists(atPath: cli.root + "/backup-keybag"))
    }

    /// A passcode policy, as iOS's: 6 characters by default, 4 at least, changed with `dpctl
    /// policy` (unlocked), checked at init, set and change (a refused one changes nothing and
    /// costs no attempt), asked again on a terminal only once the first answer meets it; kept
    /// through keybagd, which a running daemon applies at once.
    @Test func aPasscodePolicyRefusesShortPasscodesWithTheRule() throws {
        let cli = CLI.make()
        let keybag = cli.root + "/keybag"
        let short = try cli.run(["init", "--passcode-file", cli.writeFile("short", "1234")])
        #expect(short.status == 64 && short.stderr.contains("at least 6 characters"), "\(short.stderr)")
        #expect(!FileManager.default.fileExists(atPath: keybag))
        let typedShort = try Self.onTerminal(cli, [("New passcode: ", "12345")], ["init"])
        #expect(typedShort.status == 64 && typedShort.out.contains("at least 6 characters") && !typedShort.out.contains("Repeat"), "\(typedShort.out)")
        #expect(try cli.run(["init", "--min-passcode-length", "3", "--no-passcode"]).status == 64)
        #expect(!FileManager.default.fileExists(atPath: keybag))

        let four = cli.writeFile("four", "1234")
        #expect(try cli.run(["init", "--passcode-file", four, "--min-passcode-length", "4"]).status == 0)
        #expect(try cli.run(["status"]).out.contains("passcode policy:  at least 4 characters"))
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let env = daemon.environment
        // Locked: the rule is not lowered or raised without the passcode.
        let noTerminal = try cli.run(["policy", "--min-passcode-length", "8"], environment: env)
        #expect(noTerminal.status == 3 || noTerminal.status == 64, "\(noTerminal.stderr)")
        #expect(try cli.run(["policy", "--min-passcode-length", "8", "--passcode-file", four], environment: env).out
            .contains("passcodes of at least 8 characters"))
        let json = try cli.run(["status", "--json"], environment: env)
        #expect(json.out.contains("\"minimumPasscodeLength\" : 8"), "\(json.out)")
        let seven = cli.writeFile("seven", "1234567")
        let refused = try cli.run(["change-passcode", "--passcode-file", four, "--new-passcode-file", seven], environment: env)
        #expect(refused.status == 64 && refused.stderr.contains("at least 8 characters"), "\(refused.stderr)")
        #expect(try cli.run(["status"], environment: env).out.contains("failed attempts:  0"))
        // The current, shorter passcode still unlocks; a long enough new one is taken.
        let eight = cli.writeFile("eight", "12345678")
        #expect(try cli.run(["change-passcode", "--passcode-file", four, "--new-passcode-file", eight], environment: env).status == 0)
        #expect(try cli.run(["policy", "--min-passcode-length", "65", "--passcode-file", eight], environment: env).status == 64)
        // Back to the default: the keybag is version 2 again, readable by releases before the policy.
        #expect(try cli.run(["policy", "--min-passcode-length", "6", "--passcode-file", eight], environment: env).status == 0)
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: keybag)))
        #expect(bytes[8] == 0 && bytes[9] == 2 && bytes[33] == 0)
    }

    /// The README's quick start, as written (files instead of the terminal, a grace period of 0
    /// instead of waiting 10 s): init, keybagd, unlock, write, lock, cat refused, unlock, backup
    /// password, backup, restore. A restore while locked names the repository's manifest, not a
    /// private copy of it.
    @Test func theQuickStartWorksAsWritten() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        let password = cli.writeFile("b", "backup password")
        #expect(try cli.run(["init", "--passcode-file", passcode, "--grace-period", "0"]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let env = daemon.environment
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: env).status == 0)
        let documents = cli.file("Documents")
        try FileManager.default.createDirectory(atPath: documents, withIntermediateDirectories: true)
        #expect(try cli.run(["write", documents + "/notes.txt", "--class", "complete"], input: Data("my notes\n".utf8), environment: env).status == 0)
        #expect(try cli.run(["lock"], environment: env).status == 0)
        #expect(try cli.run(["cat", documents + "/notes.txt"], environment: env).status == 3)
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: env).status == 0)
        #expect(try cli.run(["backup-password", "--password-file", password], environment: env).status == 0)
        let repo = cli.file("backup-repo"), restored = cli.file("restored")
        #expect(try cli.run(["backup", documents, repo], environment: env).status == 0)
        #expect(try cli.run(["lock"], environment: env).status == 0)
        let locked = try cli.run(["restore", repo, cli.file("too-early")], environment: env)
        #expect(locked.status == 3 && locked.stderr.contains(repo + "/backups/") && !locked.stderr.contains("dp-manifest"), "\(locked.stderr)")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: env).status == 0)
        let restore = try cli.run(["restore", repo, restored], environment: env)
        #expect(restore.status == 0, "\(restore.stderr)")
        #expect(try cli.run(["cat", restored + "/notes.txt"], environment: env).out == "my notes\n")
    }

    /// dpctl inside an app (its environment) says plainly that there is no device there, instead
    /// of offering to set one up in the app's container; a named root still works (and `ls`,
    /// which needs no device, works on the app's files).
    @Test func dpctlInsideAnAppSaysThereIsNoDeviceThere() throws {
        let (cli, _) = try Self.device()
        let home = cli.file("app-home")
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        let inside = ["-u", "DP_ROOT", "-u", "XDG_DATA_HOME", "HOME=\(home)", "DATAPROTECTION_APP_ID=com.example.notes", CLI.executable.path]
        for arguments in [["status"], ["init", "--no-passcode"], ["lock"]] {
            let result = try ChildProcess.run("/usr/bin/env", inside + arguments)
            #expect(result.status == 1 && result.err.contains("inside the app com.example.notes (dpctl app run) there is no device")
                    && result.err.split(separator: "\n").count == 1, "\(arguments): \(result.err)")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: home).isEmpty)   // no device made in the app's home
        #expect(try ChildProcess.run("/usr/bin/env", inside + ["--root", cli.root, "status"]).status == 0)
    }

    /// Scripts get one machine form per concept: a class as its short name in ls, status and
    /// app info; a kind; backup inclusion as a boolean with its reason; the labels apart.
    @Test func jsonGivesOneMachineFormPerConcept() throws {
        let (cli, passcode) = try Self.device()
        let directory = cli.file("tree")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        #expect(try cli.run(["write", directory + "/a.txt", "--class", "A", "--passcode-file", passcode], input: Data("abc".utf8)).status == 0)
        try Data("plain".utf8).write(to: URL(fileURLWithPath: directory + "/p.txt"))
        #expect(try cli.run(["exclude", directory + "/p.txt"]).status == 0)
        let listed = try JSONSerialization.jsonObject(with: try cli.run(["ls", "--json", directory]).stdout) as? [[String: Any]] ?? []
        let byName = Dictionary(uniqueKeysWithValues: listed.compactMap { item in (item["name"] as? String).map { ($0, item) } })
        let dir = byName["./"], a = byName["a.txt"], p = byName["p.txt"]
        #expect(dir?["kind"] as? String == "directory" && dir?["protection"] as? String == "until-first-unlock" && dir?["inherited"] as? Bool == true, "\(listed)")
        #expect(dir?["class"] as? String == "dir default: inherited (until-first-unlock)")
        #expect(a?["kind"] as? String == "protected-file" && a?["protection"] as? String == "complete" && a?["size"] as? Int == 3, "\(listed)")
        #expect(a?["class"] as? String == "complete (A)" && a?["included"] as? Bool == true && a?["excludedBy"] is NSNull)
        #expect(p?["kind"] as? String == "plain-file" && p?["protection"] is NSNull, "\(listed)")
        #expect(p?["included"] as? Bool == false && p?["excludedBy"] as? String == "attribute" && p?["backup"] as? String == "no (marked)")

        let status = try JSONSerialization.jsonObject(with: try cli.run(["status", "--json"]).stdout) as? [String: Any]
        #expect(status?["available"] as? [String] == ["none"])
        #expect(try cli.run(["app", "install", "com.example.json", "--default-protection", "complete"]).status == 0)
        let info = try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.json", "--json"]).stdout) as? [String: Any]
        #expect(info?["protection"] as? String == "complete" && info?["defaultProtection"] as? String == "complete", "\(String(describing: info))")
        let list = try JSONSerialization.jsonObject(with: try cli.run(["app", "list", "--json"]).stdout) as? [[String: Any]]
        #expect(list?.first?["protection"] as? String == "complete", "\(String(describing: list))")
    }
}

