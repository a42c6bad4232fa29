import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// The device secret sealed by a TPM, against a software TPM of each test's own (swtpm), attacked
/// as someone holding a copy of the data root, or the root's files, would.
@Suite struct TPMKeybagTests {
    /// A device with passcode "123456" on `tpm`, with a virtual clock.
    func makeDevice(_ tpm: SoftwareTPM, passcode: String? = "123456", pcrs: TPMPCRSelection? = nil,
                    eraseAfterTen: Bool = false) async throws -> (Keybag, ManualClock, String) {
        let root = temporaryDirectory().appendingPathComponent("root").path
        let clock = ManualClock()
        let keybag = try await Keybag.create(root: root, passcode: passcode, kdf: .insecureFastForTesting, eraseAfterTenFailures: eraseAfterTen,
                                             tpm: TPMBinding(pcrs: pcrs, tcti: tpm.tcti), clock: clock)
        return (keybag, clock, root)
    }

    @Test func theSecretLivesInTheTPMAndTheRightPasscodeUnlocks() async throws {
        let tpm = try SoftwareTPM()
        let (keybag, clock, root) = try await makeDevice(tpm)
        #expect(!FileManager.default.fileExists(atPath: root + "/device.secret"))
        #expect(FileManager.default.fileExists(atPath: root + "/device.tpm"))
        let (key, wrapped) = try await keybag.wrapNewFileKey(for: .complete)
        #expect(await keybag.status.deviceSecret == .tpm(pcrs: nil))
        #expect(try tpm.persistentHandles().count == 2)   // device secret, passcode secret
        #expect(try tpm.nvIndices().count == 2)           // the attempt counter and its base

        let restarted = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        #expect(await restarted.lockState == .beforeFirstUnlock)
        #expect(await restarted.isAvailable(.noProtection))   // class D needs no passcode
        try await restarted.unlock(passcode: "123456")
        #expect(try await restarted.unwrapFileKey(wrapped) == key)
        let status = await restarted.status
        #expect(status.tpmLockout?.failedTries == 0)
        #expect(status.tpmProblem == nil)
    }

