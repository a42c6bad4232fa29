import Crypto
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: a device secret sealed by the TPM (FORMAT.md §2c).
//
// The TPM keeps two secrets in persistent objects: the device secret (no authorization, not
// subject to lockout: class D and the keybag's MAC need it before the first unlock) and a
// passcode secret it releases only for an authorization value derived from the passcode — so the
// TPM checks every attempt and counts wrong ones in its dictionary-attack protection. The class
// KEK of A, B and C then needs both secrets and the stretched passcode. Failed attempts are also
// counted by a TPM monotonic counter: failures = counter − base, where the base is the counter's
// value at the last correct passcode, so a keybag copied back can only raise the count.
extension EmbeddedKeybag {
    static let labelPasscodeTPM = "DataProtection v1 class KEK with passcode and TPM"
    static let labelTPMPasscodeAuth = "DataProtection v1 TPM passcode authorization"
    static let labelTPMCounterAuth = "DataProtection v1 TPM counter authorization"

    nonisolated var tpmDevice: TPMDevice { TPMDevice(tcti: tpmTCTI) }

    // MARK: - Keys

    /// The class KEK of A, B and C: HKDF(device secret, salt: stretched passcode [‖ TPM passcode secret]).
    static func passcodeKEK(secret: DeviceSecret, stretched: SymmetricKey, passcodeSecret: SecretBytes?) -> SymmetricKey
    {
        stretched.withUnsafeBytes { stretchedBytes in
            guard let passcodeSecret else { return secret.derive(labelPasscode, salt: stretchedBytes) }
            let salt = SecretBytes(count: stretchedBytes.count + passcodeSecret.count)
            salt.withUnsafeMutableBytes { out in
                out.copyMemory(from: stretchedBytes)
                passcodeSecret.withUnsafeBytes {
                    UnsafeMutableRawBufferPointer(rebasing: out[stretchedBytes.count...]).copyMemory(from: $0)
                }
            }
            defer { salt.wipe() }
            return salt.withUnsafeBytes { secret.derive(labelPasscodeTPM, salt: $0) }
        }
    }

    /// The authorization value of the TPM passcode object: HKDF(device secret, salt: stretched passcode).
    static func tpmPasscodeAuth(secret: DeviceSecret, stretched: SymmetricKey) -> [UInt8] {
        stretched.withUnsafeBytes { secret.derive(labelTPMPasscodeAuth, salt: $0).withUnsafeBytes { Array($0) } }
    }

    /// The authorization value of the attempt counter (only this root's holder can count).
    static func tpmCounterAuth(secret: DeviceSecret) -> [UInt8] {
        secret.derive(labelTPMCounterAuth).withUnsafeBytes { Array($0) }
    }

    /// Stretches a new passcode and makes the KEK for it; with a TPM, seals a new passcode secret
    /// first and returns its object (0 without a TPM).
    static func newPasscodeKEK(
        secret: DeviceSecret, binding: TPMBindingRecord?, device: TPMDevice, kdf: PasscodeKDF,
        salt: [UInt8], passcode: SecretBytes
    ) throws -> (kek: SymmetricKey, passcodeObject: UInt32) {
        let stretched = try kdf.derive(passcode: passcode, salt: salt)
        guard let binding else { return (passcodeKEK(secret: secret, stretched: stretched, passcodeSecret: nil), 0) }
        let passcodeSecret = SecretBytes(count: 32)
        passcodeSecret.withUnsafeMutableBytes { out in
            SymmetricKey(size: .bits256).withUnsafeBytes { out.copyMemory(from: $0) }
        }
        defer { passcodeSecret.wipe() }
        var auth = tpmPasscodeAuth(secret: secret, stretched: stretched)
        defer { wipe(&auth) }
        let object = try tpmCall("sealing the passcode secret", device) {
            try passcodeSecret.withUnsafeBytes {
                var bytes = Array($0)
                defer { wipe(&bytes) }
                return try device.sealPasscodeSecret(bytes, authValue: auth, pcrs: binding.pcrs)
            }
        }
        return (passcodeKEK(secret: secret, stretched: stretched, passcodeSecret: passcodeSecret), object)
    }

