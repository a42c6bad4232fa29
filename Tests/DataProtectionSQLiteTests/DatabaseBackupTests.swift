import DataProtection
import DataProtectionBackup
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
