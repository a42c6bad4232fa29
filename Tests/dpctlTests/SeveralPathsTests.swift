import DataProtectionTestSupport
import Foundation
import Testing

/// Commands that take a path take several; `protect -R` checks before it changes anything; `ls`
/// shows what a class-managed database and a backup really do (issue 18).
@Suite struct SeveralPathsTests {
    @Test func catProtectExcludeAndIncludeTakeSeveralPaths() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        for (name, text) in [("a", "alpha "), ("b", "beta")] {
            #expect(try cli.run(["write", cli.file(name), "--class", "C", "--passcode-file", passcode], input: Data(text.utf8)).status == 0)
        }
        #expect(try cli.run(["cat", cli.file("a"), cli.file("b"), "--passcode-file", passcode]).out == "alpha beta")
        // --strict refuses before printing anything.
        let plain = cli.writeFile("plain", "bare")
        let strict = try cli.run(["cat", cli.file("a"), plain, "--strict", "--passcode-file", passcode])
        #expect(strict.status == 1 && strict.out.isEmpty && strict.stderr.contains("not a protected file"))

        #expect(try cli.run(["protect", cli.file("a"), cli.file("b"), plain, "--class", "complete", "--passcode-file", passcode]).status == 0)
        let listed = try cli.run(["ls", "--json", cli.file("a"), cli.file("b"), plain]).stdout
        let classes = try #require(try JSONSerialization.jsonObject(with: listed) as? [[String: Any]]).map { $0["class"] as? String }
        #expect(classes == ["complete (A)", "complete (A)", "complete (A)"])

