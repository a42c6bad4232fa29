import DataProtectionKeybag
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
        try await keybag.unlock(passcode: "1234")
        #expect(await keybag.status.failedAttempts == 0)
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
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 60, failedAttempts: 5)) { try await keybag.unlock(passcode: "1234") }
        clock.advance(by: 59)
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 1, failedAttempts: 5)) { try await keybag.unlock(passcode: "1234") }
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
        try await keybag.unlock(passcode: "1234")
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
        await #expect(throws: KeybagError.erased) { try await keybag.unlock(passcode: "1234") }
    }

    @Test func changeAndRemovePasscodeRewrapOnlyTheClassKeys() async throws {
        let (keybag, clock, root) = try await makeDevice()
        let (fileKey, wrapped) = try await keybag.wrapNewFileKey(for: .complete)
        try await keybag.changePasscode(from: "1234", to: "abcd")
        var reopened = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: 1)) { try await reopened.unlock(passcode: "1234") }
        try await reopened.unlock(passcode: "abcd")
        #expect(try await reopened.unwrapFileKey(wrapped) == fileKey)

        try await reopened.removePasscode(current: "abcd")
        reopened = try await Keybag.open(root: root, clock: clock)
        #expect(await reopened.lockState == .unlocked)
        #expect(try await reopened.unwrapFileKey(wrapped) == fileKey)

        try await reopened.setPasscode("9999")
        reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "9999")
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
        await #expect(throws: KeybagError.passcodeDelayed(retryAfter: 60, failedAttempts: 5)) { try await second.unlock(passcode: "1234") }
        clock.advance(by: 60)
        try await second.unlock(passcode: "1234")
        try await first.unlock(passcode: "1234")
    }

    @Test func anEraseByAnotherProcessIsNoticed() async throws {
        let (_, clock, root) = try await makeDevice()
        let first = try await Keybag.open(root: root, clock: clock)
        let second = try await Keybag.open(root: root, clock: clock)
        try await second.erase()
        await #expect(throws: KeybagError.erased) { try await first.unlock(passcode: "1234") }
    }

    @Test func passcodeCanBeChangedRightAfterARestart() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        try await keybag.changePasscode(from: "1234", to: "5678")
        let reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "5678")
        await #expect(throws: KeybagError.emptyPasscode) { try await reopened.changePasscode(from: "5678", to: "") }
    }

    @Test func calibratedKDFCostsAtLeast80ms() throws {
        let kdf = try PasscodeKDF.calibrated()
        // Calibration measured ≥ 80 ms; a second measurement may be a little faster (warm caches).
        let cost = try kdf.measureOneAttempt()
        #expect(cost >= .milliseconds(60), "one attempt with \(kdf) took \(cost)")
    }
}
