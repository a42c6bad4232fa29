@testable import DataProtectionAudit
import DataProtectionTestSupport
import Foundation
import Testing

/// `dpctl audit` on a device where one instance of every finding was planted — through `dpctl`,
/// as the mistakes happen — and on clean ones: exactly the planted findings, none on a clean
/// device, `--fix` leaving only what needs a person, SARIF that the SARIF 2.1.0 schema accepts.
@Suite(.serialized) struct AuditTests {
    let owner = "com.example.owner"          // class A, in a group left at the default
    let browser = "com.example.browser"      // exposes its Documents
    let open = "com.example.open"            // default class None
    let ownerGroup = "group.com.example.owner"
    let unsetGroup = "group.com.example.unset"

    struct Found: Hashable, CustomStringConvertible {
        let rule: String
        let path: String
        var description: String { "\(rule) \(path)" }
    }

    /// Runs `dpctl audit ARGS --json` and returns its status and findings (paths relative to `base`).
    func audit(_ world: AppWorld, _ args: [String], base: String) throws -> (status: Int32, found: Set<Found>, stderr: String) {
        let result = try world.dpctl(["audit"] + args + ["--json"])
        try #require(result.status == 0 || result.status == 6, "dpctl audit failed: \(result.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any], "\(result.stderr)")
        let findings = try #require(object["findings"] as? [[String: Any]])
        let found = findings.map { f in
            let path = f["path"] as? String ?? ""
            return Found(rule: f["rule"] as? String ?? "", path: path.hasPrefix(base + "/") ? String(path.dropFirst(base.count + 1)) : path)
        }
        return (result.status, Set(found), result.stderr)
    }

