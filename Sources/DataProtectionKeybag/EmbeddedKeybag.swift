import Crypto
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

    private let secret: DeviceSecret
    private var file: KeybagFile
    private var state: LockState = .beforeFirstUnlock
    private var classKeys: [ProtectionClass: SymmetricKey] = [:]
    private var classBPrivateKey: Curve25519.KeyAgreement.PrivateKey?
    private let classBPublicKey: Curve25519.KeyAgreement.PublicKey
    private var graceDeadline: Date?
    private var graceTimer: Task<Void, Never>?
    private var generations: [ProtectionClass: Int] = [:]
    private var streams: [UUID: AsyncStream<ProtectedDataEvent>.Continuation] = [:]
    private var observers: [UUID: @Sendable (ProtectedDataEvent) -> Void] = [:]
    private var discardObservers: [UUID: @Sendable (ProtectionClass) -> Void] = [:]
    private var isErased = false
    private let logger = Logger(label: "dataprotection.keybag")

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
    package static func create(root: String, passcode: String?, kdf: PasscodeKDF? = nil,
                              gracePeriod: TimeInterval = 10, eraseAfterTenFailures: Bool = false,
                              clock: any KeybagClock = SystemClock()) async throws -> EmbeddedKeybag {
        if let passcode, passcode.isEmpty { throw KeybagError.emptyPasscode }
        let graceMillis = try PasscodePolicy.gracePeriodMillis(gracePeriod)
        let keybagPath = root + "/" + KeybagFile.fileName
        if POSIXFile.kind(keybagPath).exists || POSIXFile.kind(root + "/" + DeviceSecret.fileName).exists {
            throw KeybagError.alreadyInitialized(root: root)
        }
        do {
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw KeybagError.io(path: root, reason: "cannot create the data root (\(error.localizedDescription))")
        }
        let kdf = try kdf ?? PasscodeKDF.calibrated()
        let secret = try DeviceSecret.create(in: root)
        let keys: [ProtectionClass: SymmetricKey] = [
            .complete: SymmetricKey(size: .bits256),
            .completeUntilFirstUserAuthentication: SymmetricKey(size: .bits256),
            .noProtection: SymmetricKey(size: .bits256),
        ]
        let bPrivate = Curve25519.KeyAgreement.PrivateKey()
        var file = KeybagFile(uuid: UUID(), passcodeSet: false, eraseAfterTenFailures: eraseAfterTenFailures, kdf: kdf,
                              salt: randomBytes(16), failedAttempts: 0, lastFailureMillis: 0, lastFailedTag: zeros16,
                              gracePeriodMillis: graceMillis, records: [])
        let dKEK = secret.derive(labelClassD)
        var kek = secret.derive(labelNoPasscode)
        if let passcode {
            file.passcodeSet = true
            kek = try passcodeKEK(secret: secret, kdf: kdf, salt: file.salt, passcode: SecretBytes(utf8: passcode))
        }
        file.records = try makeRecords(keys: keys, bPrivate: bPrivate, kek: kek, passcodeSet: file.passcodeSet, dKEK: dKEK)
        do {
            try POSIXFile.writeAtomically(keybagPath, file.encoded(macKey: secret.derive(KeybagFile.macLabel)), permissions: [.ownerReadWrite])
        } catch {
            DeviceSecret.destroy(in: root)
            throw error
        }
        let keybag = EmbeddedKeybag(root: root, secret: secret, file: file, clock: clock)
        await keybag.adoptUnlockedKeys(keys, bPrivate: bPrivate)
        return keybag
    }

    /// Opens the device of `root` as after a reboot: *before first unlock* when a passcode is
    /// set, unlocked (protection inactive) when none is.
    package static func open(root: String, clock: any KeybagClock = SystemClock()) async throws -> EmbeddedKeybag {
        let keybagPath = root + "/" + KeybagFile.fileName
        guard POSIXFile.kind(keybagPath).exists else { throw KeybagError.notInitialized(root: root) }
        let secret = try DeviceSecret.load(from: root)
        let file = try KeybagFile.decode(try POSIXFile.readAll(keybagPath), macKey: secret.derive(KeybagFile.macLabel))
        let keybag = EmbeddedKeybag(root: root, secret: secret, file: file, clock: clock)
        try await keybag.boot()
        return keybag
    }

    private init(root: String, secret: DeviceSecret, file: KeybagFile, clock: any KeybagClock) {
        self.root = root
        self.id = file.uuid
        self.secret = secret
        self.file = file
        self.clock = clock
        // A keybag that passed its MAC always holds a valid 32-byte public key.
        self.classBPublicKey = (try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: file.record(.completeUnlessOpen).publicKey))
            ?? Curve25519.KeyAgreement.PrivateKey().publicKey
    }

    private func boot() throws {
        classKeys[.noProtection] = try Self.unwrapSymmetric(file.record(.noProtection), kek: secret.derive(Self.labelClassD))
        Self.pinInMemory(classKeys[.noProtection]!)
        if !file.passcodeSet {
            let (keys, bPrivate) = try Self.unwrapPasscodeClasses(file, kek: secret.derive(Self.labelNoPasscode))
            adoptUnlockedKeys(keys, bPrivate: bPrivate)
        }
    }

    private func adoptUnlockedKeys(_ keys: [ProtectionClass: SymmetricKey], bPrivate: Curve25519.KeyAgreement.PrivateKey) {
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
        return KeybagStatus(
            root: root, keybagID: id, lockState: state, passcodeSet: file.passcodeSet,
            failedAttempts: Int(file.failedAttempts), delayRemaining: delayRemaining(now: now),
            gracePeriod: TimeInterval(file.gracePeriodMillis) / 1000,
            graceRemaining: graceDeadline.map { max(0, $0.timeIntervalSince(now)) },
            eraseAfterTenFailures: file.eraseAfterTenFailures, kdf: file.kdf,
            available: ProtectionClass.allCases.filter { isAvailable($0) })
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

    /// Turns "erase after 10 failed passcodes" on or off (needs the device unlocked).
    package func setEraseAfterTenFailures(_ on: Bool) throws {
        try requireUnlocked()
        try withKeybagLock {
            var updated = file
            updated.eraseAfterTenFailures = on
            try persist(updated)
        }
    }

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

    private func cancelGrace() {
        graceTimer?.cancel()
        graceTimer = nil
        graceDeadline = nil
    }

    /// Discards class-A keys and the class-B private key once the grace deadline has passed.
    /// Called on every query, so availability never depends on a timer having fired.
    private func expireGraceIfDue() {
        guard state == .locked, let deadline = graceDeadline, clock.now() >= deadline else { return }
        cancelGrace()
        discard(.complete)
        discard(.completeUnlessOpen)
        logger.info("grace period over: class A keys discarded")
    }

    private func discard(_ cls: ProtectionClass) {
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

    // MARK: - Passcode management

    /// Sets a passcode on a device that has none: A, B and C keys are rewrapped under it.
    package func setPasscode(_ newPasscode: String) throws { try setPasscode(SecretBytes(utf8: newPasscode)) }

    package func setPasscode(_ newPasscode: SecretBytes) throws {
        guard !file.passcodeSet else { throw KeybagError.passcodeAlreadySet }
        try requireNotErased()
        try rewrapClassKeys(newPasscode: newPasscode)
    }

    /// Changes the passcode. Only the class keys are rewrapped; no file is rewritten.
    /// A wrong `old` passcode counts as a failed attempt.
    package func changePasscode(from old: String, to new: String) throws {
        try changePasscode(from: SecretBytes(utf8: old), to: SecretBytes(utf8: new))
    }

    package func changePasscode(from old: SecretBytes, to new: SecretBytes) throws {
        guard file.passcodeSet else { throw KeybagError.noPasscodeSet }
        if new.isEmpty { throw KeybagError.emptyPasscode }
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

    private func rewrapClassKeys(newPasscode: SecretBytes?) throws {
        if let newPasscode, newPasscode.isEmpty { throw KeybagError.emptyPasscode }
        guard let bPrivate = classBPrivateKey, classKeys[.complete] != nil, classKeys[.completeUntilFirstUserAuthentication] != nil else {
            throw KeybagError.deviceLocked(state)
        }
        try withKeybagLock {
            var updated = file
            updated.salt = Self.randomBytes(16)
            updated.passcodeSet = newPasscode != nil
            updated.failedAttempts = 0
            updated.lastFailureMillis = 0
            updated.lastFailedTag = Self.zeros16
            let kek = try newPasscode.map { try Self.passcodeKEK(secret: secret, kdf: file.kdf, salt: updated.salt, passcode: $0) }
                ?? secret.derive(Self.labelNoPasscode)
            updated.records = try Self.makeRecords(keys: classKeys, bPrivate: bPrivate, kek: kek,
                                                   passcodeSet: updated.passcodeSet, dKEK: secret.derive(Self.labelClassD))
            try persist(updated)
        }
        state = .unlocked
    }

    /// Checks a passcode with the failure counter and delays; returns the unwrapped keys.
    ///
    /// Runs under the keybag lock with the keybag reloaded from disk, so attempts from several
    /// processes are serialized and all count against one counter.
    private func verifyPasscode(_ passcode: SecretBytes) throws -> ([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey) {
        try requireNotErased()
        let outcome: Result<([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey), KeybagError> = try withKeybagLock {
            let now = clock.now()
            if let remaining = delayRemaining(now: now) {
                return .failure(.passcodeDelayed(retryAfter: remaining, failedAttempts: Int(file.failedAttempts)))
            }
            let stretched = try file.kdf.derive(passcode: passcode, salt: file.salt)
            let tag = stretched.withUnsafeBytes { Array(HMAC<SHA256>.authenticationCode(for: $0, using: secret.derive(Self.labelFailedTag)).prefix(16)) }
            if file.failedAttempts > 0, tag == file.lastFailedTag {
                // The same wrong passcode again: rejected, but not counted (as on iOS).
                return .failure(.wrongPasscode(failedAttempts: Int(file.failedAttempts)))
            }
            // Count the attempt on disk *before* checking it.
            var counted = file
            counted.failedAttempts = counted.failedAttempts == .max ? .max : counted.failedAttempts + 1   // saturate
            counted.lastFailureMillis = Int64((now.timeIntervalSince1970 * 1000).rounded())
            try persist(counted)

            let kek = stretched.withUnsafeBytes { secret.derive(Self.labelPasscode, salt: $0) }
            if let unwrapped = try? Self.unwrapPasscodeClasses(file, kek: kek) {
                var reset = file
                reset.failedAttempts = 0
                reset.lastFailureMillis = 0
                reset.lastFailedTag = Self.zeros16
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
            if file.eraseAfterTenFailures, failures >= PasscodePolicy.eraseThreshold {
                try erase()
                throw KeybagError.erased
            }
        }
        return try outcome.get()
    }

    /// Runs `body` holding an exclusive `flock` on `ROOT/keybag.lock`, with the keybag freshly
    /// reloaded from disk: read-modify-write of the keybag is serialized across processes.
    private func withKeybagLock<T>(_ body: () throws -> T) throws -> T {
        let lockPath = layout.keybagLock
        let fd = try POSIXFile.open(lockPath, .readWrite, options: [.create], permissions: [.ownerReadWrite])
        defer { try? fd.close() }   // closing the descriptor releases the lock
        try POSIXFile.check("flock", lockPath) { flock(fd.rawValue, LOCK_EX) }
        let path = root + "/" + KeybagFile.fileName
        let current = POSIXFile.kind(path).exists
            ? try KeybagFile.decode(try POSIXFile.readAll(path), macKey: secret.derive(KeybagFile.macLabel)) : nil
        guard let current, current.uuid == id else {
            // Another process erased the device (or set up a new one in its place).
            isErased = true
            for cls in ProtectionClass.allCases { discard(cls) }
            throw KeybagError.erased
        }
        file = current
        return try body()
    }

    /// Where the root's files are.
    package nonisolated var layout: DataRootLayout { DataRootLayout(root: root) }

    private func delayRemaining(now: Date) -> TimeInterval? {
        let delay = PasscodePolicy.delay(afterFailures: Int(file.failedAttempts))
        guard delay > 0 else { return nil }
        let last = Date(timeIntervalSince1970: TimeInterval(file.lastFailureMillis) / 1000)
        // A clock set back before the last failure must not shorten or lengthen the delay beyond one period.
        let elapsed = min(max(now.timeIntervalSince(last), 0), delay)
        let remaining = delay - elapsed
        return remaining > 0 ? remaining : nil
    }

    // MARK: - Erase

    /// Crypto-erases the device: the device secret and the keybag are overwritten and removed,
    /// every key in memory is dropped. Every protected file of this root becomes unrecoverable.
    package func erase() throws {
        DeviceSecret.destroy(in: root)
        let keybagPath = root + "/" + KeybagFile.fileName
        if let fd = try? POSIXFile.open(keybagPath, .writeOnly) {
            try? POSIXFile.write(fd, Self.randomBytes(KeybagFile.totalSize), at: 0, path: keybagPath)
            try? POSIXFile.sync(fd, path: keybagPath)
            try? fd.close()
        }
        unlink(keybagPath)
        unlink(layout.keybagLock)
        unlink(layout.backupKeybag)
        // What other layers keep in the root (the backup layer's index of backed-up names …).
        layout.removeRegisteredEntries()
        try? POSIXFile.syncDirectory(root)
        cancelGrace()
        for cls in ProtectionClass.allCases { discard(cls) }
        isErased = true
        state = .beforeFirstUnlock
        logger.warning("device erased")
        emit(.willBecomeUnavailable)
    }

    // MARK: - File keys

    /// The current key generation of `protectionClass`, or an error when it is unavailable.
    /// The generation grows each time the class key is discarded, so a handle that cached a
    /// file key under an older generation knows it must not use it any more.
    package func generation(of protectionClass: ProtectionClass) throws -> Int {
        try requireAvailable(protectionClass)
        return generations[protectionClass, default: 0]
    }

    /// Creates a random 256-bit file key and wraps it under `protectionClass`.
    /// Class B needs only the class public key, so it works while locked.
    package func wrapNewFileKey(for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false) throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        let key = SymmetricKey(size: .bits256)
        return (key, try wrap(key, for: protectionClass, thisDeviceOnly: thisDeviceOnly))
    }

    private var deviceBinding: DeviceBinding {
        DeviceBinding(salt: secret.derive(DeviceBinding.saltLabel).withUnsafeBytes { Array($0) })
    }

    /// Unwraps a file key; throws ``KeybagError/classUnavailable(_:_:)`` when its class is
    /// unavailable now, ``KeybagError/foreignKeybag(expected:found:)`` or
    /// ``KeybagError/keyUnwrapFailed(_:)`` when it is not this keybag's.
    package func unwrapFileKey(_ wrapped: WrappedFileKey) throws -> SymmetricKey {
        guard wrapped.keybagID == id else { throw KeybagError.foreignKeybag(expected: id, found: wrapped.keybagID) }
        try requireAvailable(wrapped.protectionClass)
        do {
            if wrapped.protectionClass == .completeUnlessOpen {
                guard let ephemeralBytes = wrapped.ephemeralPublicKey, let bPrivate = classBPrivateKey else {
                    throw KeybagError.keyUnwrapFailed(.completeUnlessOpen)
                }
                return try ClassBKeyAgreement.unwrap(wrapped.wrappedKey, ephemeralPublic: ephemeralBytes, classPrivate: bPrivate,
                                                     binding: wrapped.thisDeviceOnly ? deviceBinding : nil)
            }
            guard let classKey = classKeys[wrapped.protectionClass] else { throw KeybagError.keyUnwrapFailed(wrapped.protectionClass) }
            return try AES.KeyWrap.unwrap(wrapped.wrappedKey, using: wrapped.thisDeviceOnly ? deviceBinding.bind(classKey) : classKey)
        } catch let error as KeybagError {
            throw error
        } catch {
            throw KeybagError.keyUnwrapFailed(wrapped.protectionClass)
        }
    }

    /// ``unwrapFileKey(_:)`` and the generation of the key's class in one call (one round trip
    /// through keybagd when a handle opens).
    package func unwrapFileKeyWithGeneration(_ wrapped: WrappedFileKey) throws -> (key: SymmetricKey, generation: Int) {
        let key = try unwrapFileKey(wrapped)
        return (key, generations[wrapped.protectionClass, default: 0])
    }

    /// Rewraps a file key under another class (its content is not touched). Needs the old
    /// class available and the new one creatable.
    package func rewrapFileKey(_ wrapped: WrappedFileKey, to protectionClass: ProtectionClass) throws -> WrappedFileKey {
        try wrap(try unwrapFileKey(wrapped), for: protectionClass, thisDeviceOnly: wrapped.thisDeviceOnly)
    }

    /// Wraps an existing file key under `protectionClass` (and this device's secret when
    /// `thisDeviceOnly`).
    package func wrap(_ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false) throws -> WrappedFileKey {
        try requireNotErased()
        let binding = thisDeviceOnly ? deviceBinding : nil
        if protectionClass == .completeUnlessOpen {
            let (wrapped, ephemeralPublic) = try ClassBKeyAgreement.wrap(key, to: classBPublicKey, binding: binding)
            return WrappedFileKey(protectionClass: .completeUnlessOpen, keybagID: id, wrappedKey: wrapped, ephemeralPublicKey: ephemeralPublic,
                                  thisDeviceOnly: thisDeviceOnly)
        }
        try requireAvailable(protectionClass)
        guard let classKey = classKeys[protectionClass] else { throw KeybagError.classUnavailable(protectionClass, state) }
        let kek = binding?.bind(classKey) ?? classKey
        return WrappedFileKey(protectionClass: protectionClass, keybagID: id,
                              wrappedKey: Array(try AES.KeyWrap.wrap(key, using: kek)), ephemeralPublicKey: nil, thisDeviceOnly: thisDeviceOnly)
    }

    // MARK: - Backup keybag

    /// Where ``setBackupPassword(_:)`` keeps the backup keybag, so backups taken while the
    /// device is locked can carry it without any class key being unwrapped.
    package nonisolated var backupKeybagURL: URL { URL(fileURLWithPath: layout.backupKeybag) }

    /// Wraps every class key under a backup password into `ROOT/backup-keybag` (replacing any
    /// earlier one). Needs the device unlocked: the A and B keys must be in memory.
    package func setBackupPassword(_ password: String) throws { try setBackupPassword(SecretBytes(utf8: password)) }

    package func setBackupPassword(_ password: SecretBytes) throws {
        if password.isEmpty { throw KeybagError.emptyPasscode }
        try requireUnlocked()
        guard let bPrivate = classBPrivateKey, classKeys[.complete] != nil else { throw KeybagError.deviceLocked(state) }
        let kdf = PasscodeKDF(logN: max(file.kdf.logN, 15), r: file.kdf.r, p: file.kdf.p)
        let backup = try BackupKeybag(sourceKeybagID: id, classKeys: classKeys, classBPrivate: bPrivate, password: password, kdf: kdf)
        try POSIXFile.writeAtomically(backupKeybagURL.path, backup.encoded, permissions: [.ownerReadWrite])
    }

    /// The key this device authenticates its backups with (``BackupAuthenticationKey``).
    /// Class D is always available, so this works in every lock state.
    package func backupAuthenticationKey() throws -> SymmetricKey {
        try requireNotErased()
        guard let classD = classKeys[.noProtection] else { throw KeybagError.classUnavailable(.noProtection, state) }
        return BackupAuthenticationKey.derive(classD: classD, keybagID: id)
    }

    /// Rewraps a file key that another device wrapped (its class keys come from a backup
    /// keybag) under this device's key for the same class — or for `protectionClass`.
    package func adoptFileKey(_ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
                             as protectionClass: ProtectionClass? = nil) throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        let key = try backupKeys.unwrap(wrapped)
        return (key, try wrap(key, for: protectionClass ?? wrapped.protectionClass))
    }

    // MARK: - Events

    /// A stream of lock events for this subscriber; it ends when the subscriber stops iterating.
    ///
    /// ```swift
    /// for await event in await keybag.events() where event == .willBecomeUnavailable { saveDrafts() }
    /// ```
    package func events() -> AsyncStream<ProtectedDataEvent> {
        let (stream, continuation) = AsyncStream<ProtectedDataEvent>.makeStream(bufferingPolicy: .unbounded)
        let token = UUID()
        streams[token] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeStream(token) }
        }
        return stream
    }

    private func removeStream(_ token: UUID) { streams[token] = nil }

    /// Calls `callback` on every event, like an app delegate's
    /// `applicationProtectedDataWillBecomeUnavailable(_:)`. Returns a token for ``removeObserver(_:)``.
    @discardableResult
    package func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) -> UUID {
        let token = UUID()
        observers[token] = callback
        return token
    }

    /// Stops calling an observer.
    package func removeObserver(_ token: UUID) { observers[token] = nil }

    private func emit(_ event: ProtectedDataEvent) {
        for continuation in streams.values { continuation.yield(event) }
        for observer in observers.values { observer(event) }
    }

    // MARK: - Helpers

    private func requireNotErased() throws {
        if isErased { throw KeybagError.erased }
    }

    private func requireUnlocked() throws {
        try requireNotErased()
        expireGraceIfDue()
        if file.passcodeSet, state != .unlocked { throw KeybagError.deviceLocked(state) }
    }

    private func requireAvailable(_ cls: ProtectionClass) throws {
        try requireNotErased()
        guard isAvailable(cls) else { throw KeybagError.classUnavailable(cls, state) }
    }

    private func persist(_ updated: KeybagFile) throws {
        try POSIXFile.writeAtomically(root + "/" + KeybagFile.fileName, updated.encoded(macKey: secret.derive(KeybagFile.macLabel)),
                                      permissions: [.ownerReadWrite])
        file = updated
    }

    private static func passcodeKEK(secret: DeviceSecret, kdf: PasscodeKDF, salt: [UInt8], passcode: SecretBytes) throws -> SymmetricKey {
        let stretched = try kdf.derive(passcode: passcode, salt: salt)
        return stretched.withUnsafeBytes { secret.derive(labelPasscode, salt: $0) }
    }

    private static func makeRecords(keys: [ProtectionClass: SymmetricKey], bPrivate: Curve25519.KeyAgreement.PrivateKey,
                                    kek: SymmetricKey, passcodeSet: Bool, dKEK: SymmetricKey) throws -> [ClassKeyRecord] {
        let wrapType: ClassKeyRecord.WrapType = passcodeSet ? .passcodeAndDeviceSecret : .deviceSecret
        let noPublicKey = [UInt8](repeating: 0, count: 32)
        func record(_ cls: ProtectionClass, _ key: SymmetricKey, _ kek: SymmetricKey, _ type: ClassKeyRecord.WrapType, _ pub: [UInt8]) throws -> ClassKeyRecord {
            ClassKeyRecord(protectionClass: cls, wrapType: type, wrappedKey: Array(try AES.KeyWrap.wrap(key, using: kek)), publicKey: pub)
        }
        guard let a = keys[.complete], let c = keys[.completeUntilFirstUserAuthentication], let d = keys[.noProtection] else {
            throw KeybagError.deviceLocked(.locked)
        }
        return [
            try record(.complete, a, kek, wrapType, noPublicKey),
            try record(.completeUnlessOpen, SymmetricKey(data: bPrivate.rawRepresentation), kek, wrapType,
                       Array(bPrivate.publicKey.rawRepresentation)),
            try record(.completeUntilFirstUserAuthentication, c, kek, wrapType, noPublicKey),
            try record(.noProtection, d, dKEK, .deviceSecret, noPublicKey),
        ]
    }

    private static func unwrapSymmetric(_ record: ClassKeyRecord, kek: SymmetricKey) throws -> SymmetricKey {
        try AES.KeyWrap.unwrap(record.wrappedKey, using: kek)
    }

    private static func unwrapPasscodeClasses(_ file: KeybagFile, kek: SymmetricKey) throws
        -> ([ProtectionClass: SymmetricKey], Curve25519.KeyAgreement.PrivateKey) {
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
    private static func pinInMemory(_ key: SymmetricKey) {
        key.withUnsafeBytes { bytes in
            if let base = bytes.baseAddress { _ = mlock(base, bytes.count) }
        }
    }

    private static func randomBytes(_ n: Int) -> [UInt8] {
        SymmetricKey(size: SymmetricKeySize(bitCount: n * 8)).withUnsafeBytes { Array($0) }
    }

    private static let zeros16 = [UInt8](repeating: 0, count: 16)
}
