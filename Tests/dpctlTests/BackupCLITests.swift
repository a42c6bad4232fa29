import DataProtectionTestSupport
import Foundation
import Testing

/// `dpctl backups`, and `restore`/`verify` as restic users expect them (issue 18).
@Suite struct BackupCLITests {
    /// A device with a passcode and a backup password, a source tree, and a repository with two backups.
    static func twoBackups() throws -> (cli: CLI, passcode: String, source: String, repo: String) {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        let password = cli.writeFile("bp", "backup password")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["backup-password", "--passcode-file", passcode, "--password-file", password]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source + "/docs", withIntermediateDirectories: true)
        try Data("first".utf8).write(to: URL(fileURLWithPath: source + "/docs/a.txt"))
        let repo = cli.file("repo")
        #expect(try cli.run(["backup", source, repo]).status == 0)
        try Data("second".utf8).write(to: URL(fileURLWithPath: source + "/docs/b.txt"))
        #expect(try cli.run(["backup", source, repo]).status == 0)
        return (cli, passcode, source, repo)
    }

    /// forget, prune and a partial, damage-tolerant restore through dpctl, as the README shows them.
    @Test func forgetPruneAndPartialRestoresFromTheCommandLine() throws {
        let (cli, passcode, source, repo) = try Self.twoBackups()
        let ids = try #require(try JSONSerialization.jsonObject(with: try cli.run(["backups", repo, "--json"]).stdout) as? [[String: Any]])
            .compactMap { $0["id"] as? String }
        #expect(try cli.run(["forget", repo]).status == 64)   // no rule: nothing would be kept
        let dry = try cli.run(["forget", repo, "--keep-last", "1", "--dry-run", "--passcode-file", passcode])
        #expect(dry.status == 0 && dry.out.contains("would remove 1 backup:") && dry.out.contains(ids[0]), "\(dry.out)\(dry.stderr)")
        let json = try cli.run(["forget", repo, "--keep-last", "1", "--json", "--passcode-file", passcode])
        let report = try #require(try JSONSerialization.jsonObject(with: json.stdout) as? [String: Any])
        #expect((report["kept"] as? [[String: Any]])?.first?["reasons"] as? [String] == ["last"], "\(json.out)")
        #expect((report["removed"] as? [[String: Any]])?.compactMap { $0["id"] as? String } == [ids[0]])
        #expect(try cli.run(["backups", repo, "--json"]).out.contains(ids[0]) == false)
        // The first backup's a.txt object is shared with the second: prune has nothing to remove but the manifests' objects are not objects.
        let pruned = try cli.run(["prune", repo, "--json"])
        #expect(pruned.status == 0 && pruned.out.contains("\"objectsRemoved\" : 0"), "\(pruned.out)\(pruned.stderr)")
        #expect(try cli.run(["forget", repo, "nope"]).status == 1)

        // One damaged file: everything else restored, the damaged one named, exit 4.
        let objects = try FileManager.default.subpathsOfDirectory(atPath: repo + "/objects").filter { $0.count == 67 }.sorted()
        #expect(objects.count == 2)
        var altered = try Data(contentsOf: URL(fileURLWithPath: repo + "/objects/" + objects[0]))
        altered[altered.count - 1] ^= 1
        try altered.write(to: URL(fileURLWithPath: repo + "/objects/" + objects[0]))
        let damaged = try cli.run(["restore", repo, cli.file("out"), "--passcode-file", passcode])
        #expect(damaged.status == 4, "\(damaged.stderr)")
        #expect(damaged.out.contains("Not restored (damaged: its stored content was altered)"), "\(damaged.out)")
        #expect(damaged.stderr.contains("1 damaged file not restored, everything else was"), "\(damaged.stderr)")
        let restoredFiles = try FileManager.default.subpathsOfDirectory(atPath: cli.file("out")).filter { $0.hasSuffix(".txt") }
        #expect(restoredFiles.count == 1)
        let whole = try cli.run(["restore", repo, cli.file("whole"), "--all-or-nothing", "--passcode-file", passcode])
        #expect(whole.status == 4 && !FileManager.default.fileExists(atPath: cli.file("whole")), "\(whole.stderr)")
        try FileManager.default.removeItem(atPath: repo + "/objects/" + objects[0])
        _ = source

        // A subset: the intact file alone; a path the backup lacks restores nothing (exit 1).
        let intact = try #require(["docs/a.txt", "docs/b.txt"].first { restoredFiles.contains($0) })
        let subset = try cli.run(["restore", repo, cli.file("one"), "--include", intact, "--passcode-file", passcode])
        #expect(subset.status == 0, "\(subset.stderr)")
        #expect(try FileManager.default.subpathsOfDirectory(atPath: cli.file("one")).sorted() == ["docs", intact])
        let missing = try cli.run(["restore", repo, cli.file("none"), "--include", "docs/c.txt", "--passcode-file", passcode])
        #expect(missing.status == 1 && missing.stderr.contains("docs/c.txt: the backup holds no such path"), "\(missing.stderr)")
        #expect(!FileManager.default.fileExists(atPath: cli.file("none")))
    }

    /// Ctrl-C in the middle of a backup, at a moment the test knows: `--log` writes a line per
    /// file into a pipe nobody reads until dpctl blocks on it; then SIGINT, then the pipe is
    /// drained. dpctl says how far it got and exits 130; the next run copies only the rest.
    @Test func anInterruptedBackupSaysHowFarItGotAndTheNextRunResumes() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        let padding = String(repeating: "x", count: 120)
        for n in 0..<1_000 { try Data("\(n)".utf8).write(to: URL(fileURLWithPath: source + "/\(n)-\(padding)")) }
        let repo = cli.file("repo")
        // Blocked writing its log: one of its threads waits in pipe_write.
        let run = try cli.startBlockedOnOutput(["backup", source, repo, "--log"])
        #expect(run.isBlocked, "the backup did not block on its log (finished, or the kernel names the wait otherwise)")
        kill(run.process.processIdentifier, SIGINT)
        let (status, out, message) = run.finish()
        #expect(status == 130, "\(message)")
        let stored = out.split(separator: "\n").filter { $0.hasPrefix("Backed up: ") }.count
        #expect(stored > 0 && stored < 1_000)
        #expect(message.contains("interrupted: \(stored) of 1000 files stored") && message.contains("run the same backup again to finish"),
                "\(message)")
        let resumed = try cli.run(["backup", source, repo, "--json"])
        let summary = try #require(try JSONSerialization.jsonObject(with: resumed.stdout) as? [String: Any])
        #expect(summary["files"] as? Int == 1_000 && summary["filesCopied"] as? Int == 1_000 - stored, "\(resumed.out)")
        #expect(try cli.run(["verify", repo]).status == 0)
    }

    @Test func backupsListsARepositoryAndRestoreTakesItsLatest() throws {
        let (cli, passcode, _, repo) = try Self.twoBackups()
        let listed = try cli.run(["backups", repo])
        #expect(listed.status == 0, "\(listed.stderr)")
        let lines = listed.out.split(separator: "\n")
        #expect(lines.count == 4 && lines[0].hasPrefix("ID") && lines[0].contains("ELSEWHERE"), "\(listed.out)")
        #expect(lines[1].contains("this device") && lines[1].contains("complete") && lines[1].contains("yes"), "\(listed.out)")
        let json = try cli.run(["backups", repo, "--json"])
        let entries = try #require(try JSONSerialization.jsonObject(with: json.stdout) as? [[String: Any]])
        #expect(entries.count == 2 && entries.allSatisfy { $0["isComplete"] as? Bool == true && $0["carriesBackupKeybag"] as? Bool == true })
        #expect(json.out.contains("\"path\" : \"\(repo)/backups/"), "slashes are not escaped: \(json.out)")
        let ids = entries.compactMap { $0["id"] as? String }
        #expect(ids.count == 2 && (entries[0]["created"] as? String)?.hasSuffix("Z") == true)

        // An interrupted backup is listed as such and never taken as the latest.
        try FileManager.default.createDirectory(atPath: repo + "/backups/99991231T235959Z-1.incomplete", withIntermediateDirectories: true)
        #expect(try cli.run(["backups", repo]).out.contains("incomplete"))

        let restored = try cli.run(["restore", repo, cli.file("out"), "--passcode-file", passcode])
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(restored.stderr.contains("using the latest backup, \(ids[1])"))
        #expect(try String(contentsOfFile: cli.file("out") + "/docs/b.txt", encoding: .utf8) == "second")
        let verified = try cli.run(["verify", repo])
        #expect(verified.status == 0 && verified.out.hasPrefix("ok: \(ids[1]):"), "\(verified.out)\(verified.stderr)")

        // -q: nothing but the exit status; -v: the keybag's log on standard error.
        let quiet = try cli.run(["backup", cli.file("src"), repo, "-q"])
        #expect(quiet.status == 0 && quiet.out.isEmpty, "\(quiet.out)")
        let quietVerify = try cli.run(["verify", repo, "--quiet"])
        #expect(quietVerify.status == 0 && quietVerify.out.isEmpty && quietVerify.stderr.isEmpty, "\(quietVerify.stderr)")
        let verbose = try cli.run(["-v", "status", "--passcode-file", passcode])
        #expect(verbose.status == 0 && verbose.stderr.contains("unlocked"), "\(verbose.stderr)")

        let notARepository = try cli.run(["backups", cli.file("src")])
        #expect(notARepository.status == 1 && notARepository.stderr.contains("is not a backup repository"))
        let empty = cli.file("empty")
        try FileManager.default.createDirectory(atPath: empty + "/backups", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: empty + "/objects", withIntermediateDirectories: true)
        let none = try cli.run(["restore", empty, cli.file("out2")])
        #expect(none.status == 1 && none.stderr.contains("holds no finished backup"), "\(none.stderr)")
    }

    @Test func verifyNamesTheDamagedFilesExitsFourAndSpeaksJSON() throws {
        let (cli, passcode, _, repo) = try Self.twoBackups()
        // Damage every object: one byte changed in each.
        let objects = repo + "/objects"
        for prefix in try FileManager.default.contentsOfDirectory(atPath: objects) where !prefix.hasPrefix(".") {
            for name in try FileManager.default.contentsOfDirectory(atPath: objects + "/" + prefix) {
                let url = URL(fileURLWithPath: objects + "/" + prefix + "/" + name)
                var bytes = try Data(contentsOf: url)
                bytes[bytes.count - 1] ^= 1
                try bytes.write(to: url)
            }
        }
        // Before the first unlock the manifest cannot be opened: objects are named, files are not.
        let locked = try cli.run(["verify", repo])
        #expect(locked.status == 4, "\(locked.stderr)")
        #expect(locked.out.contains("damaged: object ") && locked.out.contains("is altered"), "\(locked.out)")
        #expect(locked.stderr.contains("named once the device has been unlocked"))

        let named = try cli.run(["verify", repo, "--passcode-file", passcode])
        #expect(named.status == 4)
        #expect(named.out.contains("docs/a.txt: object ") && named.out.contains("docs/b.txt: object "), "\(named.out)")

        let json = try cli.run(["verify", repo, "--json", "--passcode-file", passcode])
        #expect(json.status == 4)
        let report = try #require(try JSONSerialization.jsonObject(with: json.stdout) as? [String: Any])
        let problems = try #require(report["problems"] as? [[String: Any]])
        #expect(report["filesNamed"] as? Bool == true && !problems.isEmpty)
        #expect(problems.contains { ($0["files"] as? [String])?.contains { $0.hasSuffix("docs/b.txt") } == true && $0["issue"] as? String == "altered" })
    }
}