    /// A device with one planted instance of every rule, and what each should be reported as.
    func plantedWorld() throws -> (AppWorld, Set<Found>, ownerContainer: String) {
        let world = try AppWorld.make()
        let unlock = ["--passcode-file", world.passcode]
        let root = world.cli.root
        func relative(_ path: String) -> String { String(path.dropFirst(root.count + 1)) }
        let a = try world.install(owner, ["--default-protection", "complete", "--group", ownerGroup, "--uses-protected-files"])
        let b = try world.install(browser, ["--document-browser", "--group", unsetGroup, "--uses-protected-files"])
        let o = try world.install(open, ["--default-protection", "none"])
        let unset = try world.groupContainer(of: browser, unsetGroup)
        let shared = try world.groupContainer(of: owner, ownerGroup)
        var expected: Set<Found> = []
        func plant(_ rule: String, _ path: String) { expected.insert(Found(rule: rule, path: relative(path))) }

        // DP101: a file written with plain tools; DP102 and DP103: classes weaker than the container's.
        try Data("plain".utf8).write(to: URL(fileURLWithPath: a + "/Documents/plain.txt"))
        plant("DP101", a + "/Documents/plain.txt")
        #expect(try world.dpctl(["write", a + "/Documents/none.txt", "--class", "D"] + unlock, input: Data("none".utf8)).status == 0)
        plant("DP102", a + "/Documents/none.txt")
        #expect(try world.dpctl(["write", a + "/Documents/weak.txt", "--class", "C"] + unlock, input: Data("weak".utf8)).status == 0)
        plant("DP103", a + "/Documents/weak.txt")
        plant("DP104", o)

        // DP201: a real plaintext SQLite database. DP202: an encrypted one keyed in class C.
        // DP203: a plaintext WAL (a real one, from SQLite) left next to the encrypted database.
        let plainDB = a + "/Library/plain.sqlite", encryptedDB = a + "/Library/secure.sqlite"
        #expect(try world.dpctl(["sql", encryptedDB, "create table t(x)", "--class", "C"] + unlock).status == 0)
        try python("""
            import sqlite3, shutil, sys
            c = sqlite3.connect(sys.argv[1]); c.execute("create table notes(body)"); c.execute("insert into notes values ('plaintext row')"); c.commit(); c.close()
            w = sqlite3.connect(sys.argv[3]); w.execute("pragma journal_mode=wal"); w.execute("pragma wal_autocheckpoint=0")
            w.execute("create table notes(body)"); w.execute("insert into notes values ('row in the wal')"); w.commit()
            shutil.copyfile(sys.argv[3] + "-wal", sys.argv[2] + "-wal"); w.close()
            """, [plainDB, encryptedDB, NSTemporaryDirectory() + "audit-wal-\(UUID().uuidString).sqlite"])
        plant("DP201", plainDB)
        // DP204: an SQLCipher database keyed by its app (a passphrase the app keeps elsewhere).
        let ownKeyDB = a + "/Library/own-key.sqlite", passphrase = NSTemporaryDirectory() + "audit-pw-\(UUID().uuidString)"
        try Data("the app's own passphrase".utf8).write(to: URL(fileURLWithPath: passphrase))
        #expect(try world.dpctl(["sql", ownKeyDB, "--passphrase-file", passphrase, "create table t(x)"]).status == 0)
        plant("DP204", ownKeyDB)
        // DP604: a FIFO among the app's data.
        #expect(mkfifo(a + "/Library/pipe", 0o600) == 0)
        plant("DP604", a + "/Library/pipe")
        plant("DP202", encryptedDB + "-dpkey")
        plant("DP203", encryptedDB + "-wal")

        // DP301: a large protected file in Documents, backed up. DP302: a cache directory whose tag was lost.
        #expect(try world.dpctl(["write", a + "/Documents/offline.bin"] + unlock, input: Data(count: 1_500_000)).status == 0)
        plant("DP301", a + "/Documents/offline.bin")
        try FileManager.default.createDirectory(atPath: a + "/Library/Application Support/Downloads", withIntermediateDirectories: true)
        #expect(try world.dpctl(["exclude", a + "/Library/Application Support/Downloads", "--no-cachedir-tag"]).status == 0)
        plant("DP302", a + "/Library/Application Support/Downloads")

        // DP401: a group never given a class; DP402: a group weaker than its class-A member.
        // DP403: a token in a group's preferences written in the clear (also DP101).
        plant("DP401", unset)
        plant("DP402", shared)
        let prefs = unset + "/Library/Preferences/\(unsetGroup).plist"
        try PropertyListSerialization.data(fromPropertyList: ["apiToken": "tok_live_4eC39HqLyjWDarjtT1zdp7dc", "theme": "dark"], format: .xml, options: 0)
            .write(to: URL(fileURLWithPath: prefs))
        plant("DP403", prefs)
        plant("DP101", prefs)

        // DP501: the browser's Documents; DP502: a persistent write grant without expiry;
        // DP503: a grant whose recipient is gone; DP504: an Inbox copy left for ten days.
        plant("DP501", b + "/Documents")
        #expect(try world.dpctl(["write", b + "/Documents/report.txt"] + unlock, input: Data("report".utf8)).status == 0)
        #expect(try world.dpctl(["grant", "--from", browser, "--to", owner, "Documents/report.txt", "--write", "--persistent"]).status == 0)
        plant("DP502", b + "/Documents/report.txt")
        #expect(try world.dpctl(["grant", "--from", browser, "--to", owner, "Documents/report.txt", "--read", "--expires", "1h"]).status == 0)
        let grants = root + "/Sharing/Grants"
        let orphan = try #require(try FileManager.default.contentsOfDirectory(atPath: grants).first { name in
            let plist = try? PropertyListSerialization.propertyList(from: Data(contentsOf: URL(fileURLWithPath: grants + "/" + name)), format: nil) as? [String: Any]
            return plist?["Expires"] != nil
        })
        var record = try #require(try PropertyListSerialization.propertyList(from: Data(contentsOf: URL(fileURLWithPath: grants + "/" + orphan)), format: nil) as? [String: Any])
        record["RecipientContainer"] = UUID().uuidString
        try PropertyListSerialization.data(fromPropertyList: record, format: .binary, options: 0).write(to: URL(fileURLWithPath: grants + "/" + orphan))
        plant("DP503", b + "/Documents/report.txt")
        #expect(try world.dpctl(["share", "open-in", "--from", browser, "--to", owner, "Documents/report.txt"] + unlock).status == 0)
        let inboxFile = a + "/.Inbox/report.txt"
        try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-10 * 86_400)], ofItemAtPath: inboxFile)
        plant("DP504", inboxFile)

        // DP601: a link out of the container; DP602: a file every user can write; DP603: a loose device secret.
        try FileManager.default.createSymbolicLink(atPath: a + "/Documents/passwd", withDestinationPath: "/etc/passwd")
        plant("DP601", a + "/Documents/passwd")
        #expect(try world.dpctl(["write", a + "/Documents/mode.txt"] + unlock, input: Data("mode".utf8)).status == 0)
        chmod(a + "/Documents/mode.txt", 0o666)
        plant("DP602", a + "/Documents/mode.txt")
        chmod(root + "/device.secret", 0o644)
        plant("DP603", root + "/device.secret")
        return (world, expected, a)
    }

    @Test func theAuditFindsExactlyThePlantedMistakes() throws {
        let (world, expected, _) = try plantedWorld()
        let (status, found, stderr) = try audit(world, ["--large-file", "1"], base: world.cli.root)
        #expect(status == 6, "\(stderr)")
        #expect(found.subtracting(expected).isEmpty, "false positives: \(found.subtracting(expected).sorted { $0.description < $1.description })")
        #expect(expected.subtracting(found).isEmpty, "missed: \(expected.subtracting(found).sorted { $0.description < $1.description })")
        #expect(Set(found.map(\.rule)) == Set(AuditRule.allCases.map(\.id)), "one planted instance of every rule")

        // The threshold decides what is reported and the exit status.
        let high = try audit(world, ["--large-file", "1", "--min-severity", "high"], base: world.cli.root)
        #expect(high.found == found.filter { AuditRule(rawValue: $0.rule)?.severity == .high })
        // A table for people, with the fix of each.
        let table = try world.dpctl(["audit", "--large-file", "1"])
        #expect(table.status == 6 && table.out.contains("DP203") && table.out.contains("dpctl protect"))
    }

    @Test func aCleanDeviceAndACleanTreeHaveNoFindings() throws {
        let world = try AppWorld.make()
        let unlock = ["--passcode-file", world.passcode]
        let a = try world.install(owner, ["--default-protection", "complete", "--group", ownerGroup, "--uses-protected-files"])
        #expect(try world.dpctl(["group", "set-protection", ownerGroup, "complete"] + unlock).status == 0)
        #expect(try world.dpctl(["write", a + "/Documents/note.txt"] + unlock, input: Data("note".utf8)).status == 0)
        #expect(try world.dpctl(["sql", a + "/Library/store.sqlite", "create table t(x)", "--class", "A"] + unlock).status == 0)
        #expect(try world.dpctl(["write", a + "/Library/Caches/big.bin"] + unlock, input: Data(count: 1_500_000)).status == 0)
        let (status, found, stderr) = try audit(world, ["--large-file", "1"], base: world.cli.root)
        #expect(status == 0 && found.isEmpty, "\(found) \(stderr)")
        #expect(try world.dpctl(["audit"]).out.hasPrefix("no findings at or above low"))

        // Any directory, without a container: plain files are found, protected ones are not.
        let tree = temporaryDirectory().path
        #expect(try world.dpctl(["write", tree + "/protected.txt"] + unlock, input: Data("p".utf8)).status == 0)
        #expect(try audit(world, [tree], base: tree).found.isEmpty)
        try FileManager.default.createDirectory(atPath: tree + "/sub", withIntermediateDirectories: true)
        try Data("p".utf8).write(to: URL(fileURLWithPath: tree + "/sub/plain.txt"))
        let plain = try audit(world, [tree], base: tree)
        #expect(plain.status == 6 && plain.found == [Found(rule: "DP101", path: "sub/plain.txt")])
    }

    @Test func fixRepairsWhatIsSafeLosesNothingAndLeavesTheRestForAPerson() throws {
        let (world, expected, a) = try plantedWorld()
        let root = world.cli.root
        let before = try FileManager.default.subpathsOfDirectory(atPath: a).sorted()
        let fixed = try world.dpctl(["audit", "--fix", "--large-file", "1", "--passcode-file", world.passcode, "--json"])
        #expect(fixed.status == 6, "findings that need a person remain: \(fixed.stderr)")
        #expect(fixed.stderr.contains("fixing") && fixed.stderr.contains("dpctl protect"), "the fixes are shown: \(fixed.stderr)")
        // Left: what would delete data or change what an app may do. (The group's preferences are
        // protected now, so their secret is no longer readable to an audit: DP403 goes with DP101.)
        let manual: Set<String> = ["DP201", "DP203", "DP204", "DP501", "DP502", "DP504", "DP601", "DP604"]
        let (_, after, _) = try audit(world, ["--large-file", "1"], base: root)
        #expect(after == expected.filter { manual.contains($0.rule) }, "\(after.sorted { $0.description < $1.description })")
        // Nothing was deleted, and what was re-protected reads back the same.
        let afterFix = Set(try FileManager.default.subpathsOfDirectory(atPath: a))
        #expect(Set(before).isSubset(of: afterFix), "deleted: \(Set(before).subtracting(afterFix))")
        #expect(afterFix.subtracting(before) == ["Library/Application Support/Downloads/CACHEDIR.TAG"], "the lost tag is back, nothing else is new")
        #expect(try world.dpctl(["cat", a + "/Documents/plain.txt", "--passcode-file", world.passcode]).out == "plain")
        #expect(try world.dpctl(["cat", a + "/Documents/none.txt", "--passcode-file", world.passcode]).out == "none")
        var st = stat()
        #expect(stat(root + "/device.secret", &st) == 0 && st.st_mode & 0o777 == 0o600)

        // A tree of only fixable mistakes is clean after one --fix, and a second audit says so.
        let tree = temporaryDirectory().path
        try Data("plain".utf8).write(to: URL(fileURLWithPath: tree + "/plain.txt"))
        chmod(tree + "/plain.txt", 0o666)
        #expect(try audit(world, [tree], base: tree).found == [Found(rule: "DP101", path: "plain.txt"), Found(rule: "DP602", path: "plain.txt")])
        let once = try world.dpctl(["audit", tree, "--fix", "--passcode-file", world.passcode])
        #expect(once.status == 0, "\(once.stdout) \(once.stderr)")
        #expect(try world.dpctl(["audit", tree]).out.hasPrefix("no findings"))
    }

    @Test func theSARIFLogValidatesAgainstTheSARIF210Schema() throws {
        let (world, _, _) = try plantedWorld()
        let result = try world.dpctl(["audit", "--sarif", "--large-file", "1"])
        #expect(result.status == 6)
        let log = temporaryDirectory().appendingPathComponent("audit.sarif")
        try result.stdout.write(to: log)
        let schema = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("oracle/sarif-schema-2.1.0.json").path
        let check = try runOracle("sarif_validate.py", [schema, log.path])
        #expect(check.status == 0, "\(check.output)")
        #expect(check.output.contains("valid SARIF 2.1.0: 1 run, 21 rules,"), "\(check.output)")
        // A broken log is refused by the same check (the oracle can fail).
        var object = try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any])
        object["version"] = "2.0.0"
        try JSONSerialization.data(withJSONObject: object).write(to: log)
        #expect(try runOracle("sarif_validate.py", [schema, log.path]).status != 0)
    }

    // MARK: - Helpers

    func python(_ script: String, _ args: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script] + args
        try process.run()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "python failed")
    }

    func runOracle(_ name: String, _ args: [String]) throws -> (status: Int32, output: String) {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("oracle/" + name).path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: oraclePython)
        process.arguments = [script] + args
        let out = Pipe()
        process.standardOutput = out
        process.standardError = out
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
