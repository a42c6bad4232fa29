import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// Real SQLCipher is the judge: SQLCipher 4 (Python sqlcipher3-binary) and SQLCipher 3.4.1
/// (Debian's `sqlcipher` shell) open what we write, and we open what they write.
@Suite struct SQLCipherInteropTests {
    static let rawHex = "2DD29CA851E7B56E4697B0E1F08507293D761A05CE4D1B628663F411A8086D99"
    static let saltHex = "000102030405060708090A0B0C0D0E0F"

    /// Rows with small and overflow-page payloads, an index, and a blob column.
    static func fill(_ db: Database, rows: Int = 3000) throws {
        try db.execute(sql: "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL, body BLOB, score REAL)")
        try db.execute(sql: "CREATE INDEX item_name ON item(name)")
        for i in 1...rows {
            let body = Data((0..<(i % 97 == 0 ? 9000 : 40)).map { UInt8(($0 &* 31 &+ i) & 0xFF) })
            try db.execute(sql: "INSERT INTO item(id, name, body, score) VALUES (?, ?, ?, ?)",
                           arguments: [i, "name-\(i)", body, Double(i) / 7])
        }
    }

    /// The rows as SQLCipher's oracle prints them (`hex(body)` upper-case, as SQLite gives it).
    static let selectAll = "SELECT id, name, hex(body), printf('%.15g', score) FROM item ORDER BY id"

    static func ourRows(_ reader: any DatabaseReader) throws -> [[String]] {
        try reader.read { db in
            try Row.fetchAll(db, sql: selectAll).map { row in
                [String(row[0] as Int64), row[1] as String, row[2] as String, row[3] as String]
            }
        }
    }

    static func oracleRows(_ result: ToolResult) -> [[String]] {
        result.rows.filter { $0.count == 4 }.map { row in
            [String(describing: row[0]), String(describing: row[1]), String(describing: row[2]), String(describing: row[3])]
        }
    }

    enum Mode: String, CaseIterable, Sendable { case passphrase, rawKey, rawKeyWithSalt }

    static func key(_ mode: Mode) throws -> (ours: SQLCipherKey, oracle: String) {
        switch mode {
        case .passphrase: (.passphrase("correct horse battery"), "pass:correct horse battery")
        case .rawKey: (try SQLCipherKey(rawKeyHex: rawHex), "raw:" + rawHex)
        case .rawKeyWithSalt: (try SQLCipherKey(rawKeyHex: rawHex + saltHex), "raw:" + rawHex + saltHex)
        }
    }

    @Test(arguments: Mode.allCases, [false, true])
    func sqlcipher4OpensWhatWeWrite(mode: Mode, wal: Bool) throws {
        let path = temporaryDirectory().appendingPathComponent("ours.db").path
        let (key, oracleKey) = try Self.key(mode)
        let expected: [[String]]
        do {
            let writer: any DatabaseWriter = wal ? try DatabasePool(path: path, key: key) : try DatabaseQueue(path: path, key: key)
            try writer.write { try Self.fill($0) }
            try writer.write { db in try db.execute(sql: "UPDATE item SET name = name || '!' WHERE id % 5 = 0; DELETE FROM item WHERE id % 11 = 0") }
            expected = try Self.ourRows(writer)
            try writer.close()
        }
        let check = try SQLCipher4.run(path, key: oracleKey, [], "PRAGMA cipher_integrity_check")
        #expect(check.status == 0, "\(check.err)")
        #expect(check.out.isEmpty, "cipher_integrity_check reported: \(check.out)")
        let rows = try SQLCipher4.run(path, key: oracleKey, [], Self.selectAll)
        #expect(rows.status == 0, "\(rows.err)")
        let theirs = Self.oracleRows(rows)
        #expect(theirs.count == expected.count)
        if let i = (0..<min(expected.count, theirs.count)).first(where: { expected[$0] != theirs[$0] }) { Issue.record("row \(i): ours \(expected[i].map { $0.prefix(40) }) theirs \(theirs[i].map { $0.prefix(40) })") }
        #expect(expected.count > 2000)
    }

