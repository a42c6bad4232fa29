import DataProtection
import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// A class-managed database is two ordinary items for the backup engine — the SQLCipher file
/// and its protected key file — so it backs up while locked and restores on another device.
@Suite struct DatabaseBackupTests {
    @Test func aClassADatabaseRestoresOnAnotherDevice() async throws {
        let device = try await TestDevice.make()
        let container = device.dir.appendingPathComponent("container/Documents")
        try FileManager.default.createDirectory(at: container, withIntermediateDirectories: true)
        let url = container.appendingPathComponent("chat.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .complete, mode: .queue)
        try await ProtectedDatabaseTests.makeNotes(db, 500)
        try await db.close()
        try await device.keybag.setBackupPassword("backup password")

        // Backed up while locked: the engine never needs class A.
        await device.lockPastGrace()
        let repository = BackupRepository(url: device.dir.appendingPathComponent("repo"))
        _ = try await BackupEngine(source: device.dir.appendingPathComponent("container"), repository: repository,
                                   files: ProtectedFileManager(keybag: device.keybag)).run()
        let backup = try FileManager.default.contentsOfDirectory(at: repository.url.appendingPathComponent("backups"), includingPropertiesForKeys: nil)
            .first { !$0.lastPathComponent.hasSuffix(".incomplete") }!

        let other = try await Keybag.create(root: device.dir.appendingPathComponent("device-2").path, passcode: "567890",
                                            kdf: .insecureFastForTesting, clock: ManualClock())
        let restored = device.dir.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: backup).restore(to: restored, files: ProtectedFileManager(keybag: other), password: "backup password")
        let copy = try await ProtectedDatabase.open(at: restored.appendingPathComponent("Documents/chat.db"), keybag: other)
        #expect(copy.protectionClass == .complete)
        #expect(try await ProtectedDatabaseTests.count(copy) == 500)
        try await copy.close()
    }
}

/// A class-managed database is stored as it is, cut at its pages, when its key is available: a
/// backup after 1 % of its pages were rewritten adds about 1 % of its size (target: at most 5 %),
/// and it restores byte for byte. Only pages that authenticate under the key are stored raw.
@Suite struct IncrementalDatabaseBackupTests {
    static func engine(_ device: TestDevice, source: URL, repository: BackupRepository) -> BackupEngine {
        var engine = BackupEngine(source: source, repository: repository, files: device.files)
        let keybag = device.keybag
        engine.encryptedDatabases = { url in
            await DatabasePageCheck(forDatabaseAt: url, keybag: keybag).map { EncryptedPageCheck(pageSize: $0.pageSize, authenticates: $0.authenticates) }
        }
        return engine
    }