    /// The KEK for one passcode attempt, or `nil` when the TPM rejected the passcode (and counted it).
    func attemptKEK(stretched: SymmetricKey) throws -> SymmetricKey? {
        guard binding != nil, let fields = file.tpm else {
            return Self.passcodeKEK(secret: secret, stretched: stretched, passcodeSecret: nil)
        }
        let device = tpmDevice
        var auth = Self.tpmPasscodeAuth(secret: secret, stretched: stretched)
        defer { Self.wipe(&auth) }
        guard
            let passcodeSecret = try Self.tpmCall(
                "checking the passcode", device,
                {
                    try device.unsealPasscodeSecret(at: fields.passcodeObject, authValue: auth, pcrs: binding?.pcrs)
                })
        else { return nil }
        defer { passcodeSecret.wipe() }
        return Self.passcodeKEK(secret: secret, stretched: stretched, passcodeSecret: passcodeSecret)
    }

    // MARK: - The attempt counter

    /// With a TPM: reads the attempt counter and, when the keybag records less than it (an older
    /// keybag was copied back), restores the truth — failures = counter − base, the delay restarted
    /// now — and records the rollback. Returns the counter, or `nil` without a TPM.
    @discardableResult
    func reconcileAttemptCounter(now: Date) throws -> UInt64? {
        guard binding != nil, let fields = file.tpm else { return nil }
        let device = tpmDevice
        let auth = Self.tpmCounterAuth(secret: secret)
        let counter = try Self.tpmCall("reading the attempt counter", device) {
            try device.readCounter(at: fields.counterIndex, authValue: auth)
        }
        guard fields.counterSeen < counter else { return counter }
        // The TPM's own record of the last correct passcode: the count does not include the
        // correct unlocks made since the keybag put back was current.
        let base = try Self.tpmCall("reading the attempt base", device) {
            try device.readBase(at: fields.baseIndex, authValue: auth)
        }
        let failures = UInt32(clamping: counter - min(max(base, fields.counterBase), counter))
        var repaired = file
        repaired.tpm?.counterSeen = counter
        repaired.tpm?.counterBase = min(max(base, fields.counterBase), counter)
        repaired.failedAttempts = failures
        if repaired.failedAttempts > 0 { repaired.lastFailureMillis = Self.millis(now) }
        repaired.lastRollbackMillis = Self.millis(now)
        logger.error(
            "keybag rollback detected: it records attempt counter \(fields.counterSeen), the TPM's is \(counter); \(repaired.failedAttempts) failed attempts restored"
        )
        try persist(repaired)
        return counter
    }

    /// Counts one attempt in the TPM: the keybag records the new value first, then the counter
    /// moves (a crash between leaves the keybag ahead, which is not a rollback).
    func countAttemptInTPM(_ counted: inout KeybagFile, counter: UInt64) throws {
        guard let fields = counted.tpm else { return }
        counted.tpm?.counterSeen = counter + 1
        counted.failedAttempts = UInt32(clamping: counter + 1 - fields.counterBase)
        try persist(counted)
        let device = tpmDevice
        let auth = Self.tpmCounterAuth(secret: secret)
        try Self.tpmCall("counting the attempt", device) {
            try device.incrementCounter(at: fields.counterIndex, authValue: auth)
        }
    }

    /// Records in the TPM that the failures up to `counter` are forgiven (a correct passcode, or a
    /// new one): a keybag put back later cannot count them again.
    func forgiveAttemptsInTPM(upTo counter: UInt64) throws {
        guard let fields = file.tpm else { return }
        let device = tpmDevice
        let auth = Self.tpmCounterAuth(secret: secret)
        try Self.tpmCall("recording the attempt base", device) {
            try device.writeBase(counter, at: fields.baseIndex, authValue: auth)
        }
    }

    /// The TPM's lockout state, thrown as ``KeybagError/tpmLockout(failedTries:recoveryInterval:)`` when it is
    /// locked out.
    func requireTPMNotLockedOut() throws {
        guard binding != nil, file.passcodeSet else { return }
        let device = tpmDevice
        let state = try Self.tpmCall("reading the lockout state", device) { try device.lockoutState() }
        if state.inLockout {
            throw KeybagError.tpmLockout(
                failedTries: Int(state.failedTries), recoveryInterval: Int(state.recoveryInterval))
        }
    }

    // MARK: - Creating, loading