/// A repository is its owner's only, whatever the umask (issue 55): only ciphertext, but object
/// counts, sizes and backup times are nobody else's business, as restic keeps them.
@Suite struct RepositoryModeTests {
    @Test func everyFileAndDirectoryOfARepositoryIsItsOwnersOnlyUnderUmask022() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source + "/docs", withIntermediateDirectories: true)
        try Data("a plain note".utf8).write(to: URL(fileURLWithPath: source + "/docs/a.txt"))
        // Past the chunking threshold: packs and a chunk list too.
        try Data((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2654435761 >> 13) }).write(to: URL(fileURLWithPath: source + "/big.bin"))
        #expect(try cli.run(["write", source + "/docs/protected.txt", "--class", "complete", "--passcode-file", passcode],
                            input: Data("protected".utf8)).status == 0)
        let repo = cli.file("repo")
        for _ in 0..<2 {
            let backup = try cli.run(["backup", source, repo, "-q"], shellPrefix: "umask 022")
            #expect(backup.status == 0, "\(backup.stderr)")
            try Data("changed".utf8).write(to: URL(fileURLWithPath: source + "/docs/a.txt"))
        }
        var open: [String] = []
        var items = 0
        let walker = FileManager.default.enumerator(atPath: repo)
        for relative in [""] + ((walker?.allObjects as? [String]) ?? []) {
            var st = stat()
            guard lstat(repo + "/" + relative, &st) == 0 else { continue }
            items += 1
            if st.st_mode & 0o077 != 0 { open.append("\(relative.isEmpty ? "." : relative) \(String(st.st_mode & 0o7777, radix: 8))") }
        }
        #expect(items > 10)
        #expect(open.isEmpty, "readable by others: \(open.prefix(8))")

        // A repository made before (group- and world-readable) is closed at its next backup.
        #expect(chmod(repo, 0o755) == 0 && chmod(repo + "/objects", 0o755) == 0)
        #expect(try cli.run(["backup", source, repo, "-q"], shellPrefix: "umask 022").status == 0)
        var st = stat()
        #expect(lstat(repo, &st) == 0 && st.st_mode & 0o077 == 0)
        #expect(lstat(repo + "/objects", &st) == 0 && st.st_mode & 0o077 == 0)
    }
}
