import Crypto
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: passcode management.
extension EmbeddedKeybag {
    // MARK: - Passcode management

    /// Sets a passcode on a device that has none: A, B and C keys are rewrapped under it.
    package func setPasscode(_ newPasscode: String) throws { try setPasscode(SecretBytes(utf8: newPasscode)) }

    package func setPasscode(_ newPasscode: SecretBytes) throws {
        guard !file.passcodeSet else { throw KeybagError.passcodeAlreadySet }
        try requireNotErased()
        try PasscodePolicy.check(newPasscode, minimumLength: minimumPasscodeLength)
        try rewrapClassKeys(newPasscode: newPasscode)
    }

    /// Changes the passcode. Only the class keys are rewrapped; no file is rewritten.
    /// A wrong `old` passcode counts as a failed attempt.
    package func changePasscode(from old: String, to new: String) throws {
        try changePasscode(from: SecretBytes(utf8: old), to: SecretBytes(utf8: new))
    }

    package func changePasscode(from old: SecretBytes, to new: SecretBytes) throws {
        guard file.passcodeSet else { throw KeybagError.noPasscodeSet }
        // Checked before the old passcode, so a refused new one costs no attempt.
        try PasscodePolicy.check(new, minimumLength: minimumPasscodeLength)
        let (keys, bPrivate) = try verifyPasscode(old)
        adoptUnlockedKeys(keys, bPrivate: bPrivate)
        try rewrapClassKeys(newPasscode: new)
    }

    /// Removes the passcode: protection becomes inactive.
    package func removePasscode(current: String) throws { try removePasscode(current: SecretBytes(utf8: current)) }

    package func removePasscode(current: SecretBytes) throws {
        guard file.passcodeSet else { throw KeybagError.noPasscodeSet }
        let (keys, bPrivate) = try verifyPasscode(current)
        adoptUnlockedKeys(keys, bPrivate: bPrivate)
        try rewrapClassKeys(newPasscode: nil)
    }

    func rewrapClassKeys(newPasscode: SecretBytes?) throws {
        if let newPasscode, newPasscode.isEmpty { throw KeybagError.emptyPasscode }
        guard let bPrivate = classBPrivateKey, classKeys[.complete] != nil,
            classKeys[.completeUntilFirstUserAuthentication] != nil
        else {
            throw KeybagError.deviceLocked(state)
        }
        var replacedObject: UInt32 = 0
        try withKeybagLock {
            var updated = file.withNewSalt(Self.randomBytes(16))
            updated.passcodeSet = newPasscode != nil
            var kek = secret.derive(Self.labelNoPasscode)
            var newObject: UInt32 = 0
            if let newPasscode {
                (kek, newObject) = try Self.newPasscodeKEK(
                    secret: secret, binding: binding, device: tpmDevice, kdf: file.kdf,
                    salt: updated.salt, passcode: newPasscode)
            }
            if var fields = updated.tpm {
                replacedObject = fields.passcodeObject
                fields.passcodeObject = newObject
                fields.counterBase = fields.counterSeen   // failures start again from 0
                updated.tpm = fields
                do { try forgiveAttemptsInTPM(upTo: fields.counterSeen) } catch {
                    if newObject != 0 { try? tpmDevice.remove(objects: [newObject], counter: nil) }
                    throw error
                }
            }
            updated.records = try Self.makeRecords(
                keys: classKeys, bPrivate: bPrivate, kek: kek,
                passcodeSet: updated.passcodeSet, dKEK: secret.derive(Self.labelClassD))
            do {
                try persist(updated)
            } catch {
                if newObject != 0 { try? tpmDevice.remove(objects: [newObject], counter: nil) }
                throw error
            }
        }
        if replacedObject != 0 {
            // The old passcode's object goes, so the old passcode opens nothing even with an old keybag.
            do { try tpmDevice.remove(objects: [replacedObject], counter: nil) } catch {
                logger.warning(
                    "the old passcode's TPM object 0x\(String(replacedObject, radix: 16)) could not be removed: \(error)"
                )
            }
        }
        state = .unlocked
    }

