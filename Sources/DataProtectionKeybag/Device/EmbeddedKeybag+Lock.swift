import Crypto
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: lock and unlock.
extension EmbeddedKeybag {
    // MARK: - Lock and unlock

    /// Unlocks with the passcode: every class becomes available.
    ///
    /// Wrong passcodes are counted in the keybag (the count survives restarts) before the
    /// passcode is checked, so killing the process mid-check gains nothing. Repeating the same
    /// wrong passcode does not count again. After 5 failures attempts are delayed
    /// (``PasscodePolicy``); with the erase policy on, the 10th failure crypto-erases the device.
    ///
    /// - Throws: ``KeybagError/wrongPasscode(failedAttempts:)``,
    ///   ``KeybagError/passcodeDelayed(retryAfter:failedAttempts:)``, ``KeybagError/erased``.
    package func unlock(passcode: String) throws { try unlock(passcode: SecretBytes(utf8: passcode)) }

    /// ``unlock(passcode:)`` with the passcode in memory the keybag controls (keybagd's path:
    /// from the socket's frame to scrypt, the passcode is never a `String` or an `Array`).
    package func unlock(passcode: SecretBytes) throws {
        guard file.passcodeSet else {
            if isErased { throw KeybagError.erased }
            return   // protection inactive: always unlocked
        }
        let (keys, bPrivate) = try verifyPasscode(passcode)
        let wasAvailable = classKeys[.complete] != nil && state == .unlocked
        cancelGrace()
        adoptUnlockedKeys(keys, bPrivate: bPrivate)
        logger.info("unlocked")
        if !wasAvailable { emit(.didBecomeAvailable) }
    }

    /// Locks the device. Observers hear ``ProtectedDataEvent/willBecomeUnavailable`` now; class-A
    /// keys and the class-B private key are discarded when the grace period ends. Class C stays.
    /// Without a passcode, locking protects nothing and changes nothing (as on iOS).
    package func lock() {
        expireGraceIfDue()
        guard file.passcodeSet, state == .unlocked else { return }
        state = .locked
        let deadline = clock.now().addingTimeInterval(gracePeriod)
        graceDeadline = deadline
        logger.info("locked; class A keys discarded in \(gracePeriod) s")
        emit(.willBecomeUnavailable)
        if gracePeriod <= 0 {
            expireGraceIfDue()
        } else {
            let clock = self.clock
            graceTimer = Task { [weak self] in
                do { try await clock.sleep(until: deadline) } catch { return }
                await self?.expireGraceIfDue()
            }
        }
    }

    /// Undoes a lock whose grace period has not ended — the keys never left memory — as when the
    /// desktop reports it was unlocked (its user authenticated) within the grace period.
    /// Returns `false`, changing nothing, once the grace period is over: then only the passcode
    /// unlocks.
    package func resumeWithinGrace() -> Bool {
        expireGraceIfDue()
        guard state == .locked, graceDeadline != nil, classKeys[.complete] != nil else { return false }
        cancelGrace()
        state = .unlocked
        logger.info("unlocked again within the grace period")
        emit(.didBecomeAvailable)
        return true
    }

    func cancelGrace() {
        graceTimer?.cancel()
        graceTimer = nil
        graceDeadline = nil
    }

    /// Discards class-A keys and the class-B private key once the grace deadline has passed.
    /// Called on every query, so availability never depends on a timer having fired.
    func expireGraceIfDue() {
        guard state == .locked, let deadline = graceDeadline, clock.now() >= deadline else { return }
        cancelGrace()
        discard(.complete)
        discard(.completeUnlessOpen)
        logger.info("grace period over: class A keys discarded")
    }

    func discard(_ cls: ProtectionClass) {
        if cls == .completeUnlessOpen { classBPrivateKey = nil } else { classKeys[cls] = nil }
        generations[cls, default: 0] += 1
        for observer in discardObservers.values { observer(cls) }
    }

    /// Calls `callback`, on the keybag's executor, each time a class key is discarded (the end of
    /// a grace period, an erase). Layers that cache keys derived from a class — open databases —
    /// drop them here, at the moment the class key goes, rather than at their next call.
    @discardableResult
    package func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) -> UUID {
        let token = UUID()
        discardObservers[token] = callback
        return token
    }

    /// Stops calling a discard observer.
    package func removeDiscardObserver(_ token: UUID) { discardObservers[token] = nil }
}
