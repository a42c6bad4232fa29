import Crypto
import Foundation

/// The device: its keybag, its lock state and the class keys the lock state allows.
///
/// A `Keybag` plays the part of iOS's kernel and Secure Enclave for one data root. It starts
/// *before first unlock* — as a device does after every boot — unless no passcode is set,
/// in which case protection is inactive and everything is available at once.
///
/// ```swift
/// let keybag = try await Keybag.create(root: "/tmp/device", passcode: "1234")   // new device
/// let keybag = try await Keybag.open(root: "/tmp/device")                        // after a restart
/// try await keybag.unlock(passcode: "1234")
/// await keybag.lock()          // class A keys are discarded after the grace period (10 s)
/// for await event in await keybag.events() { … }   // .willBecomeUnavailable, .didBecomeAvailable
/// ```
///
/// The keys live in this process (the *embedded* keybag) unless a `keybagd` daemon serves the
/// root; then ``open(root:clock:)`` connects to it, every call below is answered by the daemon,
/// and one lock state governs every process. The API is the same either way. Class keys never
/// leave whichever holds them: file keys are wrapped and unwrapped there
/// (``wrapNewFileKey(for:thisDeviceOnly:)``, ``unwrapFileKey(_:)``, ``rewrapFileKey(_:to:)``).
public final class Keybag: Sendable {
    /// The data root this keybag belongs to.
    public let root: String
    /// The keybag's identity; every file key it wraps names it.
    public let id: UUID
    /// The clock grace periods and passcode delays are measured on.
    public let clock: any KeybagClock

    let embedded: EmbeddedKeybag

    /// The directory the backup layer keeps its incremental index in; erased with the device.
    public static let backupIndexDirectoryName = EmbeddedKeybag.backupIndexDirectoryName
    static let labelClassD = EmbeddedKeybag.labelClassD
    static let labelNoPasscode = EmbeddedKeybag.labelNoPasscode
    static let labelPasscode = EmbeddedKeybag.labelPasscode
    static let labelFailedTag = EmbeddedKeybag.labelFailedTag

    init(embedded: EmbeddedKeybag) {
        self.embedded = embedded
        self.root = embedded.root
        self.id = embedded.id
        self.clock = embedded.clock
    }

    // MARK: - Creating and opening

    /// Sets up a new device in `root`: a device secret, class keys and a keybag.
    ///
    /// - Parameters:
    ///   - passcode: The passcode, or `nil` for none (protection inactive, as on iOS).
    ///   - kdf: scrypt parameters; `nil` calibrates them so one attempt costs ≥ 80 ms here.
    ///   - gracePeriod: Seconds between a lock and the discarding of class-A keys.
    /// - Returns: The keybag, unlocked.
    public static func create(root: String, passcode: String?, kdf: PasscodeKDF? = nil,
                              gracePeriod: TimeInterval = 10, eraseAfterTenFailures: Bool = false,
                              clock: any KeybagClock = SystemClock()) async throws -> Keybag {
        Keybag(embedded: try await EmbeddedKeybag.create(root: root, passcode: passcode, kdf: kdf, gracePeriod: gracePeriod,
                                                         eraseAfterTenFailures: eraseAfterTenFailures, clock: clock))
    }

    /// Opens the device of `root` as after a reboot: *before first unlock* when a passcode is
    /// set, unlocked (protection inactive) when none is.
    public static func open(root: String, clock: any KeybagClock = SystemClock()) async throws -> Keybag {
        Keybag(embedded: try await EmbeddedKeybag.open(root: root, clock: clock))
    }

    // MARK: - State

    /// The lock state.
    public var lockState: LockState { get async { await embedded.lockState } }

    /// Whether class-A data is available now, like `UIApplication.isProtectedDataAvailable`.
    /// Always `true` while no passcode is set.
    public var isProtectedDataAvailable: Bool { get async { await embedded.isProtectedDataAvailable } }

    /// Whether existing files of `protectionClass` can be opened now.
    public func isAvailable(_ protectionClass: ProtectionClass) async -> Bool { await embedded.isAvailable(protectionClass) }

    /// Whether new files of `protectionClass` can be created now (class B: always).
    public func canCreate(_ protectionClass: ProtectionClass) async -> Bool { await embedded.canCreate(protectionClass) }

    /// A snapshot for `dpctl status`.
    public var status: KeybagStatus { get async { await embedded.status } }

    /// Seconds between a lock and the discarding of class-A keys.
    public var gracePeriod: TimeInterval { get async { await embedded.gracePeriod } }

    /// Changes the grace period (needs the device unlocked when a passcode is set).
    public func setGracePeriod(_ seconds: TimeInterval) async throws { try await embedded.setGracePeriod(seconds) }