    static func createSealedByTPM(
        root: String, passcode: String?, kdf: PasscodeKDF, graceMillis: UInt32,
        eraseAfterTenFailures: Bool, minimumPasscodeLength: UInt8, tpm: TPMBinding,
        clock: any KeybagClock
    ) async throws -> EmbeddedKeybag {
        let layout = DataRootLayout(root: root)
        let device = TPMDevice(tcti: tpm.tcti)
        let secret = DeviceSecret.generate()
        var created = TPMCreations()
        do {
            let (record, fields) = try sealNewDevice(secret, device: device, pcrs: tpm.pcrs, created: &created)
            let keys: [ProtectionClass: SymmetricKey] = [
                .complete: SymmetricKey(size: .bits256),
                .completeUntilFirstUserAuthentication: SymmetricKey(size: .bits256),
                .noProtection: SymmetricKey(size: .bits256),
            ]
            let bPrivate = Curve25519.KeyAgreement.PrivateKey()
            var file = KeybagFile(
                uuid: UUID(), passcodeSet: passcode != nil, eraseAfterTenFailures: eraseAfterTenFailures, kdf: kdf,
                salt: randomBytes(16), failedAttempts: 0, lastFailureMillis: 0, lastFailedTag: zeros16,
                gracePeriodMillis: graceMillis, records: [], generation: 1, tpm: fields)
            file.minimumPasscodeLength = minimumPasscodeLength
            var kek = secret.derive(labelNoPasscode)
            if let passcode {
                let made = try newPasscodeKEK(
                    secret: secret, binding: record, device: device, kdf: kdf, salt: file.salt,
                    passcode: SecretBytes(utf8: passcode))
                created.objects.append(made.passcodeObject)
                file.tpm?.passcodeObject = made.passcodeObject
                kek = made.kek
            }
            file.records = try makeRecords(
                keys: keys, bPrivate: bPrivate, kek: kek, passcodeSet: file.passcodeSet,
                dKEK: secret.derive(labelClassD))
            try POSIXFile.writeNew(layout.tpmBinding, record.encoded)
            do {
                try POSIXFile.writeAtomically(
                    layout.keybag, file.encoded(macKey: secret.derive(KeybagFile.macLabel)),
                    permissions: [.ownerReadWrite])
            } catch {
                unlink(layout.tpmBinding)
                throw error
            }
            let keybag = EmbeddedKeybag(
                root: root, secret: secret, binding: record, file: file, clock: clock, tpmTCTI: tpm.tcti)
            await keybag.adoptUnlockedKeys(keys, bPrivate: bPrivate)
            return keybag
        } catch {
            created.remove(from: device)
            throw error
        }
    }

    /// What an enrollment has created in the TPM so far, removed again if it fails.
    struct TPMCreations {
        var objects: [UInt32] = []
        var counter: UInt32?
        var base: UInt32?

        func remove(from device: TPMDevice) {
            try? device.remove(objects: objects, counter: counter, base: base)
        }
    }

    /// Seals `secret` in the TPM and creates the attempt counter and its base record: the
    /// binding record and the keybag's TPM fields (no passcode object yet).
    static func sealNewDevice(
        _ secret: DeviceSecret, device: TPMDevice, pcrs: TPMPCRSelection?,
        created: inout TPMCreations
    ) throws -> (TPMBindingRecord, KeybagTPMFields) {
        let record = try tpmCall("sealing the device secret", device) { try secret.seal(in: device, pcrs: pcrs) }
        created.objects.append(record.deviceObject)
        let auth = tpmCounterAuth(secret: secret)
        let index = try tpmCall("creating the attempt counter", device) { try device.defineCounter(authValue: auth) }
        created.counter = index
        let counter = try tpmCall("reading the attempt counter", device) {
            try device.readCounter(at: index, authValue: auth)
        }
        let base = try tpmCall("creating the attempt base", device) {
            try device.defineBase(authValue: auth, value: counter)
        }
        created.base = base
        return (
            record,
            KeybagTPMFields(
                passcodeObject: 0, counterIndex: index, baseIndex: base, counterBase: counter,
                counterSeen: counter, bindingDigest: record.digest)
        )
    }

