import DataProtection
import Foundation
import Testing

/// A backup keybag lets another device adopt this device's files without re-encrypting them.
@Suite struct BackupKeybagTests {
    @Test func anotherDeviceAdoptsFilesWithTheBackupPassword() async throws {
        let source = try await TestDevice.make()
        var originals: [ProtectionClass: (URL, Data)] = [:]
        for cls in ProtectionClass.allCases {
            let url = source.url("\(cls.cliName).bin")
            let data = randomData(100_000)
            try await source.files.write(data, to: url, protection: cls)
            originals[cls] = (url, data)
        }
        try await source.keybag.setBackupPassword("backup pw")
        let backup = try BackupKeybag(contentsOf: source.keybag.backupKeybagURL)
        #expect(backup.sourceKeybagID == source.keybag.id)

        // The oracle decrypts with nothing but the backup keybag and the password.
        for (_, (url, data)) in originals {
            let result = try OracleTests.oracle(["backup-decrypt", source.keybag.backupKeybagURL.path, "backup pw", url.path])
            #expect(result.status == 0, "\(result.err)")
            #expect(result.out == data)
        }

        let target = try await TestDevice.make()
        #expect(throws: KeybagError.wrongPasscode(failedAttempts: 0)) { _ = try backup.unlock(password: "wrong") }
        let keys = try backup.unlock(password: "backup pw")
        for (cls, (url, data)) in originals {
            let copy = target.url(url.lastPathComponent)
            try FileManager.default.copyItem(at: url, to: copy)
            let ciphertextBefore = try Data(contentsOf: copy)
            await #expect(throws: ProtectedFileError.foreignKeybag(path: copy.path)) { _ = try await target.files.contents(of: copy) }
            try await target.files.adoptFile(at: copy, from: keys)
            #expect(try target.files.protection(ofItemAt: copy) == .protected(cls))
            #expect(try await target.files.contents(of: copy) == data)
            #expect(try Data(contentsOf: copy)[160...] == ciphertextBefore[160...], "content not re-encrypted")
        }
    }

    @Test func aModifiedBackupKeybagIsRejected() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.setBackupPassword("pw")
        var bytes = try BackupKeybag(contentsOf: device.keybag.backupKeybagURL).encoded
        bytes[100] ^= 1
        let tampered = try BackupKeybag(bytes: bytes)
        #expect(throws: KeybagError.wrongPasscode(failedAttempts: 0)) { _ = try tampered.unlock(password: "pw") }
        #expect(throws: (any Error).self) { _ = try BackupKeybag(bytes: Array(bytes.prefix(200))) }
    }

    @Test func settingABackupPasswordNeedsTheDeviceUnlocked() async throws {
        let device = try await TestDevice.make().restarted()
        await #expect(throws: KeybagError.deviceLocked(.beforeFirstUnlock)) { try await device.keybag.setBackupPassword("pw") }
    }
}
