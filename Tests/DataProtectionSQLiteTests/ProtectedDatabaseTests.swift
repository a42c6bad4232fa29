import DataProtection
import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// Class-managed databases follow the lock like protected files do.
@Suite struct ProtectedDatabaseTests {
    static func count(_ db: ProtectedDatabase) async throws -> Int {
        try await db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM note") ?? -1 }
    }

    static func makeNotes(_ db: ProtectedDatabase, _ n: Int = 200) async throws {
        try await db.write { db in
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS note(id INTEGER PRIMARY KEY, text TEXT)")
            for i in 0..<n { try db.execute(sql: "INSERT INTO note(text) VALUES (?)", arguments: ["note \(i)"]) }
        }
    }

    @Test(arguments: [ProtectedDatabase.Mode.queue, .pool])
    func classAStopsAfterTheGracePeriodAndResumesAfterUnlock(mode: ProtectedDatabase.Mode) async throws {
        let device = try await TestDevice.make()
        let db = try await ProtectedDatabase.open(at: device.url("a.db"), keybag: device.keybag, protection: .complete, mode: mode)
        try await Self.makeNotes(db)
        // Locked, within the grace period: still usable.
        await device.keybag.lock()
        device.clock.advance(by: 5)
        #expect(try await Self.count(db) == 200)
        // Past the grace period: the typed error of files, for reads and writes.
        device.clock.advance(by: 6)
        _ = await device.keybag.isProtectedDataAvailable
        #expect(!db.isAvailable)
        await #expect { try await Self.count(db) } throws: { isUnavailable($0, writing: false) }
        await #expect { try await Self.makeNotes(db, 1) } throws: { isUnavailable($0, writing: true) }
        // Plain GRDB on the same connections is refused too, by the VFS.
        #expect(throws: DatabaseError.self) { try db.writer.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM note") } }
        // Unlock: the same object works again, nothing was lost.
        try await device.keybag.unlock(passcode: "123456")
        #expect(try await Self.count(db) == 200)
        try await Self.makeNotes(db, 1)
        #expect(try await Self.count(db) == 201)
        try await db.close()
    }

    @Test func classBKeepsWorkingWhileLockedButCannotBeOpenedLocked() async throws {
        let device = try await TestDevice.make()
        let url = device.url("b.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .completeUnlessOpen)
        try await Self.makeNotes(db)
        await device.lockPastGrace()
        try await Self.makeNotes(db, 10)
        #expect(try await Self.count(db) == 210)
        await #expect { _ = try await ProtectedDatabase.open(at: url, keybag: device.keybag) } throws: { isUnavailable($0) }
        try await db.close()
    }

    @Test func classCFromFirstUnlockAndDAlways() async throws {
        let device = try await TestDevice.make()
        for (name, cls) in [("c.db", ProtectionClass.completeUntilFirstUserAuthentication), ("d.db", .noProtection)] {
            let db = try await ProtectedDatabase.open(at: device.url(name), keybag: device.keybag, protection: cls)
            try await Self.makeNotes(db)
            try await db.close()
        }
        let rebooted = try await device.restarted()
        await #expect { _ = try await ProtectedDatabase.open(at: device.url("c.db"), keybag: rebooted.keybag) } throws: { isUnavailable($0) }
        let d = try await ProtectedDatabase.open(at: device.url("d.db"), keybag: rebooted.keybag)
        #expect(try await Self.count(d) == 200)
        try await rebooted.keybag.unlock(passcode: "123456")
        let c = try await ProtectedDatabase.open(at: device.url("c.db"), keybag: rebooted.keybag)
        await rebooted.lockPastGrace()
        #expect(try await Self.count(c) == 200)
        #expect(try await Self.count(d) == 200)
    }

    @Test func changingTheClassRewrapsOnlyTheKey() async throws {
        let device = try await TestDevice.make()
        let url = device.url("x.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .complete, mode: .queue)
        try await Self.makeNotes(db)
        try await db.close()
        let before = try Data(contentsOf: url)
        let reopened = try await ProtectedDatabase.open(at: url, keybag: device.keybag, mode: .queue)
        try await reopened.setProtection(.noProtection)
        #expect(reopened.protectionClass == .noProtection)
        try await reopened.close()
        #expect(try Data(contentsOf: url) == before)
        await device.lockPastGrace()
        let locked = try await ProtectedDatabase.open(at: url, keybag: device.keybag)
        #expect(try await Self.count(locked) == 200)
    }

    @Test func theRawKeyOpensItInSQLCipherAndIsRefusedWhileLocked() async throws {
        let device = try await TestDevice.make()
        let url = device.url("k.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .complete)
        try await Self.makeNotes(db)
        let hex = try await db.rawKeyHex()
        try await db.close()
        let result = try SQLCipher4.run(url.path, key: "raw:" + hex, [], "PRAGMA cipher_integrity_check", "SELECT count(*) FROM note")
        #expect(result.out == "[200]\n", "\(result.err)")
        await device.lockPastGrace()
        await #expect { _ = try await db.rawKeyHex() } throws: { isUnavailable($0) }
    }

    @Test(arguments: [ProtectedDatabase.Mode.queue, .pool])
    func rekeyInWALAndRollbackModes(mode: ProtectedDatabase.Mode) async throws {
        let device = try await TestDevice.make()
        let url = device.url("r.db")
        let db = try await ProtectedDatabase.open(at: url, keybag: device.keybag, protection: .complete, mode: mode)
        try await Self.makeNotes(db, 2000)
        let oldKey = try await db.rawKeyHex()
        try await db.rekey()
        let newKey = try await db.rawKeyHex()
        #expect(oldKey != newKey)
        #expect(try await Self.count(db) == 2000)
        try await Self.makeNotes(db, 5)
        #expect(try await Self.count(db) == 2005)
        try await db.close()
        #expect(try SQLCipher4.run(url.path, key: "raw:" + oldKey, [], "SELECT count(*) FROM note").status != 0)
        let result = try SQLCipher4.run(url.path, key: "raw:" + newKey, [], "PRAGMA cipher_integrity_check", "SELECT count(*) FROM note")
        #expect(result.out == "[2005]\n", "\(result.err)")
    }

    @Test func walWithConcurrentReaders() async throws {
        let device = try await TestDevice.make()
        let db = try await ProtectedDatabase.open(at: device.url("w.db"), keybag: device.keybag, protection: .complete, mode: .pool)
        try await Self.makeNotes(db, 10)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { for _ in 0..<50 { try await Self.makeNotes(db, 10) } }
            for _ in 0..<4 {
                group.addTask {
                    var last = 0
                    for _ in 0..<50 {
                        let n = try await Self.count(db)
                        #expect(n >= last && n % 10 == 0)
                        last = n
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try await Self.count(db) == 510)
    }
}