        #expect(try cli.run(["exclude", cli.file("a"), cli.file("b")]).status == 0)
        let json = try cli.run(["exclusions", cli.work.path, "--json"])
        let entries = try #require(try JSONSerialization.jsonObject(with: json.stdout) as? [[String: Any]])
        #expect(entries.map { $0["path"] as? String } == [cli.file("a"), cli.file("b")] && entries.allSatisfy { $0["reason"] as? String == "marked" })
        #expect(!json.out.contains("\\/"))
        // One missing path: nothing is marked or unmarked.
        let missing = try cli.run(["include", cli.file("a"), cli.file("nope")])
        #expect(missing.status == 1)
        #expect(try cli.run(["exclusions", cli.work.path]).out == cli.file("a") + "\n" + cli.file("b") + "\n")
        #expect(try cli.run(["include", cli.file("a"), cli.file("b")]).status == 0)
        #expect(try cli.run(["exclusions", cli.work.path]).out.isEmpty)
    }

    /// A mark that cannot be set on a later path (an immutable file: `setxattr` fails with
    /// EPERM, even for root) puts the earlier paths back as they were, their tags included.
    @Test func excludeAndIncludeAreAllOrNothing() throws {
        let cli = CLI.make()
        let marked = cli.file("marked"), fresh = cli.file("fresh"), file = cli.writeFile("file", "f"), stuck = cli.writeFile("stuck", "s")
        for directory in [marked, fresh] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        #expect(try cli.run(["exclude", marked]).status == 0)
        guard (try? ChildProcess.run("chattr", ["+i", stuck]))?.status == 0 else { return }   // no chattr, or a file system without immutable files
        defer { _ = try? ChildProcess.run("chattr", ["-i", stuck]) }
        func state() throws -> String {
            try cli.run(["exclusions", cli.work.path]).out + ["marked", "fresh"].map {
                "\($0): \(FileManager.default.fileExists(atPath: cli.file($0) + "/CACHEDIR.TAG"))"
            }.joined(separator: ",")
        }
        let before = try state()
        #expect(before == marked + "\n" + "marked: true,fresh: false")

        let exclude = try cli.run(["exclude", fresh, file, marked, stuck])
        #expect(exclude.status == 1 && exclude.stderr.contains("stuck") && exclude.stderr.split(separator: "\n").count == 1, "\(exclude.stderr)")
        #expect(try state() == before)
        let include = try cli.run(["include", marked, fresh, stuck])
        #expect(include.status == 1 && include.stderr.contains("stuck"), "\(include.stderr)")
        #expect(try state() == before)
    }

    @Test func protectRecursiveChecksFirstAndChangesNothingWhileLocked() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let tree = cli.file("tree")
        try FileManager.default.createDirectory(atPath: tree + "/sub", withIntermediateDirectories: true)
        #expect(try cli.run(["write", tree + "/sub/a.txt", "--class", "complete", "--passcode-file", passcode], input: Data("a".utf8)).status == 0)
        #expect(try cli.run(["write", tree + "/d.txt", "--class", "none"], input: Data("d".utf8)).status == 0)
        let before = try cli.run(["ls", "-R", tree]).out

        // Locked (a new run, before first unlock): class A cannot be unwrapped.
        let locked = try cli.run(["protect", "-R", tree, "--class", "until-first-unlock"])
        #expect(locked.status == 3, "\(locked.stderr)")
        #expect(locked.stderr.split(separator: "\n").count == 1 && locked.stderr.contains(tree + "/"), "\(locked.stderr)")
        #expect(try cli.run(["ls", "-R", tree]).out == before, "nothing changed, no directory default either")

        // Raising D to A needs class A's key to wrap: refused too, nothing changed.
        let raising = try cli.run(["protect", tree + "/d.txt", "--class", "complete"])
        #expect(raising.status == 3 && raising.stderr.contains("d.txt"))
        #expect(try cli.run(["ls", "-R", tree]).out == before)

        // Several trees: every one is checked before the first changes.
        let other = cli.file("other")
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        #expect(try cli.run(["write", other + "/plain.txt", "--class", "none"], input: Data("p".utf8)).status == 0)
        let otherBefore = try cli.run(["ls", "-R", other]).out
        let both = try cli.run(["protect", "-R", other, tree, "--class", "until-first-unlock"])
        let otherAfter = try cli.run(["ls", "-R", other]).out
        #expect(both.status == 3 && otherAfter == otherBefore, "\(both.stderr)")
        // A path that does not exist: nothing changed either.
        #expect(try cli.run(["protect", other + "/plain.txt", cli.file("missing"), "--class", "B"]).status == 1)
        #expect(try cli.run(["ls", "-R", other]).out == otherBefore)

        // A link below the top is never followed, not even by the check: a link to a class A
        // file does not stop a tree of class D files while locked.
        let linked = cli.file("linked")
        try FileManager.default.createDirectory(atPath: linked, withIntermediateDirectories: true)
        #expect(try cli.run(["write", linked + "/d.txt", "--class", "none"], input: Data("d".utf8)).status == 0)
        try FileManager.default.createSymbolicLink(atPath: linked + "/to-a", withDestinationPath: tree + "/sub/a.txt")
        let throughLink = try cli.run(["protect", "-R", linked, "--class", "complete-unless-open"])
        #expect(throughLink.status == 0 && throughLink.out.contains("1 files changed"), "\(throughLink.stderr)")

        let unlocked = try cli.run(["protect", "-R", tree, "--class", "until-first-unlock", "--passcode-file", passcode])
        #expect(unlocked.status == 0 && unlocked.out.contains("2 files changed"), "\(unlocked.stderr)")
    }

    @Test func lsShowsADatabaseByItsClassAndWhatABackupLeavesOut() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["app", "install", "com.example.ls"]).status == 0)
        let info = try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.ls", "--json"]).stdout) as? [String: Any]
        let container = try #require(info?["container"] as? String)
        let notes = container + "/Documents/notes.db"
        #expect(try cli.run(["sql", notes, "--class", "A", "--passcode-file", passcode, "CREATE TABLE t(x)"]).status == 0)
        try Data("cached".utf8).write(to: URL(fileURLWithPath: container + "/Library/Caches/c.bin"))

        let documents = try cli.run(["ls", "--json", container + "/Documents"]).stdout
        let rows = try #require(try JSONSerialization.jsonObject(with: documents) as? [[String: Any]])
        let db = try #require(rows.first { $0["name"] as? String == "notes.db" })
        #expect(db["class"] as? String == "complete (A), database", "\(rows)")
        #expect(rows.first { $0["name"] as? String == "notes.db-dpkey" }?["class"] as? String == "complete (A)")

        let caches = try cli.run(["ls", "--json", container + "/Library/Caches", container + "/tmp", container + "/Documents"]).stdout
        let items = try #require(try JSONSerialization.jsonObject(with: caches) as? [[String: Any]])
        func backup(_ suffix: String) -> String? { items.first { ($0["name"] as? String)?.hasSuffix(suffix) == true }?["backup"] as? String }
        #expect(backup("Library/Caches/")?.hasPrefix("no") == true, "\(items)")
        #expect(backup("Caches/c.bin")?.hasPrefix("no") == true, "\(items)")
        #expect(backup("/tmp/")?.hasPrefix("no") == true)
        #expect(backup("Documents/") == "yes")
        // A plain database beside a stale key file is shown as what it is.
        let stale = container + "/Documents/stale.db"
        #expect(try cli.run(["sql", stale, "CREATE TABLE t(x)"]).status == 0)
        try FileManager.default.copyItem(atPath: notes + "-dpkey", toPath: stale + "-dpkey")
        let staleRow = try JSONSerialization.jsonObject(with: try cli.run(["ls", "--json", stale]).stdout) as? [[String: Any]]
        #expect(staleRow?.first?["class"] as? String == "plain (unprotected)", "\(String(describing: staleRow))")

        // While locked, re-protecting the container checks first: its default does not change.
        func defaultClass() throws -> String? {
            (try JSONSerialization.jsonObject(with: try cli.run(["app", "info", "com.example.ls", "--json"]).stdout) as? [String: Any])?["defaultProtection"] as? String
        }
        let defaultBefore = try defaultClass()
        let reprotect = try cli.run(["app", "set-protection", "com.example.ls", "D", "--reprotect"])
        #expect(reprotect.status == 3, "\(reprotect.stderr)")
        #expect(try defaultClass() == defaultBefore && defaultBefore != nil)

        // What ls says is what backup does.
        let log = try cli.run(["backup", container, cli.file("repo"), "--dry-run"]).out
        #expect(log.contains("Library/Caches") && !log.contains("notes.db"))
    }
}
