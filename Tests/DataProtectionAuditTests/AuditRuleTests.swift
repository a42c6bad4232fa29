@testable import DataProtectionAudit
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSQLite
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// The rules' byte-level judgements on real files: no false positive from a real encrypted WAL,
/// links judged without being followed, secrets in a dictionary, names that are not UTF-8.
@Suite struct AuditRuleTests {
    /// A WAL that SQLCipher (our VFS) wrote holds sealed pages: not reported. A plaintext page is.
    @Test func anEncryptedWALIsNotMistakenForAPlaintextOne() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let path = device.dir.appendingPathComponent("store.sqlite")
        let database = try await ProtectedDatabase.open(at: path, keybag: device.keybag, protection: .completeUntilFirstUserAuthentication)
        try await database.write { db in
            try db.execute(sql: "PRAGMA wal_autocheckpoint = 0")
            try db.execute(sql: "CREATE TABLE notes(body TEXT)")
            for i in 0..<50 { try db.execute(sql: "INSERT INTO notes VALUES (?)", arguments: ["a row of plaintext, number \(i)"]) }
        }
        let wal = try FileManager.default.attributesOfItem(atPath: path.path + "-wal")[.size] as? Int ?? 0
        #expect(wal > 4096, "the rows are in the WAL while the database is open")
        let report = try Auditor().audit(tree: device.dir)
        #expect(report.findings.isEmpty, "\(report.findings)")
        try await database.close()

        // The heuristic itself: plaintext b-tree pages pass, random ones do not.
        var leaf = [UInt8](repeating: 0, count: 4096)
        leaf[0] = 13; leaf[3] = 0; leaf[4] = 2; leaf[5] = 0x0F; leaf[6] = 0x00
        #expect(SQLitePages.looksLikePlaintextPage(leaf, pageNumber: 2))
        var generator = SystemRandomNumberGenerator()
        let falsePositives = (0..<2_000).filter { _ in
            var page = [UInt8](repeating: 0, count: 4096)
            page.withUnsafeMutableBytes { raw in
                for i in 0..<512 { raw.storeBytes(of: generator.next() as UInt64, toByteOffset: i * 8, as: UInt64.self) }
            }
            return SQLitePages.looksLikePlaintextPage(page, pageNumber: 2)
        }.count
        #expect(falsePositives <= 1, "random (sealed) pages are not plaintext")
    }

    @Test func linksAreJudgedByWhatTheySayNeverFollowed() throws {
        let root = "/data/c"
        #expect(TreeWalk.leavesRoot(target: "../.Inbox", linkDirectory: "Documents", root: root) == nil)
        #expect(TreeWalk.leavesRoot(target: "../../x", linkDirectory: "Documents", root: root) != nil)
        #expect(TreeWalk.leavesRoot(target: "/etc/passwd", linkDirectory: "", root: root) != nil)
        #expect(TreeWalk.leavesRoot(target: "/data/c/Library/x", linkDirectory: "Documents", root: root) == nil)
        #expect(TreeWalk.leavesRoot(target: "/data/c/../d/x", linkDirectory: "", root: root) != nil)
        #expect(TreeWalk.leavesRoot(target: "/data/cc/x", linkDirectory: "", root: root) != nil)

        // A hard link whose other name is outside the tree; one whose names are both inside is fine.
        let base = temporaryDirectory().path
        let tree = base + "/tree"
        try FileManager.default.createDirectory(atPath: tree + "/a", withIntermediateDirectories: true)
        try Data().write(to: URL(fileURLWithPath: base + "/outside"))
        #expect(link(base + "/outside", tree + "/a/inside") == 0)
        try Data().write(to: URL(fileURLWithPath: tree + "/one"))
        #expect(link(tree + "/one", tree + "/a/two") == 0)
        let found = try Auditor().audit(tree: URL(fileURLWithPath: tree)).findings
        #expect(found.map(\.rule) == [.linkLeavesContainer] && found.first?.path == tree + "/a/inside", "\(found)")
    }

    @Test func secretsInADictionaryAreFoundAndOrdinarySettingsAreNot() {
        let findings = Auditor.secrets(inPreferences: [
            "theme": "dark", "author": "Ann", "lastSync": 1_700_000_000,
            "account": ["password": "hunter2", "name": "ann"],
            "sessionCookie": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "keys": ["-----BEGIN EC PRIVATE KEY-----\nMHcC…\n-----END EC PRIVATE KEY-----"],
            "emptyToken": "",
        ], at: "/g/Library/Preferences/group.x.plist")
        #expect(Set(findings.map(\.detail)) == [
            "key \"account.password\": its key names a password",
            "key \"keys[0]\": its value is a PEM private key",
            "key \"sessionCookie\": its value is a JSON Web Token",
        ])
        #expect(findings.allSatisfy { $0.rule == .secretInGroupPreferences && !$0.fix.isAutomatic })
    }

    /// FORMAT.md §13.3's vector, and a name that is not UTF-8 found and reported intact.
    @Test func namesThatAreNotUTF8SurviveIntoTheReports() throws {
        let name = LosslessPath.string(fromBytes: [0x61, 0x20, 0x62, 0x2F, 0xE9, 0x2E, 0x74, 0x78, 0x74])
        #expect(AuditReport.percentEncoded(name) == "a%20b/%E9.txt")
        let tree = temporaryDirectory().path
        try FileManager.default.createDirectory(atPath: tree + "/a b", withIntermediateDirectories: true)
        let odd = LosslessPath.string(fromBytes: Array((tree + "/a b/").utf8) + [0xE9] + Array(".txt".utf8))
        let fd = try LosslessPath.withCString(odd) { open($0, O_WRONLY | O_CREAT, 0o600) }
        #expect(fd >= 0)
        _ = write(fd, "plain", 5)
        close(fd)
        let report = try Auditor().audit(tree: URL(fileURLWithPath: tree))
        #expect(report.findings.map(\.path) == [odd])
        let sarif = try #require(try JSONSerialization.jsonObject(with: report.sarif(base: tree)) as? [String: Any])
        let runs = try #require(sarif["runs"] as? [[String: Any]])
        let results = try #require(runs.first?["results"] as? [[String: Any]])
        let location = ((results.first?["locations"] as? [[String: Any]])?.first?["physicalLocation"] as? [String: Any])?["artifactLocation"] as? [String: Any]
        #expect(location?["uri"] as? String == "a%20b/%E9.txt")
    }
}

