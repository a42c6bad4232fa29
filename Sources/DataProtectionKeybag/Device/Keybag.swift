import Crypto
import Foundation
import Logging
import Synchronization

/// The device: its keybag, its lock state and the class keys the lock state allows.
///
/// A `Keybag` plays the part of iOS's kernel and Secure Enclave for one data root. It starts
/// *before first unlock* — as a device does after every boot — unless no passcode is set,
/// in which case protection is inactive and everything is available at once.
///
/// ```swift
/// let keybag = try await Keybag.create(root: "/tmp/device", passcode: "123456")   // new device
/// let keybag = try await Keybag.open(root: "/tmp/device")                        // after a restart
/// try await keybag.unlock(passcode: "123456")
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

    /// Where the keys are: in this process, or in the keybagd serving the root.
    let backend: any KeybagBackend

    /// Where the root's files are, and the entries other layers registered.
    public var layout: DataRootLayout { DataRootLayout(root: root) }
    static let labelClassD = EmbeddedKeybag.labelClassD
    static let labelNoPasscode = EmbeddedKeybag.labelNoPasscode
    static let labelPasscode = EmbeddedKeybag.labelPasscode
    static let labelFailedTag = EmbeddedKeybag.labelFailedTag

    init(embedded: EmbeddedKeybag) {
        self.backend = embedded
        self.root = embedded.root
        self.id = embedded.id
        self.clock = embedded.clock
    }

    init(daemon: KeybagdConnection, root: String, id: UUID) {
        self.backend = KeybagdClient(connection: daemon)
        self.root = root
        self.id = id
        self.clock = SystemClock()
    }

    /// The socket of the keybagd whose keys this keybag uses, or `nil` for the embedded keybag.
    public var daemonSocket: String? {
        (backend as? KeybagdClient)?.connection.socketPath
    }

    // MARK: - Creating and opening

    /// Sets up a new device in `root`: a device secret, class keys and a keybag.
    ///
    /// - Parameters:
    ///   - passcode: The passcode, or `nil` for none (protection inactive, as on iOS).
    ///   - kdf: scrypt parameters; `nil` calibrates them so one attempt costs ≥ 80 ms here.
    ///   - gracePeriod: Seconds between a lock and the discarding of class-A keys.
    ///   - minimumPasscodeLength: The passcode policy: the shortest passcode accepted now and at
    ///     every later set or change, in characters (``PasscodePolicy``; 6 unless said, 4 at least).
    ///   - tpm: Seal the device secret by this TPM instead of storing it in `device.secret`
    ///     (``TPMBinding``): passcodes are then checked, and failures counted, by the TPM.
    /// - Returns: The keybag, unlocked.
    /// - Throws: ``KeybagError/daemon(_:)`` while a keybagd serves `root`,
    ///   ``KeybagError/passcodeTooShort(minimumLength:)`` for a passcode the policy refuses.
    public static func create(
        root: String, passcode: String?, kdf: PasscodeKDF? = nil,
        gracePeriod: TimeInterval = 10, eraseAfterTenFailures: Bool = false,
        minimumPasscodeLength: Int = PasscodePolicy.defaultMinimumLength,
        tpm: TPMBinding? = nil, clock: any KeybagClock = SystemClock()
    ) async throws -> Keybag {
        // A daemon serving the root keeps its keybag in memory: a new one made under it would be
        // one it never sees (every process would go on getting the old, perhaps erased, one).
        if try KeybagdConnection.connect(root: root) != nil {
            throw KeybagError.daemon(
                "keybagd serves \(root): stop it before setting up a device there, and start it again afterwards")
        }
        return Keybag(
            embedded: try await EmbeddedKeybag.create(
                root: root, passcode: passcode, kdf: kdf, gracePeriod: gracePeriod,
                eraseAfterTenFailures: eraseAfterTenFailures,
                minimumPasscodeLength: minimumPasscodeLength, tpm: tpm, clock: clock))
    }

    /// Opens the device of `root` as after a reboot: *before first unlock* when a passcode is
    /// set, unlocked (protection inactive) when none is.
    ///
    /// When a `keybagd` serves `root`, the keybag is the daemon's: its lock state, shared by every
    /// process (`clock` is then the daemon's business).
    ///
    /// A device whose secret the TPM seals is reached through `tpmTCTI` (by default
    /// `$DATAPROTECTION_TPM_TCTI`, else `device:/dev/tpmrm0`).
    public static func open(
        root: String, clock: any KeybagClock = SystemClock(),
        tpmTCTI: String = TPMBinding.defaultTCTI
    ) async throws -> Keybag {
        if let client = try KeybagdConnection.connect(root: root) {
            return Keybag(daemon: client, root: root, id: try client.send(KeybagRequests.Hello()).id)
        }
        return Keybag(embedded: try await EmbeddedKeybag.open(root: root, clock: clock, tpmTCTI: tpmTCTI))
    }

    /// The keybag of the daemon listening on `socketPath` (tools and tests that know the socket).
    package static func open(root: String, daemonSocket socketPath: String) throws -> Keybag {
        guard let client = try KeybagdConnection.connect(root: root, socketPath: socketPath) else {
            throw KeybagError.daemon("not running (no answer on \(socketPath))")
        }
        return Keybag(daemon: client, root: root, id: try client.send(KeybagRequests.Hello()).id)
    }

    // MARK: - State

    /// The lock state.
    public var lockState: LockState {
        get async { await backend.lockState }
    }

    /// Whether class-A data is available now, like `UIApplication.isProtectedDataAvailable`.
    /// Always `true` while no passcode is set.
    public var isProtectedDataAvailable: Bool {
        get async { await backend.isProtectedDataAvailable }
    }

    /// Whether existing files of `protectionClass` can be opened now.
    public func isAvailable(_ protectionClass: ProtectionClass) async -> Bool {
        await backend.isAvailable(protectionClass)
    }

    /// Whether new files of `protectionClass` can be created now (class B: always).
    public func canCreate(_ protectionClass: ProtectionClass) async -> Bool {
        await backend.canCreate(protectionClass)
    }

    /// A snapshot of the device's state: lock state, passcode policy, available classes.
    public var status: KeybagStatus {
        get async { await backend.status }
    }

    /// Seconds between a lock and the discarding of class-A keys.
    public var gracePeriod: TimeInterval {
        get async { await backend.gracePeriod }
    }

    /// Changes the grace period (needs the device unlocked when a passcode is set).
    public func setGracePeriod(_ seconds: TimeInterval) async throws {
        _ = try PasscodePolicy.gracePeriodMillis(seconds)   // checked here too, not only where the keys are
        try await backend.setGracePeriod(seconds)
    }

    /// Turns "erase after 10 failed passcodes" on or off (needs the device unlocked).
    public func setEraseAfterTenFailures(_ on: Bool) async throws {
        try await backend.setEraseAfterTenFailures(on)
    }

    /// Changes the passcode policy: the shortest passcode a later set or change accepts, in
    /// characters, from 4 to 64 (needs the device unlocked). The current passcode still unlocks.
    ///
    /// ```swift
    /// try await keybag.setMinimumPasscodeLength(8)
    /// try await keybag.changePasscode(from: "123456", to: "123456")   // throws passcodeTooShort(minimumLength: 8)
    /// ```
    public func setMinimumPasscodeLength(_ length: Int) async throws {
        _ = try PasscodePolicy.validMinimumLength(length)
        try await backend.setMinimumPasscodeLength(length)
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
    public func unlock(passcode: String) async throws {
        try await backend.unlock(passcode: SecretBytes(utf8: passcode))
    }

    /// Locks the device. Observers hear ``ProtectedDataEvent/willBecomeUnavailable`` now; class-A
    /// keys and the class-B private key are discarded when the grace period ends. Class C stays.
    /// Without a passcode, locking protects nothing and changes nothing (as on iOS).
    public func lock() async {
        await backend.lock()
    }

    // MARK: - Passcode management

    /// Sets a passcode on a device that has none: A, B and C keys are rewrapped under it.
    public func setPasscode(_ newPasscode: String) async throws {
        try await backend.setPasscode(SecretBytes(utf8: newPasscode))
    }

    /// Changes the passcode (the old one is checked like an unlock attempt); only the class keys
    /// are rewrapped, no file is touched.
    public func changePasscode(from old: String, to new: String) async throws {
        try await backend.changePasscode(from: SecretBytes(utf8: old), to: SecretBytes(utf8: new))
    }

    /// Removes the passcode: protection becomes inactive.
    public func removePasscode(current: String) async throws {
        try await backend.removePasscode(current: SecretBytes(utf8: current))
    }

    /// Crypto-erases the device: the device secret and the keybag are overwritten and removed,
    /// every key in memory is dropped. Every protected file of this root becomes unrecoverable.
    public func erase() async throws {
        try await backend.erase()
    }

    /// Crypto-erases a device that cannot be opened — its TPM refuses (the PCRs it is bound to
    /// changed) or its keybag is damaged: the TPM objects it names are removed and its files
    /// destroyed. Every protected file of the root becomes unrecoverable.
    public static func eraseUnopened(root: String, tpmTCTI: String = TPMBinding.defaultTCTI) throws {
        try EmbeddedKeybag.eraseUnopened(root: root, tpmTCTI: tpmTCTI)
    }

    // MARK: - TPM

    /// Seals the device secret by a TPM (`dpctl tpm enroll`): a new secret is sealed there, the
    /// class keys are rewrapped under it (no file is rewritten) and `device.secret` is overwritten
    /// and removed. Needs the passcode when one is set (it is checked like an unlock attempt).
    ///
    /// A copy of the data root taken *before* enrollment still holds the old secret and keybag,
    /// and with them the class keys; enrollment protects what is copied afterwards.
    public func enrollTPM(passcode: String?, _ binding: TPMBinding = TPMBinding()) async throws {
        try await embeddedForTPMChange().enrollTPM(passcode: passcode.map(SecretBytes.init(utf8:)), binding: binding)
    }

    /// Moves the device secret from the TPM back into `device.secret` and removes the TPM's
    /// objects (`dpctl tpm remove`). Needs the passcode when one is set.
    public func removeTPM(passcode: String?) async throws {
        try await embeddedForTPMChange().removeTPM(passcode: passcode.map(SecretBytes.init(utf8:)))
    }

    private func embeddedForTPMChange() throws -> EmbeddedKeybag {
        guard let embedded = backend as? EmbeddedKeybag else {
            throw KeybagError.notPermitted(
                "the device secret can only be moved by the process holding the keys: keybagd serves this root; stop it first"
            )
        }
        return embedded
    }

    // MARK: - File keys

    /// The current key generation of `protectionClass`, or an error when it is unavailable.
    /// The generation grows each time the class key is discarded, so a handle that cached a
    /// file key under an older generation knows it must not use it any more.
    public func generation(of protectionClass: ProtectionClass) async throws -> Int {
        try await backend.generation(of: protectionClass)
    }

    /// Creates a random 256-bit file key and wraps it under `protectionClass`.
    /// Class B needs only the class public key, so it works while locked.
    public func wrapNewFileKey(
        for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        try await backend.wrapNewFileKey(for: protectionClass, thisDeviceOnly: thisDeviceOnly)
    }

    /// Unwraps a file key; throws ``KeybagError/classUnavailable(_:_:)`` when its class is
    /// unavailable now, ``KeybagError/foreignKeybag(expected:found:)`` or
    /// ``KeybagError/keyUnwrapFailed(_:)`` when it is not this keybag's.
    public func unwrapFileKey(_ wrapped: WrappedFileKey) async throws -> SymmetricKey {
        try await backend.unwrapFileKeyWithGeneration(wrapped).key
    }

    /// ``unwrapFileKey(_:)`` and the current generation of the key's class, in one call.
    package func unwrapFileKeyWithGeneration(
        _ wrapped: WrappedFileKey
    ) async throws -> (key: SymmetricKey, generation: Int) {
        try await backend.unwrapFileKeyWithGeneration(wrapped)
    }

    /// Unwraps a file key and wraps it under another class (a class change: no re-encryption).
    public func rewrapFileKey(
        _ wrapped: WrappedFileKey, to protectionClass: ProtectionClass
    ) async throws -> WrappedFileKey {
        try await backend.rewrapFileKey(wrapped, to: protectionClass)
    }

    /// Wraps an existing key under `protectionClass`.
    public func wrap(
        _ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false
    ) async throws -> WrappedFileKey {
        try await backend.wrap(key, for: protectionClass, thisDeviceOnly: thisDeviceOnly)
    }
}