    @Test func aDatabaseWithOnePercentOfItsPagesRewrittenCostsAboutThatMuch() async throws {
        let device = try await TestDevice.make()
        let source = device.dir.appendingPathComponent("container")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        let url = source.appendingPathComponent("mail.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .completeUntilFirstUserAuthentication, mode: .queue)
        // About one row per 4 KiB page: 4,000 rows, 16 MB.
        let rows = 4000
        try await db.write { db in
            try db.execute(sql: "CREATE TABLE message(id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            for i in 1...rows { try db.execute(sql: "INSERT INTO message(id, body) VALUES (?, randomblob(3000))", arguments: [i]) }
        }
        try await db.close()
        let repository = BackupRepository(url: device.dir.appendingPathComponent("repo"))
        let engine = Self.engine(device, source: source, repository: repository)
        let first = try await engine.run()
        let afterFirst = regularFileBytes(under: repository.url)
        let databaseSize = Int64(try FileManager.default.attributesOfItem(atPath: url.path)[.size] as! Int)
        #expect(databaseSize > 12 << 20)

        // 1 % of the rows (so about 1 % of the pages) rewritten.
        let changed = Set((0..<rows / 100).map { _ in Int.random(in: 1...rows) })
        let reopened = try await ProtectedDatabase.open(at: url, keybag: device.keybag, mode: .queue)
        try await reopened.write { db in
            for id in changed { try db.execute(sql: "UPDATE message SET body = randomblob(3000) WHERE id = ?", arguments: [id]) }
        }
        let expected = try await reopened.read { db in try Data.fetchAll(db, sql: "SELECT body FROM message ORDER BY id") }
        try await reopened.close()
        let second = try await engine.run()
        let growth = regularFileBytes(under: repository.url) - afterFirst
        #expect(growth <= databaseSize / 20, "the second backup added \(growth) bytes for a \(databaseSize)-byte database")
        #expect(growth >= Int64(changed.count) * 4096)

        let backup = repository.url.appendingPathComponent("backups/\(second.backup)")
        let manifest = try await RestoreEngine(backup: backup).manifest(files: device.files, password: nil)
        let entry = try #require(try manifest.entries().first { $0.path == "mail.db" })
        #expect(entry.encryptedDatabase && entry.chunked && !entry.sealed)
        // Restored as it was: the same ciphertext, opened with its restored key file.
        let restored = device.dir.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: backup).restore(to: restored, files: device.files, password: nil)
        #expect(try Data(contentsOf: restored.appendingPathComponent("mail.db")) == (try Data(contentsOf: url)))
        let copy = try await ProtectedDatabase.open(at: restored.appendingPathComponent("mail.db"), keybag: device.keybag, mode: .queue)
        #expect(try await copy.read { db in try Data.fetchAll(db, sql: "SELECT body FROM message ORDER BY id") } == expected)
        #expect(try await copy.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") } == "ok")
        try await copy.close()
        _ = first
    }

    /// A file that passes for a database — a genuine page 1 and key file — with plaintext after it
    /// is sealed, never stored as it is: no byte of the plaintext reaches the repository.
    @Test func plaintextDressedAsADatabaseIsSealed() async throws {
        let device = try await TestDevice.make()
        let source = device.dir.appendingPathComponent("container")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        let genuine = device.dir.appendingPathComponent("genuine.db")
        let db = try await ProtectedDatabase.open(at: genuine, keybag: device.keybag, mode: .queue)
        try await ProtectedDatabaseTests.makeNotes(db, 50)
        try await db.close()
        let marker = Array("PLAINTEXT-THAT-MUST-NOT-LEAK-".utf8)
        let pageOne = [UInt8](try Data(contentsOf: genuine).prefix(4096))
        var forged = pageOne
        while forged.count < 2 << 20 { forged += marker }
        forged = Array(forged.prefix(2 << 20))
        try Data(forged).write(to: source.appendingPathComponent("forged.db"))
        try FileManager.default.copyItem(at: URL(fileURLWithPath: genuine.path + "-dpkey"),
                                         to: source.appendingPathComponent("forged.db-dpkey"))
        // It passes the first test: a key file that opens, and a page 1 that authenticates under it.
        #expect(await DatabasePageCheck(forDatabaseAt: source.appendingPathComponent("forged.db"), keybag: device.keybag) != nil)
        // SQLite's lock-byte page (the one holding offset 2^30, never written) passes when it is
        // the hole of zeros a database over 1 GiB has there, and only then.
        let check = try #require(await DatabasePageCheck(forDatabaseAt: genuine, keybag: device.keybag))
        let lockBytePage = (1 << 30) / check.pageSize + 1
        #expect([UInt8](repeating: 0, count: check.pageSize).withUnsafeBytes { check.authenticates($0, number: lockBytePage) })
        #expect(![UInt8](repeating: 0x41, count: check.pageSize).withUnsafeBytes { check.authenticates($0, number: lockBytePage) })
        #expect(![UInt8](repeating: 0, count: check.pageSize).withUnsafeBytes { check.authenticates($0, number: 2) })
        // The same plaintext with no key file beside it.
        try Data(forged).write(to: source.appendingPathComponent("plain.db"))

        let repository = BackupRepository(url: device.dir.appendingPathComponent("repo"))
        let summary = try await Self.engine(device, source: source, repository: repository).run()
        var leaked: [String] = []
        let walker = FileManager.default.enumerator(at: repository.url, includingPropertiesForKeys: nil)
        while let item = walker?.nextObject() as? URL {
            if let bytes = try? Data(contentsOf: item), bytes.range(of: Data(marker)) != nil { leaked.append(item.path) }
        }
        #expect(leaked.isEmpty)
        let backup = repository.url.appendingPathComponent("backups/\(summary.backup)")
        let entries = try await RestoreEngine(backup: backup).manifest(files: device.files, password: nil).entries()
        #expect(entries.first { $0.path == "forged.db" }?.sealed == true)
        let restored = device.dir.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: backup).restore(to: restored, files: device.files, password: nil)
        #expect([UInt8](try Data(contentsOf: restored.appendingPathComponent("forged.db"))) == forged)
    }
}
