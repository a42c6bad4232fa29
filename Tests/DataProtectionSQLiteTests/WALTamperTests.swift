import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// A damaged write-ahead log: bytes changed inside a frame that a valid frame follows are an
/// error naming the database (a crash cannot leave that behind); truncation and damage at the
/// end of the log are what a crash leaves, and give the last complete commit (FORMAT.md §7.3).
@Suite struct WALTamperTests {
    static let key = try! SQLCipherKey(rawKeyHex: "2DD29CA851E7B56E4697B0E1F08507293D761A05CE4D1B628663F411A8086D99")

    /// Six commits left in a hot WAL; for each, the frame count after it and the rows it left.
    struct HotWAL {
        let database: Data
        let wal: Data
        let commits: [(frames: Int, count: Int)]
        let frameSize: Int
        /// Frames after the CREATE TABLE commit.
        let createFrames: Int
    }

    static func hotWAL(format: SQLCipherFormat) throws -> HotWAL {
        let dir = temporaryDirectory()
        let path = dir.appendingPathComponent("w.db").path
        let pool = try DatabasePool(path: path, key: key, format: format)
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        try pool.write { db in try db.execute(sql: "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)") }
        let frameSize = format.pageSize + 24
        let createFrames = ((try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as! Int) - 32) / frameSize
        var commits: [(Int, Int)] = []
        for round in 1...6 {
            try pool.write { db in
                for i in 0..<20 { try db.execute(sql: "INSERT INTO t(v) VALUES (?)", arguments: ["round \(round) row \(i) " + String(repeating: "x", count: 40)]) }
            }
            let walSize = try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as! Int
            commits.append(((walSize - 32) / frameSize, try pool.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM t")! }))
        }
        let database = try Data(contentsOf: URL(fileURLWithPath: path))
        let wal = try Data(contentsOf: URL(fileURLWithPath: path + "-wal"))
        try pool.close()
        return HotWAL(database: database, wal: wal, commits: commits, frameSize: frameSize, createFrames: createFrames)
    }

    /// Opens a copy with `wal` as its log: the row count, or the error (explained).
    static func open(_ hot: HotWAL, wal: Data, format: SQLCipherFormat) throws -> Result<Int, DatabaseCipherError> {
        let path = temporaryDirectory().appendingPathComponent("copy.db").path
        try hot.database.write(to: URL(fileURLWithPath: path))
        try wal.write(to: URL(fileURLWithPath: path + "-wal"))
        let queue: DatabaseQueue
        do {
            queue = try DatabaseQueue(path: path, key: key, format: format)   // recovery may run here
        } catch let error as DatabaseCipherError {
            if case .damaged(let p, _) = error { #expect(p == path) }
            return .failure(error)
        }
        defer { try? queue.close() }
        do {
            let count = try queue.read { db -> Int in
                _ = try String.fetchAll(db, sql: "PRAGMA integrity_check")
                guard try Bool.fetchOne(db, sql: "SELECT count(*) FROM sqlite_master WHERE name = 't'")! else { return -1 }   // before CREATE TABLE
                return try Int.fetchOne(db, sql: "SELECT count(*) FROM t")!
            }
            return .success(count)
        } catch {
            guard let explained = DatabaseCipherError.explain(error, in: queue) as? DatabaseCipherError else { throw error }
            if case .damaged(let p, _) = explained { #expect(p == path) }
            return .failure(explained)
        }
    }

    @Test(arguments: [SQLCipherFormat.sqlcipher4, .sqlcipher3])
    func bytesChangedInAFrameThatAValidFrameFollowsAreAnError(format: SQLCipherFormat) throws {
        let hot = try Self.hotWAL(format: format)
        let frames = hot.commits.last!.frames
        #expect(frames >= 6)
        let pageSize = format.pageSize
        // Within a frame: page number, both salts, both checksum words, the page, its IV, its MAC.
        let reserve = format.compatibility == 4 ? 80 : 48
        let offsets = [1, 9, 13, 17, 21, 24, 24 + pageSize / 2, 24 + pageSize - reserve + 8, 24 + pageSize - reserve + 20]
        var silent: [String] = []
        for frame in 0..<(frames - 1) {
            for within in offsets {
                var wal = hot.wal
                wal[32 + frame * hot.frameSize + within] ^= 0x01
                if case .success(let count) = try Self.open(hot, wal: wal, format: format) {
                    silent.append("frame \(frame) byte \(within): \(count) rows")
                }
            }
        }
        #expect(silent.isEmpty, "damage read as an older state: \(silent.prefix(10))")
        // The header: magic, version, page size, checkpoint sequence, salts, checksum.
        for byte in [3, 7, 11, 15, 16, 20, 24, 28] {
            var wal = hot.wal
            wal[byte] ^= 0x01
            if case .success(let count) = try Self.open(hot, wal: wal, format: format) {
                silent.append("header byte \(byte): \(count) rows")
            }
        }
        #expect(silent.isEmpty, "damage read as an older state: \(silent.prefix(10))")
    }

    /// What a crash leaves — the log cut at any byte, or its last frame torn — is the last
    /// complete commit, without an error: indistinguishable from a crash, as in SQLite.
    @Test func truncationAndATornLastFrameGiveTheLastCompleteCommit() throws {
        let format = SQLCipherFormat.sqlcipher4
        let hot = try Self.hotWAL(format: format)
        let frames = hot.commits.last!.frames
        for frame in stride(from: 1, to: frames, by: 1) {
            for extra in [0, 1, 24, hot.frameSize / 2] {
                let cut = 32 + frame * hot.frameSize + extra
                let expected = hot.commits.last { $0.frames <= frame }?.count ?? (frame >= hot.createFrames ? 0 : -1)
                let result = try Self.open(hot, wal: hot.wal.prefix(cut), format: format)
                #expect(try result.get() == expected, "cut at frame \(frame) + \(extra)")
            }
        }
        var torn = hot.wal
        torn[32 + (frames - 1) * hot.frameSize + 24 + 100] ^= 0x01
        let previous = hot.commits.dropLast().last!.count
        #expect(try Self.open(hot, wal: torn, format: format).get() == previous)
    }
}
