import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

/// A backup keybag lets another device adopt this device's files without re-encrypting them.
@Suite struct BackupKeybagTests {
    @Test func anotherDeviceAdoptsFilesWithTheBackupPassword() async throws {
        let source = try await TestDevice.make()
        var originals: [ProtectionClass: (URL, Data)] = [:]
        for cls in ProtectionClass.allCases {
            let url = source.url("\(cls.shortName).bin")
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
        #expect(throws: KeybagError.wrongBackupPassword) { _ = try backup.unlock(password: "wrong") }
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
        #expect(throws: KeybagError.wrongBackupPassword) { _ = try tampered.unlock(password: "pw") }
        #expect(throws: (any Error).self) { _ = try BackupKeybag(bytes: Array(bytes.prefix(200))) }
    }

    @Test func settingABackupPasswordNeedsTheDeviceUnlocked() async throws {
        let device = try await TestDevice.make().restarted()
        await #expect(throws: KeybagError.deviceLocked(.beforeFirstUnlock)) { try await device.keybag.setBackupPassword("pw") }
    }
}

@Suite struct ThisDeviceOnlyTests {
    @Test(arguments: ProtectionClass.allCases)
    func thisDeviceOnlyFilesWorkHereAndNowhereElse(cls: ProtectionClass) async throws {
        let source = try await TestDevice.make()
        let url = source.url("bound.bin")
        let data = randomData(70_000)
        try await source.files.write(data, to: url, protection: cls, thisDeviceOnly: true)
        #expect(try ItemInspector.isThisDeviceOnly(url))
        #expect(try await source.files.contents(of: url) == data)
        // The independent reader needs the device secret for it.
        let oracle = try OracleTests.oracle(["decrypt", source.root, url.path, "--passcode", "123456"])
        #expect(oracle.status == 0, "\(oracle.err)")
        #expect(oracle.out == data)
        // Class changes and overwrites keep the binding; a copy keeps it too.
        try await source.files.setProtection(cls == .noProtection ? .complete : .noProtection, ofItemAt: url)
        #expect(try ItemInspector.isThisDeviceOnly(url))
        try await source.files.write(data, to: url, protection: cls)
        #expect(try ItemInspector.isThisDeviceOnly(url))
        try await source.files.copyItem(at: url, to: source.url("copy.bin"))
        #expect(try ItemInspector.isThisDeviceOnly(source.url("copy.bin")))

        // A backup keybag does not open it on another device, nor does the oracle without the secret.
        try await source.keybag.setBackupPassword("pw")
        let keys = try BackupKeybag(contentsOf: source.keybag.backupKeybagURL).unlock(password: "pw")
        let target = try await TestDevice.make()
        let copy = target.url("bound.bin")
        try FileManager.default.copyItem(at: url, to: copy)
        await #expect { try await target.files.adoptFile(at: copy, from: keys) } throws: { error in
            guard case ProtectedFileError.keybag(.thisDeviceOnly) = error else { return false }
            return true
        }
        #expect(try OracleTests.oracle(["backup-decrypt", source.keybag.backupKeybagURL.path, "pw", url.path]).status != 0)
    }

    @Test func theFlagIsAuthenticated() async throws {
        let device = try await TestDevice.make()
        let url = device.url("f")
        try await device.files.write(Data("x".utf8), to: url, protection: .noProtection, thisDeviceOnly: true)
        var bytes = [UInt8](try Data(contentsOf: url))
        bytes[14] = 0
        try Data(bytes).write(to: url)
        await #expect(throws: ProtectedFileError.self) { _ = try await device.files.contents(of: url) }
    }
}