/// Event subscribers of a keybag whose keys a daemon holds: one subscription connection,
/// opened on the first subscriber, fans out to every observer and stream of this process.
///
/// The subscription follows the daemon through restarts (a crash under `Restart=on-failure`, an
/// upgrade, a `keybagd &` that died with its shell): when the connection ends, every class key is
/// reported discarded (the daemon's keys went with it), and while anyone still listens one thread
/// subscribes again — at once, then after 50 ms, doubling up to 2 s between tries (and a daemon
/// that drops each subscription within a second keeps the wait growing) — until a daemon answers.
/// Each subscription has a number: the end of an earlier one never touches a later one's state,
/// and one ending before its subscriber has recorded it is tried again, never left unheard. The
/// new daemon starts before first unlock, as after a reboot; its events then arrive as any
/// daemon's, and what it already allows when the subscription is back is delivered at once:
/// ``ProtectedDataEvent/didBecomeAvailable`` when class A is, and to return observers
/// (``addReturnObserver(_:)``) the classes whose keys it has. Each loss and return is logged once.
final class RemoteEvents: Sendable {
    private struct State {
        var observers: [UUID: @Sendable (ProtectedDataEvent) -> Void] = [:]
        var discardObservers: [UUID: @Sendable (ProtectionClass) -> Void] = [:]
        var returnObservers: [UUID: @Sendable (Set<ProtectionClass>) -> Void] = [:]
        var streams: [UUID: AsyncStream<ProtectedDataEvent>.Continuation] = [:]
        /// The number of the latest subscription made, and whether it is live.
        var generation = 0
        var connected = false
        /// A thread is subscribing (the first time, or again).
        var subscribing = false
        /// When the live subscription began, and the wait before the next try after it ends.
        var connectedAt = Date.distantPast
        var nextWait: TimeInterval = 0
        var isListenedTo: Bool {
            !observers.isEmpty || !discardObservers.isEmpty || !streams.isEmpty || !returnObservers.isEmpty
        }
    }
    private let client: KeybagdConnection
    private let state = Mutex(State())
    private let logger = Logger(label: "dataprotection.keybag")
    /// The first and the longest wait between two tries to subscribe again.
    static let firstRetryInterval: TimeInterval = 0.05
    static let longestRetryInterval: TimeInterval = 2