    /// The device secret (from its file or from the TPM) and the keybag it authenticates.
    ///
    /// When both `device.secret` and `device.tpm` exist, an enrollment or a removal was
    /// interrupted: whichever secret authenticates the keybag wins, and the other is cleared away.
    static func loadSecretAndKeybag(
        root: String, tpmTCTI: String
    ) throws -> (DeviceSecret, TPMBindingRecord?, KeybagFile) {
        let layout = DataRootLayout(root: root)
        // Under the keybag lock: an enrollment, a removal or a recovery in another process is
        // either finished or not begun.
        let lock = try POSIXFile.open(layout.keybagLock, .readWrite, options: [.create], permissions: [.ownerReadWrite])
        defer { try? lock.close() }
        try POSIXFile.check("flock", layout.keybagLock) { flock(lock.rawValue, LOCK_EX) }
        let bytes = try POSIXFile.readAll(layout.keybag)
        let hasFile = POSIXFile.kind(layout.deviceSecret).exists
        guard POSIXFile.kind(layout.tpmBinding).exists else {
            let secret = try DeviceSecret.load(from: root)
            return (secret, nil, try KeybagFile.decode(bytes, macKey: secret.derive(KeybagFile.macLabel)))
        }
        let record = try TPMBindingRecord.decode(try POSIXFile.readAll(layout.tpmBinding), path: layout.tpmBinding)
        let device = TPMDevice(tcti: tpmTCTI)
        do {
            let secret = try tpmCall("unsealing the device secret", device) {
                try DeviceSecret.unseal(record, from: device)
            }
            let file = try KeybagFile.decode(bytes, macKey: secret.derive(KeybagFile.macLabel))
            guard let fields = file.tpm, fields.bindingDigest == record.digest else {
                throw KeybagError.corruptKeybag(
                    "it does not name \(layout.tpmBinding) as its device secret's TPM binding")
            }
            if hasFile { DeviceSecret.destroy(in: root) }   // an enrollment finished but for this
            return (secret, record, file)
        } catch {
            guard hasFile else { throw error }
            // A removal finished but for this, or an enrollment stopped before its keybag was written.
            let secret = try DeviceSecret.load(from: root)
            let file = try KeybagFile.decode(bytes, macKey: secret.derive(KeybagFile.macLabel))
            if file.tpm == nil {
                // Only a handle of this library's range: the record was never authenticated.
                if TPMDevice.persistentRange.contains(record.deviceObject) {
                    try? device.remove(objects: [record.deviceObject], counter: nil)
                }
                unlink(layout.tpmBinding)
            }
            return (secret, nil, file)
        }
    }

    // MARK: - Enrolling and removing

    /// Moves the device secret into the TPM: a new secret is sealed there, every class key is
    /// rewrapped under keys derived from it (no file is rewritten), and `device.secret` is
    /// overwritten and removed. Needs the device unlocked, and the passcode when one is set.
    package func enrollTPM(passcode: SecretBytes?, binding requested: TPMBinding) throws {
        try requireNotErased()
        guard binding == nil else {
            throw KeybagError.invalidArgument("the device secret is already sealed by the TPM")
        }
        try unlockForRewrap(passcode: passcode)
        let device = TPMDevice(tcti: requested.tcti)
        let newSecret = DeviceSecret.generate()
        var created = TPMCreations()
        do {
            try withKeybagLock {
                guard passcode != nil || !file.passcodeSet else {
                    throw KeybagError.invalidArgument("the passcode is needed to rewrap the class keys")
                }
                let (record, fields) = try Self.sealNewDevice(
                    newSecret, device: device, pcrs: requested.pcrs, created: &created)
                var updated = file.withNewSalt(Self.randomBytes(16))
                updated.tpm = fields
                var kek = newSecret.derive(Self.labelNoPasscode)
                if let passcode, file.passcodeSet {
                    let made = try Self.newPasscodeKEK(
                        secret: newSecret, binding: record, device: device, kdf: file.kdf,
                        salt: updated.salt, passcode: passcode)
                    created.objects.append(made.passcodeObject)
                    updated.tpm?.passcodeObject = made.passcodeObject
                    kek = made.kek
                }
                // Commit: the binding, then the keybag under the new secret, then the old file goes.
                try commitNewSecret(newSecret, updated, kek: kek, recordedIn: layout.tpmBinding) {
                    try POSIXFile.writeNew(layout.tpmBinding, record.encoded)
                }
                binding = record
                DeviceSecret.destroy(in: root)
                try? POSIXFile.syncDirectory(root)
            }
        } catch {
            if binding == nil { created.remove(from: device) }
            throw error
        }
        logger.notice("device secret sealed by the TPM")
    }