    /// Turns "erase after 10 failed passcodes" on or off (needs the device unlocked).
    public func setEraseAfterTenFailures(_ on: Bool) async throws { try await embedded.setEraseAfterTenFailures(on) }

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
    public func unlock(passcode: String) async throws { try await embedded.unlock(passcode: passcode) }

    /// Locks the device. Observers hear ``ProtectedDataEvent/willBecomeUnavailable`` now; class-A
    /// keys and the class-B private key are discarded when the grace period ends. Class C stays.
    /// Without a passcode, locking protects nothing and changes nothing (as on iOS).
    public func lock() async { await embedded.lock() }

    // MARK: - Passcode management

    /// Sets a passcode on a device that has none: A, B and C keys are rewrapped under it.
    public func setPasscode(_ newPasscode: String) async throws { try await embedded.setPasscode(newPasscode) }

    /// Changes the passcode (the old one is checked like an unlock attempt); only the class keys
    /// are rewrapped, no file is touched.
    public func changePasscode(from old: String, to new: String) async throws { try await embedded.changePasscode(from: old, to: new) }

    /// Removes the passcode: protection becomes inactive.
    public func removePasscode(current: String) async throws { try await embedded.removePasscode(current: current) }

    /// Crypto-erases the device: the device secret and the keybag are overwritten and removed,
    /// every key in memory is dropped. Every protected file of this root becomes unrecoverable.
    public func erase() async throws { try await embedded.erase() }

    // MARK: - File keys

    /// The current key generation of `protectionClass`, or an error when it is unavailable.
    /// The generation grows each time the class key is discarded, so a handle that cached a
    /// file key under an older generation knows it must not use it any more.
    public func generation(of protectionClass: ProtectionClass) async throws -> Int { try await embedded.generation(of: protectionClass) }

    /// Creates a random 256-bit file key and wraps it under `protectionClass`.
    /// Class B needs only the class public key, so it works while locked.
    public func wrapNewFileKey(for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        try await embedded.wrapNewFileKey(for: protectionClass, thisDeviceOnly: thisDeviceOnly)
    }

    /// Unwraps a file key; throws ``KeybagError/classUnavailable(_:_:)`` when its class is
    /// unavailable now, ``KeybagError/foreignKeybag(expected:found:)`` or
    /// ``KeybagError/keyUnwrapFailed(_:)`` when it is not this keybag's.
    public func unwrapFileKey(_ wrapped: WrappedFileKey) async throws -> SymmetricKey { try await embedded.unwrapFileKey(wrapped) }

    /// Unwraps a file key and wraps it under another class (a class change: no re-encryption).
    public func rewrapFileKey(_ wrapped: WrappedFileKey, to protectionClass: ProtectionClass) async throws -> WrappedFileKey {
        try await embedded.rewrapFileKey(wrapped, to: protectionClass)
    }

    /// Wraps an existing key under `protectionClass`.
    public func wrap(_ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false) async throws -> WrappedFileKey {
        try await embedded.wrap(key, for: protectionClass, thisDeviceOnly: thisDeviceOnly)
    }

    // MARK: - Backup keybag

    /// Where ``setBackupPassword(_:)`` keeps the backup keybag.
    public var backupKeybagURL: URL { embedded.backupKeybagURL }

    /// Wraps every class key under a backup password into `ROOT/backup-keybag` (replacing any
    /// earlier one). Needs the device unlocked: the A and B keys must be in memory.
    public func setBackupPassword(_ password: String) async throws { try await embedded.setBackupPassword(password) }

    /// Takes over a file key wrapped by another device, given that device's class keys (from its
    /// backup keybag): returns it wrapped under this keybag, in the same class or `protectionClass`.
    public func adoptFileKey(_ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
                             as protectionClass: ProtectionClass? = nil) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        try await embedded.adoptFileKey(wrapped, from: backupKeys, as: protectionClass)
    }

    // MARK: - Events

    /// Lock-state events as an async sequence, like UIKit's notifications.
    ///
    /// ```swift
    /// for await event in await keybag.events() where event == .willBecomeUnavailable { saveDrafts() }
    /// ```
    public func events() async -> AsyncStream<ProtectedDataEvent> { await embedded.events() }

    /// Calls `callback` on every event, like an app delegate's
    /// `applicationProtectedDataWillBecomeUnavailable(_:)`. Returns a token for ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) async -> UUID {
        await embedded.addObserver(callback)
    }

    /// Stops calling an observer.
    public func removeObserver(_ token: UUID) async { await embedded.removeObserver(token) }

    /// Calls `callback` each time a class key is discarded (the end of a grace period, an erase),
    /// before the keybag goes on. Layers that cache keys derived from a class drop them here.
    @discardableResult
    package func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) async -> UUID {
        await embedded.addDiscardObserver(callback)
    }

    /// Stops calling a discard observer.
    package func removeDiscardObserver(_ token: UUID) async { await embedded.removeDiscardObserver(token) }
}
