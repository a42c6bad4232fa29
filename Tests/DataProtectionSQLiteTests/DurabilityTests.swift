import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// Damage, crashes and plaintext: a flipped byte is an error naming the database, a hot journal
/// is played back, nothing readable reaches the disk, and whole-file operations are atomic.
@Suite struct DurabilityTests {
    static func contains(_ haystack: Data, _ needle: String) -> Bool {
        haystack.range(of: Data(needle.utf8)) != nil
    }

    @Test(arguments: [SQLCipherFormat.sqlcipher4, .sqlcipher3])
    func aFlippedByteInAnyPageIsAnErrorNamingTheDatabase(format: SQLCipherFormat) throws {
        let path = temporaryDirectory().appendingPathComponent("t.db").path
        let queue = try DatabaseQueue(path: path, key: .passphrase("k"), format: format)
        try queue.write { try SQLCipherInteropTests.fill($0, rows: 300) }
        let expected = try SQLCipherInteropTests.ourRows(queue)
        try queue.close()
        let original = try Data(contentsOf: URL(fileURLWithPath: path))
        let pages = original.count / format.pageSize
        #expect(pages > 5)
        for page in 0..<pages {
            // The first byte after the salt, the middle, the IV and the MAC of each page.
            let base = page * format.pageSize
            for within in [page == 0 ? 16 : 0, format.pageSize / 2, format.pageSize - 70, format.pageSize - 30] {
                var damaged = original
                damaged[base + within] ^= 0x01
                try damaged.write(to: URL(fileURLWithPath: path))
                do {
                    let reader = try DatabaseQueue(path: path, key: .passphrase("k"), format: format)
                    let rows: [[String]]
                    do {
                        rows = try SQLCipherInteropTests.ourRows(reader)
                        // Every b-tree page (the index too) is read by the integrity check.
                        _ = try reader.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") }
                    } catch {
                        throw DatabaseCipherError.explain(error, in: reader)
                    }
                    // A v3 page has 12 random fill bytes no MAC covers; only there may it read on.
                    #expect(format.compatibility == 3 && within == format.pageSize - 30 && rows == expected,
                            "page \(page + 1) byte \(within): damage went unnoticed")
                } catch let error as DatabaseCipherError {
                    switch error {
                    case .damaged(let p, _), .wrongKeyOrFormat(let p, _): #expect(p == path)
                    default: Issue.record("unexpected \(error)")
                    }
                }
            }
        }
    }

    @Test func nothingReadableReachesTheDiskIncludingJournalsWALAndTempFiles() throws {
        let dir = temporaryDirectory()
        let marker = "PLAINTEXT-MARKER-0123456789"
        for wal in [false, true] {
            let path = dir.appendingPathComponent("m-\(wal).db").path
            var config = Configuration()
            config.prepareDatabase { db in
                try db.execute(sql: "PRAGMA cache_size = 8")             // forces spills
                try db.execute(sql: "PRAGMA mmap_size = 268435456")      // asks for memory-mapped I/O
            }
            let writer: any DatabaseWriter = wal ? try DatabasePool(path: path, key: .passphrase("k"), configuration: config)
                                                 : try DatabaseQueue(path: path, key: .passphrase("k"), configuration: config)
            try writer.write { db in
                try db.execute(sql: "CREATE TABLE t(x TEXT)")
                for i in 0..<3000 { try db.execute(sql: "INSERT INTO t VALUES (?)", arguments: ["\(marker) \(i)"]) }
            }
            // An update big enough to spill, with a sort and an index build that use temp space.
            try writer.write { db in
                try db.execute(sql: "UPDATE t SET x = x || ' updated'")
                _ = try Row.fetchAll(db, sql: "SELECT x FROM t ORDER BY substr(x, 20) DESC")
                try db.execute(sql: "CREATE INDEX t_x ON t(x)")
            }
            try writer.writeWithoutTransaction { db in try db.execute(sql: "VACUUM") }
            // While open (journal/WAL present) and after closing, no file holds the marker.
            for name in try FileManager.default.contentsOfDirectory(atPath: dir.path) {
                #expect(!Self.contains(try Data(contentsOf: dir.appendingPathComponent(name)), marker), "\(name)")
            }
            try writer.close()
        }
        for name in try FileManager.default.contentsOfDirectory(atPath: dir.path) {
            #expect(!Self.contains(try Data(contentsOf: dir.appendingPathComponent(name)), marker), "\(name)")
        }
    }

    /// A crash in the middle of a big transaction (files copied while the journal is hot) is
    /// rolled back on the next open — by us and by SQLCipher 4.
    @Test func aHotRollbackJournalIsPlayedBack() throws {
        let dir = temporaryDirectory()
        let path = dir.appendingPathComponent("j.db").path
        var config = Configuration()
        config.prepareDatabase { db in try db.execute(sql: "PRAGMA cache_size = 5") }
        let queue = try DatabaseQueue(path: path, key: .passphrase("k"), configuration: config)
        try queue.write { try SQLCipherInteropTests.fill($0, rows: 1500) }
        let expected = try SQLCipherInteropTests.ourRows(queue)
        let crashed = [dir.appendingPathComponent("ours.db").path, dir.appendingPathComponent("theirs.db").path]
        try queue.inDatabase { db in
            try db.execute(sql: "BEGIN")
            try db.execute(sql: "UPDATE item SET name = 'lost', body = zeroblob(500)")
            // The cache spilled: the database file already holds uncommitted pages.
            for copy in crashed {
                for suffix in ["", "-journal"] { try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + suffix) }
            }
            try db.execute(sql: "ROLLBACK")
        }
        try queue.close()
        #expect(try Data(contentsOf: URL(fileURLWithPath: crashed[0])) != Data(contentsOf: URL(fileURLWithPath: path)))
        let ours = try DatabaseQueue(path: crashed[0], key: .passphrase("k"))
        #expect(try SQLCipherInteropTests.ourRows(ours) == expected)
        let theirs = try SQLCipher4.run(crashed[1], key: "pass:k", [], SQLCipherInteropTests.selectAll)
        #expect(SQLCipherInteropTests.oracleRows(theirs) == expected, "\(theirs.err)")
    }

    @Test(arguments: [false, true])
    func rekeyMigrateExportImportAreAtomicAndJudgedBySQLCipher(wal: Bool) throws {
        let dir = temporaryDirectory()
        let path = dir.appendingPathComponent("r.db").path
        let writer: any DatabaseWriter = wal ? try DatabasePool(path: path, key: .passphrase("old"))
                                             : try DatabaseQueue(path: path, key: .passphrase("old"))
        try writer.write { try SQLCipherInteropTests.fill($0, rows: 700) }
        try writer.write { db in try db.execute(sql: "PRAGMA user_version = 42") }
        let expected = try SQLCipherInteropTests.ourRows(writer)
        try writer.close()

        try SQLCipherMaintenance.rekey(atPath: path, from: .passphrase("old"), to: .passphrase("new"))
        #expect(throws: DatabaseCipherError.self) { try DatabaseQueue(path: path, key: .passphrase("old")) }
        let check = try SQLCipher4.run(path, key: "pass:new", [], "PRAGMA cipher_integrity_check", "PRAGMA user_version")
        #expect(check.out == "[42]\n", "\(check.err)")
        #expect(SQLCipherInteropTests.oracleRows(try SQLCipher4.run(path, key: "pass:new", [], SQLCipherInteropTests.selectAll)) == expected)

        // A wrong old key changes nothing.
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(throws: DatabaseCipherError.self) { try SQLCipherMaintenance.rekey(atPath: path, from: .passphrase("nope"), to: .passphrase("x")) }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)

        let plain = dir.appendingPathComponent("plain.db").path
        try SQLCipherMaintenance.exportPlaintext(atPath: path, key: .passphrase("new"), to: plain)
        #expect(try SQLCipherInteropTests.ourRows(DatabaseQueue(path: plain)) == expected)

        let imported = dir.appendingPathComponent("imported.db").path
        try SQLCipherMaintenance.importPlaintext(from: plain, toPath: imported, key: .passphrase("imp"))
        #expect(SQLCipherInteropTests.oracleRows(try SQLCipher4.run(imported, key: "pass:imp", [], SQLCipherInteropTests.selectAll)) == expected)
    }

    @Test func migrationFromSQLCipher3To4() throws {
        let path = temporaryDirectory().appendingPathComponent("v3.db").path
        let made = try SQLCipher3.run(path, script: """
            PRAGMA key = 'legacy';
            CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500) INSERT INTO t SELECT i, 'v' || i FROM n;
            PRAGMA user_version = 7;
            """)
        try #require(made.status == 0, "\(made.err)")
        try SQLCipherMaintenance.migrate(atPath: path, key: .passphrase("legacy"))
        let result = try SQLCipher4.run(path, key: "pass:legacy", [], "PRAGMA cipher_integrity_check", "SELECT count(*), max(v) FROM t", "PRAGMA user_version")
        #expect(result.out == "[2500, \"v999\"]\n[7]\n", "\(result.err)")
    }
}
