@_spi(Testing) import DataProtectionKeybag
import Foundation
import Testing

@Suite struct PasscodeTests {
    @Test func wrongPasscodeIsRejectedAndCounted() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 1)) { try await keybag.unlock(passcode: "0000") }
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 2)) { try await keybag.unlock(passcode: "0001") }
        // The same wrong passcode again does not count.
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 2)) { try await keybag.unlock(passcode: "0001") }
        #expect(await keybag.lockState == .beforeFirstUnlock)
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.status.failedAttempts == 0)
    }

    /// The passcode policy in the keybag: 6 characters unless changed (4 to 64), counted as
    /// characters, not bytes; a keybag with a non-default rule is format version 3 (byte 33),
    /// with the default rule version 2; a refused new passcode costs no attempt.
    @Test func thePasscodePolicyIsKeptInTheKeybag() async throws {
        let root = temporaryDirectory() + "/policy"
        await #expect(throws: KeybagError.passcodeTooShort(minimumLength: 6)) {
            _ = try await Keybag.create(root: root, passcode: "12345", kdf: .insecureFastForTesting)
        }
        await #expect(throws: KeybagError.invalidArgument("minimum passcode length 3: it must be from 4 to 64 characters")) {
            _ = try await Keybag.create(root: root, passcode: "12345", kdf: .insecureFastForTesting, minimumPasscodeLength: 3)
        }
        #expect(!FileManager.default.fileExists(atPath: root + "/keybag"))
        let clock = ManualClock()
        let keybag = try await Keybag.create(root: root, passcode: "ééé1", kdf: .insecureFastForTesting, minimumPasscodeLength: 4, clock: clock)
        func header() throws -> [UInt8] { Array(try [UInt8](Data(contentsOf: URL(fileURLWithPath: root + "/keybag")))[0..<36]) }
        #expect(try header()[9] == 3 && header()[33] == 4)
        #expect(await keybag.status.minimumPasscodeLength == 4)
        await #expect(throws: KeybagError.passcodeTooShort(minimumLength: 4)) { try await keybag.changePasscode(from: "ééé1", to: "ééé") }
        try await keybag.setMinimumPasscodeLength(10)
        let reopened = try await Keybag.open(root: root, clock: clock)
        #expect(await reopened.status.minimumPasscodeLength == 10)
        await #expect(throws: KeybagError.deviceLocked(.beforeFirstUnlock)) { try await reopened.setMinimumPasscodeLength(4) }
        try await reopened.unlock(passcode: "ééé1")   // a rule raised later does not lock the current passcode out
        await #expect(throws: KeybagError.passcodeTooShort(minimumLength: 10)) { try await reopened.changePasscode(from: "wrong", to: "123456789") }
        #expect(await reopened.status.failedAttempts == 0)
        try await reopened.changePasscode(from: "ééé1", to: "1234567890")
        try await reopened.removePasscode(current: "1234567890")
        await #expect(throws: KeybagError.passcodeTooShort(minimumLength: 10)) { try await reopened.setPasscode("123456") }
        try await reopened.setMinimumPasscodeLength(6)
        #expect(try header()[9] == 2 && header()[33] == 0)
        try await reopened.setPasscode("123456")
    }

    @Test func delaysEscalateAndSurviveRestarts() async throws {
        let (_, clock, root) = try await makeDevice()
        var keybag = try await Keybag.open(root: root, clock: clock)
        for n in 1...5 {
            await #expect(throws: KeybagError.wrongPasscode(failedAttempts: n)) { try await keybag.unlock(passcode: "bad\(n)") }
        }
        // Restart: the count and the delay are still there.
        keybag = try await Keybag.open(root: root, clock: clock)
        #expect(await keybag.status.failedAttempts == 5)
        #expect(await keybag.status.delayRemaining == 60)
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 60, failedAttempts: 5)) { try await keybag.unlock(passcode: "123456") }
        clock.advance(by: 59)
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 1, failedAttempts: 5)) { try await keybag.unlock(passcode: "123456") }
        clock.advance(by: 1)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 6)) { try await keybag.unlock(passcode: "bad6") }
        #expect(await keybag.status.delayRemaining == 300)
        clock.advance(by: 300)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 7)) { try await keybag.unlock(passcode: "bad7") }
        #expect(await keybag.status.delayRemaining == 900)
        clock.advance(by: 900)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 8)) { try await keybag.unlock(passcode: "bad8") }
        #expect(await keybag.status.delayRemaining == 900)
        clock.advance(by: 900)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 9)) { try await keybag.unlock(passcode: "bad9") }
        #expect(await keybag.status.delayRemaining == 3600)
        clock.advance(by: 3600)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 10)) { try await keybag.unlock(passcode: "bad10") }
        #expect(await keybag.status.delayRemaining == 3600)
        clock.advance(by: 3600)
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.status.failedAttempts == 0)
    }

    @Test func eraseAfterTenFailuresDestroysTheDevice() async throws {
        let (_, clock, root) = try await makeDevice(erasePolicy: true)
        let keybag = try await Keybag.open(root: root, clock: clock)
        for n in 1...9 {
            await #expect(throws: KeybagError.wrongPasscode(failedAttempts: n)) { try await keybag.unlock(passcode: "bad\(n)") }
            clock.advance(by: 3600)
        }
        await #expect(throws: KeybagError.erased) { try await keybag.unlock(passcode: "bad10") }
        #expect(!FileManager.default.fileExists(atPath: root + "/keybag"))
        #expect(!FileManager.default.fileExists(atPath: root + "/device.secret"))
        await #expect(throws: KeybagError.notInitialized(root: root)) { _ = try await Keybag.open(root: root, clock: clock) }
        await #expect(throws: KeybagError.erased) { try await keybag.unlock(passcode: "123456") }
    }

    @Test func changeAndRemovePasscodeRewrapOnlyTheClassKeys() async throws {
        let (keybag, clock, root) = try await makeDevice()
        let (fileKey, wrapped) = try await keybag.wrapNewFileKey(for: .complete)
        try await keybag.changePasscode(from: "123456", to: "abcdef")
        var reopened = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 1)) { try await reopened.unlock(passcode: "123456") }
        try await reopened.unlock(passcode: "abcdef")
        #expect(try await reopened.unwrapFileKey(wrapped) == fileKey)

        try await reopened.removePasscode(current: "abcdef")
        reopened = try await Keybag.open(root: root, clock: clock)
        #expect(await reopened.lockState == .unlocked)
        #expect(try await reopened.unwrapFileKey(wrapped) == fileKey)

        try await reopened.setPasscode("999999")
        reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "999999")
        #expect(try await reopened.unwrapFileKey(wrapped) == fileKey)
    }

    @Test func attemptsFromSeveralProcessesShareOneCounter() async throws {
        let (_, clock, root) = try await makeDevice()
        // Two keybags on one root stand for two processes.
        let first = try await Keybag.open(root: root, clock: clock)
        let second = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 1)) { try await first.unlock(passcode: "a") }
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 2)) { try await second.unlock(passcode: "b") }
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 3)) { try await first.unlock(passcode: "c") }
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 4)) { try await second.unlock(passcode: "d") }
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 5)) { try await first.unlock(passcode: "e") }
        // The delay the first process caused binds the second one too.
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 60, failedAttempts: 5)) { try await second.unlock(passcode: "123456") }
        clock.advance(by: 60)
        try await second.unlock(passcode: "123456")
        try await first.unlock(passcode: "123456")
    }

    @Test func anEraseByAnotherProcessIsNoticed() async throws {
        let (_, clock, root) = try await makeDevice()
        let first = try await Keybag.open(root: root, clock: clock)
        let second = try await Keybag.open(root: root, clock: clock)
        try await second.erase()
        await #expect(throws: KeybagError.erased) { try await first.unlock(passcode: "123456") }
    }

    @Test func passcodeCanBeChangedRightAfterARestart() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        try await keybag.changePasscode(from: "123456", to: "567890")
        let reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "567890")
        await #expect(throws: KeybagError.emptyPasscode) { try await reopened.changePasscode(from: "567890", to: "") }
    }

    @Test func calibratedKDFCostsAtLeast80ms() throws {
        let kdf = try PasscodeKDF.calibrated()
        // Calibration measured ≥ 80 ms; a second measurement may be a little faster (warm caches).
        let cost = try kdf.measureOneAttempt()
        #expect(cost >= .milliseconds(60), "one attempt with \(kdf) took \(cost)")
    }
}