    @Test func wrongPasscodesAreCountedByTheTPM() async throws {
        let tpm = try SoftwareTPM()
        try tpm.setDictionaryAttackParameters(maxTries: 10)
        let (_, clock, root) = try await makeDevice(tpm)
        let keybag = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        for (n, guess) in ["0000", "1111", "2222"].enumerated() {
            await #expect(throws: KeybagError.wrongPasscode(failedAttempts: n + 1)) { try await keybag.unlock(passcode: guess) }
            #expect(try tpm.property("TPM2_PT_LOCKOUT_COUNTER") == UInt32(n + 1))
        }
        #expect(await keybag.status.tpmLockout?.failedTries == 3)
        #expect(await keybag.status.tpmLockout?.remainingTries == 7)
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.status.failedAttempts == 0)
    }

    @Test func aCopyOfTheDataRootIsUselessWithoutItsTPM() async throws {
        let tpm = try SoftwareTPM()
        let (_, clock, root) = try await makeDevice(tpm)
        let copy = temporaryDirectory().appendingPathComponent("stolen").path
        try FileManager.default.copyItem(atPath: root, toPath: copy)

        // Another machine's TPM: the device secret's object is not there.
        let other = try SoftwareTPM()
        await #expect { try await Keybag.open(root: copy, clock: clock, tpmTCTI: other.tcti) } throws: { error in
            guard case KeybagError.tpm(let why) = error else { return false }
            return why.contains("no such object")
        }
        // No TPM at all.
        await #expect { try await Keybag.open(root: copy, clock: clock, tpmTCTI: "swtpm:path=/nonexistent/sock") } throws: { error in
            guard case KeybagError.tpm(let why) = error else { return false }
            return why.contains("no TPM answers")
        }
        // No file of the copy holds the secret.
        #expect(!FileManager.default.fileExists(atPath: copy + "/device.secret"))
    }

    @Test func anOldKeybagCopiedBackDoesNotResetTheCount() async throws {
        let tpm = try SoftwareTPM()
        try tpm.setDictionaryAttackParameters(maxTries: 20)
        let (_, clock, root) = try await makeDevice(tpm)
        let saved = try Data(contentsOf: URL(fileURLWithPath: root + "/keybag"))
        let keybag = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        // Correct unlocks after the copy was taken are not counted as failures when it comes back.
        _ = try? await keybag.unlock(passcode: "b1")
        try await keybag.unlock(passcode: "123456")
        try await keybag.unlock(passcode: "123456")
        for guess in ["a1", "a2", "a3", "a4", "a5"] {
            _ = try? await keybag.unlock(passcode: guess)
        }
        #expect(await keybag.status.failedAttempts == 5)
        #expect(await keybag.status.delayRemaining == 60)

        // The attacker puts the keybag of before back and "restarts" the device.
        try saved.write(to: URL(fileURLWithPath: root + "/keybag"))
        let reopened = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        let status = await reopened.status
        #expect(status.failedAttempts == 5)
        #expect(status.delayRemaining == 60)   // and the delay starts again
        #expect(status.lastRollback != nil)
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 60, failedAttempts: 5)) { try await reopened.unlock(passcode: "123456") }
        clock.advance(by: 60)
        try await reopened.unlock(passcode: "123456")
    }

    @Test func lockoutRefusesEvenTheRightPasscodeUntilTheOwnerResetsIt() async throws {
        let tpm = try SoftwareTPM()
        try tpm.setDictionaryAttackParameters(maxTries: 2)
        let (_, clock, root) = try await makeDevice(tpm)
        let keybag = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        _ = try? await keybag.unlock(passcode: "0000")
        _ = try? await keybag.unlock(passcode: "1111")
        #expect(await keybag.status.tpmLockout?.inLockout == true)
        await #expect(throws: KeybagError.tpmLockout(failedTries: 2, recoveryInterval: 600)) { try await keybag.unlock(passcode: "123456") }
        #expect(await keybag.status.failedAttempts == 2)   // a refused attempt is not counted
        #expect(await keybag.isAvailable(.noProtection))   // class D still opens

        try tpm.clearLockout()
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.lockState == .unlocked)
    }

    @Test func eraseAfterTenWorksOnTopOfTheTPM() async throws {
        let tpm = try SoftwareTPM()
        try tpm.setDictionaryAttackParameters(maxTries: 32)
        let (_, clock, root) = try await makeDevice(tpm, eraseAfterTen: true)
        let keybag = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        for n in 1...9 {
            _ = try? await keybag.unlock(passcode: "wrong\(n)")
            clock.advance(by: 3600)
        }
        // The same wrong passcode again is not counted, and so never erases.
        _ = try? await keybag.unlock(passcode: "wrong9")
        #expect(await keybag.status.failedAttempts == 9)
        await #expect(throws: KeybagError.erased) { try await keybag.unlock(passcode: "wrong10") }
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try tpm.nvIndices().isEmpty)
        #expect(try tpm.property("TPM2_PT_LOCKOUT_COUNTER") == 10)
    }

    @Test func eraseDestroysTheTPMObjectsSoACopyOpensNothing() async throws {
        let tpm = try SoftwareTPM()
        let (keybag, clock, root) = try await makeDevice(tpm)
        let copy = temporaryDirectory().appendingPathComponent("copy").path
        try FileManager.default.copyItem(atPath: root, toPath: copy)
        try await keybag.erase()
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try tpm.nvIndices().isEmpty)
        // The copy, on the same machine, with the same TPM: its secret is gone.
        await #expect(throws: KeybagError.self) { try await Keybag.open(root: copy, clock: clock, tpmTCTI: tpm.tcti) }
    }

    @Test func enrollAndRemoveKeepEveryFileKey() async throws {
        let tpm = try SoftwareTPM()
        let root = temporaryDirectory().appendingPathComponent("root").path
        let clock = ManualClock()
        let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting, clock: clock)
        let (keyA, wrappedA) = try await keybag.wrapNewFileKey(for: .complete)
        let (keyD, wrappedD) = try await keybag.wrapNewFileKey(for: .noProtection)
        let oldSecret = try Data(contentsOf: URL(fileURLWithPath: root + "/device.secret"))

        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 1)) {
            try await keybag.enrollTPM(passcode: "999999", TPMBinding(tcti: tpm.tcti))
        }
        try await keybag.enrollTPM(passcode: "123456", TPMBinding(tcti: tpm.tcti))
        #expect(!FileManager.default.fileExists(atPath: root + "/device.secret"))
        #expect(await keybag.status.deviceSecret == .tpm(pcrs: nil))

        let reopened = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        #expect(try await reopened.unwrapFileKey(wrappedD) == keyD)
        try await reopened.unlock(passcode: "123456")
        #expect(try await reopened.unwrapFileKey(wrappedA) == keyA)

        // The old secret file, put back, opens nothing of the enrolled keybag.
        try oldSecret.write(to: URL(fileURLWithPath: root + "/device.secret.old"))

        try await reopened.removeTPM(passcode: "123456")
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try tpm.nvIndices().isEmpty)
        let back = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        #expect(await back.status.deviceSecret == .file)
        try await back.unlock(passcode: "123456")
        #expect(try await back.unwrapFileKey(wrappedA) == keyA)
        #expect(try Data(contentsOf: URL(fileURLWithPath: root + "/device.secret")) != oldSecret)
    }

    @Test func changingThePasscodeRetiresTheOldOnesObject() async throws {
        let tpm = try SoftwareTPM()
        let (keybag, clock, root) = try await makeDevice(tpm)
        let before = try tpm.persistentHandles()
        let oldKeybag = try Data(contentsOf: URL(fileURLWithPath: root + "/keybag"))
        try await keybag.changePasscode(from: "123456", to: "567890")
        let after = try tpm.persistentHandles()
        #expect(after.count == 2 && Set(after) != Set(before))
        // The old keybag with the old passcode: its passcode object is gone.
        try oldKeybag.write(to: URL(fileURLWithPath: root + "/keybag"))
        let old = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        await #expect(throws: KeybagError.self) { try await old.unlock(passcode: "123456") }
    }

    @Test func boundToAPCRItOpensOnlyWhileThePCRHoldsItsValue() async throws {
        let tpm = try SoftwareTPM()
        let (_, clock, root) = try await makeDevice(tpm, pcrs: TPMPCRSelection(mask: 1 << 16))
        _ = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        try tpm.tool("tpm2_pcrextend", ["16:sha256=" + String(repeating: "ab", count: 32)])
        await #expect { try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti) } throws: { error in
            guard case KeybagError.tpm(let why) = error else { return false }
            return why.contains("PCRs")
        }
        try tpm.tool("tpm2_pcrreset", ["16"])
        let keybag = try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti)
        try await keybag.unlock(passcode: "123456")
    }

    @Test func aDeviceThatNoLongerOpensCanStillBeErased() async throws {
        let tpm = try SoftwareTPM()
        let (_, clock, root) = try await makeDevice(tpm, pcrs: TPMPCRSelection(mask: 1 << 16))
        try tpm.tool("tpm2_pcrextend", ["16:sha256=" + String(repeating: "cd", count: 32)])
        await #expect(throws: KeybagError.self) { try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti) }
        try Keybag.eraseUnopened(root: root, tpmTCTI: tpm.tcti)
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try tpm.nvIndices().isEmpty)
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).isEmpty)
    }

    @Test func withoutATPMCreationFailsCleanlyAndFileDevicesSaySo() async throws {
        let root = temporaryDirectory().appendingPathComponent("root").path
        await #expect(throws: KeybagError.self) {
            try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting,
                                    tpm: TPMBinding(tcti: "swtpm:path=/nonexistent/sock"))
        }
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).isEmpty)
        let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting)
        let status = await keybag.status
        #expect(status.deviceSecret == .file)
        #expect(status.deviceSecret.consequence.contains("attacked offline"))
        #expect(status.tpmLockout == nil)
    }

    @Test func aTamperedBindingRecordIsRejected() async throws {
        let tpm = try SoftwareTPM()
        let (_, clock, root) = try await makeDevice(tpm)
        var record = try Data(contentsOf: URL(fileURLWithPath: root + "/device.tpm"))
        record[31] = 1   // a reserved byte
        try record.write(to: URL(fileURLWithPath: root + "/device.tpm"))
        await #expect(throws: KeybagError.self) { try await Keybag.open(root: root, clock: clock, tpmTCTI: tpm.tcti) }
    }
}