    init(client: KeybagdConnection) { self.client = client }

    func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) -> UUID {
        let token = UUID()
        state.withLock { $0.observers[token] = callback }
        subscribeIfNeeded()
        return token
    }

    func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) -> UUID {
        let token = UUID()
        state.withLock { $0.discardObservers[token] = callback }
        subscribeIfNeeded()
        return token
    }

    func addReturnObserver(_ callback: @escaping @Sendable (Set<ProtectionClass>) -> Void) -> UUID {
        let token = UUID()
        state.withLock { $0.returnObservers[token] = callback }
        subscribeIfNeeded()
        return token
    }

    func stream() -> AsyncStream<ProtectedDataEvent> {
        let (stream, continuation) = AsyncStream<ProtectedDataEvent>.makeStream(bufferingPolicy: .unbounded)
        let token = UUID()
        state.withLock { $0.streams[token] = continuation }
        continuation.onTermination = { [weak self] _ in self?.remove(token) }
        subscribeIfNeeded()
        return stream
    }

    func remove(_ token: UUID) {
        state.withLock { state in
            state.observers[token] = nil
            state.discardObservers[token] = nil
            state.returnObservers[token] = nil
            state.streams[token] = nil
        }
    }

    /// The first subscriber subscribes (here, once); when no daemon answers, the retry thread
    /// goes on trying.
    private func subscribeIfNeeded() {
        let start = state.withLock { state in
            guard !state.connected, !state.subscribing else { return false }
            state.subscribing = true
            return true
        }
        guard start else { return }
        if tryToSubscribe(returning: false) != .connected { startRetrying() }
    }

    private enum Outcome { case connected, failed, endedAtOnce }

    /// One try: subscribes under a new number, and records it as live unless it already ended.
    private func tryToSubscribe(returning: Bool) -> Outcome {
        let generation = state.withLock { state in
            state.generation += 1
            return state.generation
        }
        do {
            try client.subscribe(
                { [weak self] event in self?.deliver(event) },
                ended: { [weak self] in self?.subscriptionEnded(generation) })
        } catch {
            return .failed
        }
        let live = state.withLock { state -> Bool in
            // ended already (subscriptionEnded moved it on)
            guard state.generation == generation else { return false }
            state.connected = true
            state.subscribing = false
            state.connectedAt = Date()
            return true
        }
        guard live else { return .endedAtOnce }
        if returning { daemonReturned() }
        return .connected
    }

    /// The subscription numbered `generation` ended: the daemon's keys went with it.
    private func subscriptionEnded(_ generation: Int) {
        let (wasLive, retry) = state.withLock { state -> (Bool, Bool) in
            guard state.generation == generation else { return (false, false) }   // an earlier one's end
            state.generation += 1   // a try still recording this one sees it ended
            let wasLive = state.connected
            if wasLive {
                // A daemon that drops each subscription at once keeps the wait growing.
                let lasted = Date().timeIntervalSince(state.connectedAt)
                state.nextWait =
                    lasted < 1 ? min(max(state.nextWait * 2, Self.firstRetryInterval), Self.longestRetryInterval) : 0
            }
            state.connected = false
            guard state.isListenedTo, !state.subscribing else { return (wasLive, false) }
            state.subscribing = true
            return (wasLive, true)
        }
        if wasLive {
            logger.warning(
                "keybagd (\(client.socketPath)) went away: classes A, B and C are unavailable until it returns and is unlocked"
            )
            deliver(.discarded(.complete))
            deliver(.discarded(.completeUnlessOpen))
            deliver(.discarded(.completeUntilFirstUserAuthentication))
        }
        if retry { startRetrying() }
    }

    /// One thread subscribes again until a daemon answers or nobody listens any more
    /// (``State/subscribing`` is set for it).
    private func startRetrying() {
        let thread = Thread { [weak self] in
            var wait = self?.state.withLock { $0.nextWait } ?? 0
            while let events = self {
                if wait > 0 { usleep(useconds_t(wait * 1_000_000)) }
                guard events.state.withLock({ $0.isListenedTo }) else {
                    events.state.withLock { $0.subscribing = false }
                    return
                }
                if events.tryToSubscribe(returning: true) == .connected { return }
                wait = min(max(wait * 2, Self.firstRetryInterval), Self.longestRetryInterval)
            }
        }
        thread.name = "keybagd reconnect"
        thread.start()
    }

    /// A daemon answers again: what it allows now is delivered.
    private func daemonReturned() {
        let available = Set(
            ProtectionClass.allCases.filter {
                (try? client.send(KeybagRequests.IsAvailable(protectionClass: $0))) == true
            })
        let unlocked = (try? client.send(KeybagRequests.IsProtectedDataAvailable())) == true
        logger.warning(
            "keybagd (\(client.socketPath)) is back\(unlocked ? " and unlocked" : ": classes follow its lock state from now on")"
        )
        let returns = state.withLock { Array($0.returnObservers.values) }
        for observer in returns { observer(available) }
        if unlocked { deliver(.protectedData(.didBecomeAvailable)) }
    }

    private func deliver(_ event: KeybagWire.Event) {
        let (observers, discards, streams) = state.withLock {
            ($0.observers.values, $0.discardObservers.values, $0.streams.values)
        }
        switch event {
        case .protectedData(let event):
            for observer in observers { observer(event) }
            for continuation in streams { continuation.yield(event) }
        case .discarded(let cls):
            for observer in discards { observer(cls) }
        }
    }
}