    @Test(arguments: [(Mode.passphrase, 4096), (.rawKey, 4096), (.passphrase, 8192), (.rawKey, 8192)])
    func weOpenWhatSQLCipher4Writes(mode: Mode, pageSize: Int) throws {
        let path = temporaryDirectory().appendingPathComponent("theirs.db").path
        let (key, oracleKey) = try Self.key(mode)
        let options = pageSize == 4096 ? [] : ["--page-size", String(pageSize)]
        let made = try SQLCipher4.run(path, key: oracleKey, options,
            "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL, body BLOB, score REAL)",
            "CREATE INDEX item_name ON item(name)",
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000) INSERT INTO item SELECT i, 'name-' || i, randomblob(CASE WHEN i % 97 = 0 THEN 9000 ELSE 40 END), i / 7.0 FROM n",
            "DELETE FROM item WHERE id % 11 = 0")
        try #require(made.status == 0, "\(made.err)")
        let theirs = Self.oracleRows(try SQLCipher4.run(path, key: oracleKey, options, Self.selectAll))
        let format = try SQLCipherFormat.sqlcipher4.withPageSize(pageSize)
        let queue = try DatabaseQueue(path: path, key: key, format: format)
        let ours = try Self.ourRows(queue)
        #expect(ours.count == theirs.count)
        if let i = (0..<min(ours.count, theirs.count)).first(where: { ours[$0] != theirs[$0] }) { Issue.record("row \(i): ours \(ours[i].map { $0.prefix(40) }) theirs \(theirs[i].map { $0.prefix(40) })") }
        #expect(theirs.count == 3000 - 272)
        // And we can keep writing it, and SQLCipher keeps reading it.
        try queue.write { db in try db.execute(sql: "INSERT INTO item(id, name) VALUES (99999, 'ours')") }
        try queue.close()
        let after = try SQLCipher4.run(path, key: oracleKey, options, "PRAGMA cipher_integrity_check", "SELECT name FROM item WHERE id = 99999")
        #expect(after.out == "[\"ours\"]\n", "\(after.err)")
    }

    @Test func weOpenWhatSQLCipher3Writes() throws {
        let path = temporaryDirectory().appendingPathComponent("v3.db").path
        let made = try SQLCipher3.run(path, script: """
            PRAGMA key = 'legacy secret';
            CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL, body BLOB, score REAL);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
              INSERT INTO item SELECT i, 'name-' || i, randomblob(CASE WHEN i % 97 = 0 THEN 3000 ELSE 40 END), i / 7.0 FROM n;
            SELECT count(*) FROM item;
            """)
        try #require(made.status == 0 && made.out == "2000\n", "sqlcipher 3: \(made.out) \(made.err)")
        let theirs = try SQLCipher3.run(path, script: "PRAGMA key = 'legacy secret';\n.mode list\n.separator |\nSELECT id, name, hex(body) FROM item ORDER BY id;")
        let queue = try DatabaseQueue(path: path, key: .passphrase("legacy secret"), format: .sqlcipher3)
        let ours = try queue.read { db in
            try Row.fetchAll(db, sql: "SELECT id, name, hex(body) FROM item ORDER BY id").map { "\($0[0] as Int64)|\($0[1] as String)|\($0[2] as String)" }
        }
        #expect(ours.joined(separator: "\n") + "\n" == theirs.out)
        #expect(ours.count == 2000)
        // The SQLCipher 4 format refuses it with a clear error.
        #expect(throws: DatabaseCipherError.self) { try DatabaseQueue(path: path, key: .passphrase("legacy secret")) }
    }

    @Test func sqlcipher3OpensWhatWeWriteInItsFormat() throws {
        let path = temporaryDirectory().appendingPathComponent("ours-v3.db").path
        let queue = try DatabaseQueue(path: path, key: .passphrase("legacy secret"), format: .sqlcipher3)
        try queue.write { try Self.fill($0, rows: 1500) }
        try queue.close()
        let result = try SQLCipher3.run(path, script: "PRAGMA key = 'legacy secret';\nPRAGMA cipher_integrity_check;\nSELECT count(*), sum(length(body)) FROM item;")
        #expect(result.status == 0, "\(result.err)")
        let expectedBodies = (1...1500).reduce(0) { $0 + ($1 % 97 == 0 ? 9000 : 40) }
        #expect(result.out == "1500|\(expectedBodies)\n", "\(result.out) \(result.err)")
    }

    /// A hot WAL (frames not yet checkpointed, as after a crash) is recovered by SQLCipher 4 when
    /// we leave it, and by us when SQLCipher leaves it: frame checksums chain over ciphertext.
    @Test func hotWALIsSharedBothWays() throws {
        let dir = temporaryDirectory()
        let path = dir.appendingPathComponent("hot.db").path
        let (key, oracleKey) = try Self.key(.passphrase)
        let pool = try DatabasePool(path: path, key: key)
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        try pool.write { try Self.fill($0, rows: 800) }
        try pool.write { db in try db.execute(sql: "UPDATE item SET name = 'again-' || id WHERE id % 3 = 0") }
        let expected = try Self.ourRows(pool)
        // The crash: copy the files while the pool is open, WAL unchecked-pointed.
        let copy = dir.appendingPathComponent("copy.db").path
        for suffix in ["", "-wal"] { try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + suffix) }
        try pool.close()
        #expect(try FileManager.default.attributesOfItem(atPath: copy + "-wal")[.size] as? Int ?? 0 > 100_000)
        let theirs = try SQLCipher4.run(copy, key: oracleKey, [], Self.selectAll)
        #expect(theirs.status == 0, "\(theirs.err)")
        #expect(Self.oracleRows(theirs) == expected)

        // SQLCipher crashes with committed frames in its WAL; we recover them.
        let other = dir.appendingPathComponent("theirs.db").path
        let made = try SQLCipher4.run(other, key: oracleKey, ["--wal", "--crash"],
            "CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL, body BLOB, score REAL)",
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500) INSERT INTO item SELECT i, 'name-' || i, randomblob(60), i / 7.0 FROM n",
            "UPDATE item SET name = 'late' WHERE id > 1400")
        #expect(made.status == 0, "\(made.err)")
        #expect(try FileManager.default.attributesOfItem(atPath: other + "-wal")[.size] as? Int ?? 0 > 50_000)
        let recovered = try DatabaseQueue(path: other, key: key)
        let late = try recovered.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM item WHERE name = 'late'") }
        #expect(late == 100)
        try recovered.close()
        let check = try SQLCipher4.run(other, key: oracleKey, [], "PRAGMA cipher_integrity_check", "PRAGMA integrity_check")
        #expect(check.out == "[\"ok\"]\n", "\(check.out) \(check.err)")
    }

    @Test func wrongKeyIsAClearErrorAndChangesNothing() throws {
        let path = temporaryDirectory().appendingPathComponent("k.db").path
        let queue = try DatabaseQueue(path: path, key: .passphrase("right"))
        try queue.write { try Self.fill($0, rows: 50) }
        try queue.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect {
            _ = try DatabaseQueue(path: path, key: .passphrase("wrong"))
        } throws: { error in
            guard case DatabaseCipherError.wrongKeyOrFormat(let p, _) = error else { return false }
            return p == path
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before)
        // A plain SQLite database is named as such.
        let plain = temporaryDirectory().appendingPathComponent("plain.db").path
        try DatabaseQueue(path: plain).write { db in try db.execute(sql: "CREATE TABLE t(x)") }
        #expect(throws: DatabaseCipherError.notEncrypted(path: plain)) { try DatabaseQueue(path: plain, key: .passphrase("x")) }
    }
}