    /// Checks a passcode with the failure counter and delays; returns the unwrapped keys.
    ///
    /// Runs under the keybag lock with the keybag reloaded from disk, so attempts from several
    /// processes are serialized and all count against one counter.
    func verifyPasscode(
        _ passcode: SecretBytes
    ) throws -> ([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey) {
        try requireNotErased()
        var repeated = false
        let outcome: Result<([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey), KeybagError> =
            try withKeybagLock {
                prepareSpare()   // while there is room: on a full disk the attempt is counted through it
                let now = clock.now()
                // With a TPM: a keybag copied back is caught here, and its count restored.
                let counter = try reconcileAttemptCounter(now: now)
                if let remaining = delayRemaining(now: now) {
                    return .failure(.passcodeDelayed(retryAfter: remaining, failedAttempts: Int(file.failedAttempts)))
                }
                try requireTPMNotLockedOut()
                let stretched = try file.kdf.derive(passcode: passcode, salt: file.salt)
                let tag = stretched.withUnsafeBytes {
                    Array(
                        HMAC<SHA256>.authenticationCode(for: $0, using: secret.derive(Self.labelFailedTag)).prefix(16))
                }
                if file.failedAttempts > 0, tag == file.lastFailedTag {
                    // The same wrong passcode again: rejected, but not counted (as on iOS), and so
                    // never the attempt that erases.
                    repeated = true
                    return .failure(.wrongPasscode(failedAttempts: Int(file.failedAttempts)))
                }
                // Count the attempt on disk (and in the TPM's counter) *before* checking it.
                var counted = file
                // saturate
                counted.failedAttempts = counted.failedAttempts == .max ? .max : counted.failedAttempts + 1
                counted.lastFailureMillis = Self.millis(now)
                if let counter {
                    try countAttemptInTPM(&counted, counter: counter)
                } else {
                    try persist(counted)
                }

                if let kek = try attemptKEK(stretched: stretched),
                    let unwrapped = try? Self.unwrapPasscodeClasses(file, kek: kek)
                {
                    var reset = file
                    reset.failedAttempts = 0
                    reset.lastFailureMillis = 0
                    reset.lastFailedTag = Self.zeros16
                    if let seen = reset.tpm?.counterSeen {
                        try forgiveAttemptsInTPM(upTo: seen)
                        reset.tpm?.counterBase = seen
                    }
                    try persist(reset)
                    return .success(unwrapped)
                }
                // Only a passcode known to be wrong is remembered as "the last wrong one".
                var failed = file
                failed.lastFailedTag = tag
                try persist(failed)
                return .failure(.wrongPasscode(failedAttempts: Int(file.failedAttempts)))
            }
        if case .failure(.wrongPasscode(let failures)) = outcome {
            logger.notice("wrong passcode (\(failures) consecutive failures)")
            if file.eraseAfterTenFailures, failures >= PasscodePolicy.eraseThreshold, !repeated {
                try erase()
                throw KeybagError.erased
            }
        }
        return try outcome.get()
    }

    /// Runs `body` holding an exclusive `flock` on `ROOT/keybag.lock`, with the keybag freshly
    /// reloaded from disk: read-modify-write of the keybag is serialized across processes.
    func withKeybagLock<T>(_ body: () throws -> T) throws -> T {
        let lockPath = layout.keybagLock
        let fd = try POSIXFile.open(lockPath, .readWrite, options: [.create], permissions: [.ownerReadWrite])
        defer { try? fd.close() }   // closing the descriptor releases the lock
        try POSIXFile.check("flock", lockPath) { flock(fd.rawValue, LOCK_EX) }
        let path = root + "/" + KeybagFile.fileName
        let current =
            POSIXFile.kind(path).exists
            ? try KeybagFile.decode(try POSIXFile.readAll(path), macKey: secret.derive(KeybagFile.macLabel)) : nil
        guard let current, current.uuid == id else {
            // Another process erased the device (or set up a new one in its place).
            isErased = true
            for cls in ProtectionClass.allCases { discard(cls) }
            throw KeybagError.erased
        }
        if current.generation < file.generation {
            // An older keybag was put back while this process held a newer one: keep the newer
            // (its failed-attempt count), write it back, and say so.
            var restored = file
            restored.lastRollbackMillis = Self.millis(clock.now())
            logger.error(
                "keybag rollback detected: generation \(current.generation) replaced \(file.generation); the newer keybag was restored"
            )
            try persist(restored)
        } else {
            file = current
        }
        return try body()
    }

    /// Where the root's files are.
    package nonisolated var layout: DataRootLayout { DataRootLayout(root: root) }

    func delayRemaining(now: Date) -> TimeInterval? {
        let delay = PasscodePolicy.delay(afterFailures: Int(file.failedAttempts))
        guard delay > 0 else { return nil }
        let last = Date(timeIntervalSince1970: TimeInterval(file.lastFailureMillis) / 1000)
        // A clock set back before the last failure must not shorten or lengthen the delay beyond one period.
        let elapsed = min(max(now.timeIntervalSince(last), 0), delay)
        let remaining = delay - elapsed
        return remaining > 0 ? remaining : nil
    }
}
