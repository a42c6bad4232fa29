import Crypto
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

/// The device kept in this process: its keybag, its lock state and the class keys the lock
/// state allows. ``Keybag`` fronts it — or the one a keybagd daemon keeps.
///
/// It starts *before first unlock* — as a device does after every boot — unless no passcode
/// is set, in which case protection is inactive and everything is available at once. Class keys
/// never leave the actor: file keys are wrapped and unwrapped here.
package actor EmbeddedKeybag {
    /// The data root this keybag belongs to.
    package nonisolated let root: String
    /// The keybag's identity; every file key it wraps names it.
    package nonisolated let id: UUID
    /// The clock grace periods and passcode delays are measured on.
    package nonisolated let clock: any KeybagClock
    /// The TCTI of the TPM that seals the device secret, when one does.
    package nonisolated let tpmTCTI: String

    var secret: DeviceSecret
    /// Where the TPM keeps the device secret, or `nil` while it is a file.
    var binding: TPMBindingRecord?
    var file: KeybagFile
    var state: LockState = .beforeFirstUnlock
    var classKeys: [ProtectionClass: SymmetricKey] = [:]
    var classBPrivateKey: Curve25519.KeyAgreement.PrivateKey?
    let classBPublicKey: Curve25519.KeyAgreement.PublicKey
    var graceDeadline: Date?
    var graceTimer: Task<Void, Never>?
    var generations: [ProtectionClass: Int] = [:]
    var streams: [UUID: AsyncStream<ProtectedDataEvent>.Continuation] = [:]
    var observers: [UUID: @Sendable (ProtectedDataEvent) -> Void] = [:]
    var discardObservers: [UUID: @Sendable (ProtectionClass) -> Void] = [:]
    package internal(set) var isErased = false
    let logger = Logger(label: "dataprotection.keybag")

    static let labelClassD = "DataProtection v1 class D KEK"
    static let labelNoPasscode = "DataProtection v1 class KEK without passcode"
    static let labelPasscode = "DataProtection v1 class KEK with passcode"
    static let labelFailedTag = "DataProtection v1 failed passcode tag"

    // MARK: - Creating and opening

    /// Sets up a new device in `root`: a device secret, class keys and a keybag.
    ///
    /// - Parameters:
    ///   - passcode: The passcode, or `nil` for none (protection inactive, as on iOS).
    ///   - kdf: scrypt parameters; `nil` calibrates them so one attempt costs ≥ 80 ms here.
    ///   - gracePeriod: Seconds between a lock and the discarding of class-A keys.
    /// - Returns: The keybag, unlocked.
    /// A data root is this user's alone (0700): a directory that existed with wider permissions is
    /// narrowed, and one owned by another user, or that cannot be narrowed, is refused.
    static func makePrivate(root: String) throws {
        var st = stat()
        guard stat(root, &st) == 0 else { throw KeybagError.io(path: root, reason: String(cString: strerror(errno))) }
        guard st.st_mode & S_IFMT == S_IFDIR else { throw KeybagError.io(path: root, reason: "not a directory") }
        guard st.st_uid == geteuid() else {
            throw KeybagError.io(
                path: root,
                reason:
                    "the data root belongs to uid \(st.st_uid), not to this user (uid \(geteuid())): it would not be private"
            )
        }
        guard st.st_mode & 0o7077 != 0 else { return }
        guard chmod(root, st.st_mode & 0o700) == 0 else {
            throw KeybagError.io(
                path: root, reason: "cannot make the data root private (mode 0700): \(String(cString: strerror(errno)))"
            )
        }
    }

    package static func create(
        root: String, passcode: String?, kdf: PasscodeKDF? = nil,
        gracePeriod: TimeInterval = 10, eraseAfterTenFailures: Bool = false,
        minimumPasscodeLength: Int = PasscodePolicy.defaultMinimumLength,
        tpm: TPMBinding? = nil, clock: any KeybagClock = SystemClock()
    ) async throws -> EmbeddedKeybag {
        let minimumLength = try PasscodePolicy.validMinimumLength(minimumPasscodeLength)
        if let passcode { try PasscodePolicy.check(SecretBytes(utf8: passcode), minimumLength: minimumLength) }
        let storedMinimum = UInt8(minimumLength == PasscodePolicy.defaultMinimumLength ? 0 : minimumLength)
        let graceMillis = try PasscodePolicy.gracePeriodMillis(gracePeriod)
        let layout = DataRootLayout(root: root)
        let keybagPath = layout.keybag
        if POSIXFile.kind(keybagPath).exists || POSIXFile.kind(layout.deviceSecret).exists
            || POSIXFile.kind(layout.tpmBinding).exists
        {
            throw KeybagError.alreadyInitialized(root: root)
        }
        do {
            try FileManager.default.createDirectory(
                atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw KeybagError.io(path: root, reason: "cannot create the data root (\(error.localizedDescription))")
        }
        try makePrivate(root: root)
        let kdf = try kdf ?? PasscodeKDF.calibrated()
        if let tpm {
            return try await createSealedByTPM(
                root: root, passcode: passcode, kdf: kdf, graceMillis: graceMillis,
                eraseAfterTenFailures: eraseAfterTenFailures, minimumPasscodeLength: storedMinimum,
                tpm: tpm, clock: clock)
        }
        let secret = try DeviceSecret.create(in: root)
        let keys: [ProtectionClass: SymmetricKey] = [
            .complete: SymmetricKey(size: .bits256),
            .completeUntilFirstUserAuthentication: SymmetricKey(size: .bits256),
            .noProtection: SymmetricKey(size: .bits256),
        ]
        let bPrivate = Curve25519.KeyAgreement.PrivateKey()
        var file = KeybagFile(
            uuid: UUID(), passcodeSet: false, eraseAfterTenFailures: eraseAfterTenFailures, kdf: kdf,
            salt: randomBytes(16), failedAttempts: 0, lastFailureMillis: 0, lastFailedTag: zeros16,
            gracePeriodMillis: graceMillis, records: [])
        file.minimumPasscodeLength = storedMinimum
        let dKEK = secret.derive(labelClassD)
        var kek = secret.derive(labelNoPasscode)
        if let passcode {
            file.passcodeSet = true
            kek = try passcodeKEK(secret: secret, kdf: kdf, salt: file.salt, passcode: SecretBytes(utf8: passcode))
        }
        file.records = try makeRecords(
            keys: keys, bPrivate: bPrivate, kek: kek, passcodeSet: file.passcodeSet, dKEK: dKEK)
        do {
            try POSIXFile.writeAtomically(
                keybagPath, file.encoded(macKey: secret.derive(KeybagFile.macLabel)), permissions: [.ownerReadWrite])
        } catch {
            DeviceSecret.destroy(in: root)
            throw error
        }
        let keybag = EmbeddedKeybag(
            root: root, secret: secret, binding: nil, file: file, clock: clock, tpmTCTI: TPMBinding.defaultTCTI)
        await keybag.prepareSpare()
        await keybag.adoptUnlockedKeys(keys, bPrivate: bPrivate)
        return keybag
    }

    /// Opens the device of `root` as after a reboot: *before first unlock* when a passcode is
    /// set, unlocked (protection inactive) when none is.
    ///
    /// - Parameter tpmTCTI: How to reach the TPM when it seals the device secret.
    package static func open(
        root: String, clock: any KeybagClock = SystemClock(),
        tpmTCTI: String = TPMBinding.defaultTCTI
    ) async throws -> EmbeddedKeybag {
        let keybagPath = root + "/" + KeybagFile.fileName
        guard POSIXFile.kind(keybagPath).exists else { throw KeybagError.notInitialized(root: root) }
        let (secret, binding, file) = try loadSecretAndKeybag(root: root, tpmTCTI: tpmTCTI)
        let keybag = EmbeddedKeybag(
            root: root, secret: secret, binding: binding, file: file, clock: clock, tpmTCTI: tpmTCTI)
        try await keybag.boot()
        return keybag
    }

    init(
        root: String, secret: DeviceSecret, binding: TPMBindingRecord?, file: KeybagFile, clock: any KeybagClock,
        tpmTCTI: String
    ) {
        self.root = root
        self.id = file.uuid
        self.secret = secret
        self.binding = binding
        self.file = file
        self.clock = clock
        self.tpmTCTI = tpmTCTI
        // A keybag that passed its MAC always holds a valid 32-byte public key.
        self.classBPublicKey =
            (try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: file.record(.completeUnlessOpen).publicKey))
            ?? Curve25519.KeyAgreement.PrivateKey().publicKey
    }

    func boot() throws {
        if binding != nil {
            try withKeybagLock { try reconcileAttemptCounter(now: clock.now()) }
        }
        classKeys[.noProtection] = try Self.unwrapSymmetric(
            file.record(.noProtection), kek: secret.derive(Self.labelClassD))
        Self.pinInMemory(classKeys[.noProtection]!)
        if !file.passcodeSet {
            let (keys, bPrivate) = try Self.unwrapPasscodeClasses(file, kek: secret.derive(Self.labelNoPasscode))
            adoptUnlockedKeys(keys, bPrivate: bPrivate)
        }
    }

    func adoptUnlockedKeys(_ keys: [ProtectionClass: SymmetricKey], bPrivate: Curve25519.KeyAgreement.PrivateKey) {
        for key in keys.values { Self.pinInMemory(key) }
        classKeys.merge(keys) { $1 }
        classBPrivateKey = bPrivate
        state = .unlocked
    }

    // MARK: - State

    /// The lock state.
    package var lockState: LockState {
        expireGraceIfDue()
        return state
    }

    /// Whether class-A data is available now, like `UIApplication.isProtectedDataAvailable`.
    /// Always `true` while no passcode is set.
    package var isProtectedDataAvailable: Bool {
        expireGraceIfDue()
        return classKeys[.complete] != nil
    }

    /// Whether existing files of `protectionClass` can be opened now.
    package func isAvailable(_ protectionClass: ProtectionClass) -> Bool {
        expireGraceIfDue()
        if protectionClass == .completeUnlessOpen { return classBPrivateKey != nil }
        return classKeys[protectionClass] != nil
    }

    /// Whether new files of `protectionClass` can be created now (class B: always).
    package func canCreate(_ protectionClass: ProtectionClass) -> Bool {
        protectionClass == .completeUnlessOpen ? !isErased : isAvailable(protectionClass)
    }

    /// A snapshot of the device's state: lock state, passcode policy, available classes.
    package var status: KeybagStatus {
        expireGraceIfDue()
        let now = clock.now()
        var lockout: TPMLockoutState?
        var problem: String?
        if binding != nil {
            do { lockout = try tpmDevice.lockoutState() } catch { problem = "\(error)" }
        }
        return KeybagStatus(
            root: root, keybagID: id, lockState: state, passcodeSet: file.passcodeSet,
            failedAttempts: Int(file.failedAttempts), delayRemaining: delayRemaining(now: now),
            gracePeriod: TimeInterval(file.gracePeriodMillis) / 1000,
            graceRemaining: graceDeadline.map { max(0, $0.timeIntervalSince(now)) },
            eraseAfterTenFailures: file.eraseAfterTenFailures, kdf: file.kdf,
            available: ProtectionClass.allCases.filter { isAvailable($0) },
            deviceSecret: binding.map { .tpm(pcrs: $0.pcrs) } ?? .file,
            tpmLockout: lockout,
            tpmProblem: problem,
            lastRollback: file.lastRollbackMillis == 0
                ? nil : Date(timeIntervalSince1970: TimeInterval(file.lastRollbackMillis) / 1000),
            minimumPasscodeLength: minimumPasscodeLength)
    }

    /// Seconds between a lock and the discarding of class-A keys.
    package var gracePeriod: TimeInterval { TimeInterval(file.gracePeriodMillis) / 1000 }

    /// Changes the grace period (needs the device unlocked when a passcode is set).
    package func setGracePeriod(_ seconds: TimeInterval) throws {
        let millis = try PasscodePolicy.gracePeriodMillis(seconds)
        try requireUnlocked()
        try withKeybagLock {
            var updated = file
            updated.gracePeriodMillis = millis
            try persist(updated)
        }
    }

    /// The shortest new passcode this device accepts, in characters.
    package var minimumPasscodeLength: Int {
        file.minimumPasscodeLength == 0 ? PasscodePolicy.defaultMinimumLength : Int(file.minimumPasscodeLength)
    }

    /// Changes the passcode policy's minimum length (needs the device unlocked). The current
    /// passcode is not checked against it; the next set or change is.
    package func setMinimumPasscodeLength(_ length: Int) throws {
        let length = try PasscodePolicy.validMinimumLength(length)
        try requireUnlocked()
        try withKeybagLock {
            var updated = file
            updated.minimumPasscodeLength = UInt8(length == PasscodePolicy.defaultMinimumLength ? 0 : length)
            try persist(updated)
        }
    }

    /// Turns "erase after 10 failed passcodes" on or off (needs the device unlocked).
    package func setEraseAfterTenFailures(_ on: Bool) throws {
        try requireUnlocked()
        try withKeybagLock {
            var updated = file
            updated.eraseAfterTenFailures = on
            try persist(updated)
        }
    }

    // MARK: - Helpers

    func requireNotErased() throws {
        if isErased { throw KeybagError.erased }
    }

    func requireUnlocked() throws {
        try requireNotErased()
        expireGraceIfDue()
        if file.passcodeSet, state != .unlocked { throw KeybagError.deviceLocked(state) }
    }

    func requireAvailable(_ cls: ProtectionClass) throws {
        try requireNotErased()
        guard isAvailable(cls) else { throw KeybagError.classUnavailable(cls, state) }
    }

    /// Writes `updated` as the keybag, one generation after the newest this process has seen.
    ///
    /// On a full disk (or quota, or file size limit) it goes through the spare (``persistThroughSpare(_:)``):
    /// a failed attempt is still counted, and the right passcode still unlocks.
    func persist(_ updated: KeybagFile) throws {
        var updated = updated
        updated.generation = max(updated.generation, file.generation) + 1
        let bytes = try updated.encoded(macKey: secret.derive(KeybagFile.macLabel))
        do {
            try POSIXFile.writeAtomically(root + "/" + KeybagFile.fileName, bytes, permissions: [.ownerReadWrite])
            prepareSpare()
        } catch let error as FileSystemError where [.noSpace, .diskQuotaExceeded, .fileTooLarge].contains(error.errno) {
            guard (try? persistThroughSpare(bytes)) == true else { throw error }
            logger.info("the disk is full: the keybag was written through its spare (\(error))")
        }
        file = updated
    }

    /// `ROOT/keybag.spare`: a keybag-sized file of random bytes whose blocks are already allocated,
    /// made while there is room (best effort).
    func prepareSpare() {
        let path = layout.keybagSpare
        if let st = POSIXFile.linkStatus(path), st.st_mode & S_IFMT == S_IFREG, st.st_size == KeybagFile.totalSize {
            return
        }
        try? POSIXFile.writeAtomically(path, Self.randomBytes(KeybagFile.totalSize), permissions: [.ownerReadWrite])
    }

    /// Writes `bytes` into the spare in place (its blocks exist), flushes it, and swaps the two
    /// names atomically (`renameat2(RENAME_EXCHANGE)`): the keybag is new, whole, and the old one
    /// becomes the spare, overwritten with random bytes. No new block is needed. `false` when
    /// there is no usable spare.
    func persistThroughSpare(_ bytes: [UInt8]) throws -> Bool {
        let spare = layout.keybagSpare, keybag = layout.keybag
        guard let st = POSIXFile.linkStatus(spare), st.st_mode & S_IFMT == S_IFREG, st.st_size == bytes.count else {
            return false
        }
        let fd = try POSIXFile.open(spare, .writeOnly, options: [.noFollow])
        defer { try? fd.close() }
        try POSIXFile.write(fd, bytes, at: 0, path: spare)
        try POSIXFile.sync(fd, path: spare)
        do throws(Errno) { try SystemCall.renameat2(AT_FDCWD, spare, AT_FDCWD, keybag, flags: RENAME_EXCHANGE) } catch {
            throw FileSystemError("renameat2", path: keybag, errno: error)
        }
        try? POSIXFile.syncDirectory(root)
        // The previous keybag, now the spare: its wrapped keys do not stay behind.
        if let old = try? POSIXFile.open(spare, .writeOnly, options: [.noFollow]) {
            try? POSIXFile.write(old, Self.randomBytes(bytes.count), at: 0, path: spare)
            try? POSIXFile.sync(old, path: spare)
            try? old.close()
        }
        return true
    }

    static func passcodeKEK(
        secret: DeviceSecret, kdf: PasscodeKDF, salt: [UInt8], passcode: SecretBytes
    ) throws -> SymmetricKey {
        let stretched = try kdf.derive(passcode: passcode, salt: salt)
        return stretched.withUnsafeBytes { secret.derive(labelPasscode, salt: $0) }
    }

    static func makeRecords(
        keys: [ProtectionClass: SymmetricKey], bPrivate: Curve25519.KeyAgreement.PrivateKey,
        kek: SymmetricKey, passcodeSet: Bool, dKEK: SymmetricKey
    ) throws -> [ClassKeyRecord] {
        let wrapType: ClassKeyRecord.WrapType = passcodeSet ? .passcodeAndDeviceSecret : .deviceSecret
        let noPublicKey = [UInt8](repeating: 0, count: 32)
        func record(
            _ cls: ProtectionClass, _ key: SymmetricKey, _ kek: SymmetricKey, _ type: ClassKeyRecord.WrapType,
            _ pub: [UInt8]
        ) throws -> ClassKeyRecord {
            ClassKeyRecord(
                protectionClass: cls, wrapType: type, wrappedKey: Array(try AES.KeyWrap.wrap(key, using: kek)),
                publicKey: pub)
        }
        guard let a = keys[.complete], let c = keys[.completeUntilFirstUserAuthentication], let d = keys[.noProtection]
        else {
            throw KeybagError.deviceLocked(.locked)
        }
        return [
            try record(.complete, a, kek, wrapType, noPublicKey),
            try record(
                .completeUnlessOpen, SymmetricKey(data: bPrivate.rawRepresentation), kek, wrapType,
                Array(bPrivate.publicKey.rawRepresentation)),
            try record(.completeUntilFirstUserAuthentication, c, kek, wrapType, noPublicKey),
            try record(.noProtection, d, dKEK, .deviceSecret, noPublicKey),
        ]
    }

    static func unwrapSymmetric(_ record: ClassKeyRecord, kek: SymmetricKey) throws -> SymmetricKey {
        try AES.KeyWrap.unwrap(record.wrappedKey, using: kek)
    }

    static func unwrapPasscodeClasses(
        _ file: KeybagFile, kek: SymmetricKey
    ) throws
        -> ([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey)
    {
        let a = try unwrapSymmetric(file.record(.complete), kek: kek)
        let c = try unwrapSymmetric(file.record(.completeUntilFirstUserAuthentication), kek: kek)
        let bRaw = try unwrapSymmetric(file.record(.completeUnlessOpen), kek: kek)
        let bPrivate = try bRaw.withUnsafeBytes { try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: $0) }
        guard Array(bPrivate.publicKey.rawRepresentation) == file.record(.completeUnlessOpen).publicKey else {
            throw KeybagError.corruptKeybag("class B key pair does not match")
        }
        return ([.complete: a, .completeUntilFirstUserAuthentication: c], bPrivate)
    }

    /// Locks the page(s) holding a class key in RAM (`mlock`), so it is never written to swap.
    /// Best effort: a process over its `RLIMIT_MEMLOCK` keeps working. swift-crypto zeroes the
    /// key's storage when the key is dropped.
    static func pinInMemory(_ key: SymmetricKey) {
        key.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress { _ = mlock(base, bytes.count) }
        }
    }

    static func randomBytes(_ n: Int) -> [UInt8] {
        SymmetricKey(size: SymmetricKeySize(bitCount: n * 8)).withUnsafeBytes { Array($0) }
    }

    static let zeros16 = [UInt8](repeating: 0, count: 16)
}