    /// Moves the device secret back into a file: a new `device.secret`, every class key rewrapped
    /// under it, then the TPM's objects and counter removed. Needs the device unlocked, and the
    /// passcode when one is set.
    package func removeTPM(passcode: SecretBytes?) throws {
        try requireNotErased()
        guard let record = binding, file.tpm != nil else {
            throw KeybagError.invalidArgument("the device secret is not sealed by a TPM")
        }
        try unlockForRewrap(passcode: passcode)
        try withKeybagLock {
            // The fields and the passcode state as they are now, under the lock.
            guard let fields = file.tpm else {
                throw KeybagError.invalidArgument("the device secret is not sealed by a TPM")
            }
            let passcode = file.passcodeSet ? passcode : nil
            guard passcode != nil || !file.passcodeSet else {
                throw KeybagError.invalidArgument("the passcode is needed to rewrap the class keys")
            }
            let newSecret = DeviceSecret.generate()
            var updated = file.withNewSalt(Self.randomBytes(16))
            updated.tpm = nil
            let kek =
                try passcode.map {
                    try Self.newPasscodeKEK(
                        secret: newSecret, binding: nil, device: tpmDevice, kdf: file.kdf, salt: updated.salt,
                        passcode: $0
                    ).kek
                } ?? newSecret.derive(Self.labelNoPasscode)
            try commitNewSecret(newSecret, updated, kek: kek, recordedIn: layout.deviceSecret) {
                try newSecret.store(in: root)
            }
            binding = nil
            unlink(layout.tpmBinding)
            try? POSIXFile.syncDirectory(root)
            let device = tpmDevice
            try Self.tpmCall("removing the TPM objects", device) {
                try device.remove(
                    objects: [record.deviceObject, fields.passcodeObject], counter: fields.counterIndex,
                    base: fields.baseIndex)
            }
        }
        logger.notice("device secret moved from the TPM to \(layout.deviceSecret)")
    }

    /// Makes `newSecret` the device secret: every class key is rewrapped under it (A, B and C
    /// under `kek`) into `updated`, `record` writes the file that finds the new secret
    /// (`recordPath`), and the keybag is written under it. On failure the old secret stays in
    /// force and `recordPath` is removed.
    private func commitNewSecret(
        _ newSecret: DeviceSecret, _ updated: KeybagFile, kek: SymmetricKey, recordedIn recordPath: String,
        record: () throws -> Void
    ) throws {
        guard let bPrivate = classBPrivateKey else { throw KeybagError.deviceLocked(state) }
        var updated = updated
        updated.records = try Self.makeRecords(
            keys: classKeys, bPrivate: bPrivate, kek: kek, passcodeSet: updated.passcodeSet,
            dKEK: newSecret.derive(Self.labelClassD))
        try record()
        let oldSecret = secret
        secret = newSecret
        do {
            try persist(updated)
        } catch {
            secret = oldSecret
            unlink(recordPath)
            throw error
        }
    }

    /// Checks the passcode (when one is set) and makes sure every class key is in memory.
    private func unlockForRewrap(passcode: SecretBytes?) throws {
        if file.passcodeSet {
            guard let passcode else {
                throw KeybagError.invalidArgument("the passcode is needed to rewrap the class keys")
            }
            let (keys, bPrivate) = try verifyPasscode(passcode)
            adoptUnlockedKeys(keys, bPrivate: bPrivate)
        }
        try requireUnlocked()
    }

    /// Removes this root's TPM objects and counter (part of an erase).
    func removeTPMObjects() throws {
        guard let record = binding else { return }
        let fields = file.tpm
        let device = tpmDevice
        try Self.tpmCall("removing the TPM objects", device) {
            try device.remove(
                objects: [record.deviceObject, fields?.passcodeObject ?? 0], counter: fields?.counterIndex,
                base: fields?.baseIndex)
        }
    }

    // MARK: - Helpers

    /// Runs a TPM operation; its ``TPMError`` becomes a ``KeybagError`` saying what it means here.
    static func tpmCall<T>(_ what: String, _ device: TPMDevice, _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as TPMError {
            switch error.kind {
            case .lockout:
                let state = try? device.lockoutState()
                throw KeybagError.tpmLockout(
                    failedTries: Int(state?.failedTries ?? 0), recoveryInterval: Int(state?.recoveryInterval ?? 0))
            case .softwareStackMissing:
                throw KeybagError.tpm("\(what): no TPM support here: \(error.detail)")
            case .unreachable:
                throw KeybagError.tpm("\(what): no TPM answers on \(device.tcti) (\(error.detail))")
            case .policyFailed:
                throw KeybagError.tpm(
                    "\(what): the TPM refused: the PCRs this device is bound to no longer hold their enrolled values")
            case .missing:
                throw KeybagError.tpm(
                    "\(what): the TPM has no such object (erased, or this is another machine's TPM): \(error)")
            case .noSpace:
                throw KeybagError.tpm("\(what): the TPM's non-volatile memory is full: \(error)")
            case .authorizationFailed, .other:
                throw KeybagError.tpm("\(what): \(error)")
            }
        }
    }

    /// Zeroes a secret held in an array.
    static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } }
    }

    static func millis(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }
}