/// `--fix` as an app would attack it: the item swapped for a link after the audit, a data root
/// inside the audited tree, links that leave only through other links, a forged header.
@Suite struct AuditAttackTests {
    @Test func aFixNeverFollowsALinkSwappedInAfterTheAudit() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        let app = try await manager.install(AppIdentifier("com.example.swapper"), usesProtectedFiles: true)   // its DP101 is fixed automatically
        let victim = device.dir.appendingPathComponent("victim.txt").path
        try Data("someone else's".utf8).write(to: URL(fileURLWithPath: victim))
        chmod(victim, 0o644)
        let sub = app.documents.appendingPathComponent("sub").path
        try FileManager.default.createDirectory(atPath: sub, withIntermediateDirectories: true)
        try Data("plain".utf8).write(to: URL(fileURLWithPath: sub + "/victim.txt"))
        chmod(sub + "/victim.txt", 0o666)
        let report = try Auditor().audit(tree: app.url)
        #expect(Set(report.findings.map(\.rule)) == [.plainFile, .writableByOthers])

        // The app swaps the directory for a link to where the victim lives, then --fix runs.
        try FileManager.default.removeItem(atPath: sub)
        try FileManager.default.createSymbolicLink(atPath: sub, withDestinationPath: device.dir.path)
        let outcomes = await AuditFixer(manager: manager).apply(report.findings)
        #expect(outcomes.count == 2 && outcomes.allSatisfy { $0.error is AuditFixError }, "\(outcomes.map { String(describing: $0.error) })")
        #expect(try Data(contentsOf: URL(fileURLWithPath: victim)) == Data("someone else's".utf8))
        var st = stat()
        #expect(stat(victim, &st) == 0 && st.st_mode & 0o777 == 0o644)

        // The same file replaced by another one at the same name: not the item audited, not touched.
        try FileManager.default.removeItem(atPath: sub)
        try FileManager.default.createDirectory(atPath: sub, withIntermediateDirectories: true)
        try Data("plain".utf8).write(to: URL(fileURLWithPath: sub + "/victim.txt"))
        let again = try Auditor().audit(tree: app.url)
        try FileManager.default.removeItem(atPath: sub + "/victim.txt")
        try Data("replaced".utf8).write(to: URL(fileURLWithPath: sub + "/victim.txt"))
        let replaced = await AuditFixer(manager: manager).apply(again.findings)
        #expect(replaced.allSatisfy { ($0.error as? AuditFixError).map { "\($0)".contains("another item is there now") } == true })
        #expect(ProtectedFileHeader.looksProtected(Array(try Data(contentsOf: URL(fileURLWithPath: sub + "/victim.txt")))) == false)
    }

    @Test func aDataRootInsideTheTreeIsNeverWalkedOrConverted() throws {
        let world = try AppWorld.make()
        let parent = URL(fileURLWithPath: world.cli.root).deletingLastPathComponent().path
        let secret = try Data(contentsOf: URL(fileURLWithPath: world.cli.root + "/device.secret"))
        let fixed = try world.dpctl(["audit", parent, "--fix", "--passcode-file", world.passcode])
        #expect(try Data(contentsOf: URL(fileURLWithPath: world.cli.root + "/device.secret")) == secret, "\(fixed.stderr)")
        #expect(try world.dpctl(["status"]).status == 0, "the device still opens")
        let direct = try world.dpctl(["audit", world.cli.root])
        #expect(direct.status == 1 && direct.stderr.contains("is a data root"), "\(direct.stderr)")
    }

    @Test func linksThatLeaveThroughOtherLinksAndForgedHeadersAreFound() throws {
        let tree = temporaryDirectory().path
        try FileManager.default.createSymbolicLink(atPath: tree + "/s", withDestinationPath: ".")
        try FileManager.default.createSymbolicLink(atPath: tree + "/a", withDestinationPath: "s/..")
        var forged = [UInt8](repeating: 0, count: 400)
        forged.replaceSubrange(0..<8, with: [0x89, 0x44, 0x50, 0x46, 0x0D, 0x0A, 0x1A, 0x0A])
        forged.replaceSubrange(200..<220, with: Array("secret in plaintext!".utf8))
        try Data(forged).write(to: URL(fileURLWithPath: tree + "/looks-protected"))
        let found = try Auditor().audit(tree: URL(fileURLWithPath: tree)).findings
        #expect(Set(found.map { "\($0.rule.id) \(URL(fileURLWithPath: $0.path).lastPathComponent)" }) == ["DP601 a", "DP101 looks-protected"], "\(found)")
    }
}
