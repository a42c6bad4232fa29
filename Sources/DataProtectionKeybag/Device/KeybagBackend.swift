import Crypto
import Foundation

/// Where a ``Keybag``'s keys are, and the operations on them: ``EmbeddedKeybag`` (in this
/// process) or ``KeybagdClient`` (in the keybagd serving the root). ``Keybag`` forwards every
/// call to its backend; adding an operation means a requirement here, its ``KeybagRequest``,
/// and the two implementations (CONTRIBUTING.md).
package protocol KeybagBackend: Sendable {
    var lockState: LockState { get async }
    var isProtectedDataAvailable: Bool { get async }
    func isAvailable(_ protectionClass: ProtectionClass) async -> Bool
    func canCreate(_ protectionClass: ProtectionClass) async -> Bool
    var status: KeybagStatus { get async }
    var gracePeriod: TimeInterval { get async }
    func setGracePeriod(_ seconds: TimeInterval) async throws
    func setEraseAfterTenFailures(_ on: Bool) async throws
    func setMinimumPasscodeLength(_ length: Int) async throws

    func unlock(passcode: SecretBytes) async throws
    func lock() async
    func setPasscode(_ newPasscode: SecretBytes) async throws
    func changePasscode(from old: SecretBytes, to new: SecretBytes) async throws
    func removePasscode(current: SecretBytes) async throws
    func erase() async throws

    func generation(of protectionClass: ProtectionClass) async throws -> Int
    func wrapNewFileKey(
        for protectionClass: ProtectionClass, thisDeviceOnly: Bool
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey)
    func unwrapFileKeyWithGeneration(_ wrapped: WrappedFileKey) async throws -> (key: SymmetricKey, generation: Int)
    func rewrapFileKey(_ wrapped: WrappedFileKey, to protectionClass: ProtectionClass) async throws -> WrappedFileKey
    func wrap(
        _ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool
    ) async throws -> WrappedFileKey

    func setBackupPassword(_ password: SecretBytes) async throws
    func adoptFileKey(
        _ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
        as protectionClass: ProtectionClass?
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey)
    func backupAuthenticationKey() async throws -> SymmetricKey

    func events() async -> AsyncStream<ProtectedDataEvent>
    func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) async -> UUID
    func removeObserver(_ token: UUID) async
    func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) async -> UUID
    func removeDiscardObserver(_ token: UUID) async
}

extension EmbeddedKeybag: KeybagBackend {}

/// The client side of keybagd: the keys of the daemon serving a root. Each operation is one
/// ``KeybagRequest`` round trip, except what the daemon's state page answers without one
/// (generations of available classes, cached class C and D file keys).
package final class KeybagdClient: KeybagBackend {
    /// The connection every request goes through.
    let connection: KeybagdConnection
    let remoteEvents: RemoteEvents

    init(connection: KeybagdConnection) {
        self.connection = connection
        self.remoteEvents = RemoteEvents(client: connection)
    }

    package var lockState: LockState {
        // A daemon that stopped answering holds no keys: as after a reboot.
        get async { (try? connection.send(KeybagRequests.LockStateRequest())) ?? .beforeFirstUnlock }
    }
    package var isProtectedDataAvailable: Bool {
        get async { (try? connection.send(KeybagRequests.IsProtectedDataAvailable())) == true }
    }
    package func isAvailable(_ protectionClass: ProtectionClass) async -> Bool {
        (try? connection.send(KeybagRequests.IsAvailable(protectionClass: protectionClass))) == true
    }
    package func canCreate(_ protectionClass: ProtectionClass) async -> Bool {
        (try? connection.send(KeybagRequests.CanCreate(protectionClass: protectionClass))) == true
    }
    package var status: KeybagStatus {
        get async {
            if let status = try? connection.send(KeybagRequests.Status()) { return status }
            return KeybagStatus(
                root: "", keybagID: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
                lockState: .beforeFirstUnlock,
                passcodeSet: true, failedAttempts: 0, delayRemaining: nil, gracePeriod: 0, graceRemaining: nil,
                eraseAfterTenFailures: false, kdf: PasscodeKDF(logN: 0), available: [])
        }
    }
    package var gracePeriod: TimeInterval { get async { (try? connection.send(KeybagRequests.GracePeriod())) ?? 0 } }
    package func setGracePeriod(_ seconds: TimeInterval) async throws {
        try connection.send(KeybagRequests.SetGracePeriod(seconds: seconds))
    }
    package func setEraseAfterTenFailures(_ on: Bool) async throws {
        try connection.send(KeybagRequests.SetEraseAfterTenFailures(on: on))
    }
    package func setMinimumPasscodeLength(_ length: Int) async throws {
        try connection.send(KeybagRequests.SetMinimumPasscodeLength(length: length))
    }

    package func unlock(passcode: SecretBytes) async throws {
        try connection.send(KeybagRequests.Unlock(secret: passcode))
    }
    package func lock() async { _ = try? connection.send(KeybagRequests.Lock()) }
    package func setPasscode(_ newPasscode: SecretBytes) async throws {
        try connection.send(KeybagRequests.SetPasscode(secret: newPasscode))
    }
    package func changePasscode(from old: SecretBytes, to new: SecretBytes) async throws {
        try connection.send(KeybagRequests.ChangePasscode(old: old, new: new))
    }
    package func removePasscode(current: SecretBytes) async throws {
        try connection.send(KeybagRequests.RemovePasscode(secret: current))
    }
    package func erase() async throws { try connection.send(KeybagRequests.Erase()) }

    package func generation(of protectionClass: ProtectionClass) async throws -> Int {
        if let generation = connection.fastGeneration(of: protectionClass) { return generation }
        return try connection.send(KeybagRequests.Generation(protectionClass: protectionClass))
    }
    package func wrapNewFileKey(
        for protectionClass: ProtectionClass, thisDeviceOnly: Bool
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        try connection.send(
            KeybagRequests.WrapNewFileKey(protectionClass: protectionClass, thisDeviceOnly: thisDeviceOnly))
    }
    package func unwrapFileKeyWithGeneration(
        _ wrapped: WrappedFileKey
    ) async throws -> (key: SymmetricKey, generation: Int) {
        if let cached = connection.cachedFileKey(wrapped) { return cached }
        let before = connection.pageReading()
        let answer = try connection.send(KeybagRequests.UnwrapFileKey(wrapped: wrapped))
        connection.rememberFileKey(wrapped, key: answer.key, generation: answer.generation, observedBefore: before)
        return answer
    }
    package func rewrapFileKey(
        _ wrapped: WrappedFileKey, to protectionClass: ProtectionClass
    ) async throws -> WrappedFileKey {
        try connection.send(KeybagRequests.RewrapFileKey(wrapped: wrapped, protectionClass: protectionClass))
    }
    package func wrap(
        _ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool
    ) async throws -> WrappedFileKey {
        try connection.send(
            KeybagRequests.Wrap(key: key, protectionClass: protectionClass, thisDeviceOnly: thisDeviceOnly))
    }

    package func setBackupPassword(_ password: SecretBytes) async throws {
        try connection.send(KeybagRequests.SetBackupPassword(secret: password))
    }
    package func adoptFileKey(
        _ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
        as protectionClass: ProtectionClass?
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        // The other device's key is in this process already; only the wrap needs the daemon.
        let key = try backupKeys.unwrap(wrapped)
        return (key, try await wrap(key, for: protectionClass ?? wrapped.protectionClass, thisDeviceOnly: false))
    }
    package func backupAuthenticationKey() async throws -> SymmetricKey {
        try connection.send(KeybagRequests.BackupAuthenticationKey())
    }

    package func events() async -> AsyncStream<ProtectedDataEvent> { remoteEvents.stream() }
    package func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) async -> UUID {
        remoteEvents.addObserver(callback)
    }
    package func removeObserver(_ token: UUID) async { remoteEvents.remove(token) }
    package func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) async -> UUID {
        remoteEvents.addDiscardObserver(callback)
    }
    package func removeDiscardObserver(_ token: UUID) async { remoteEvents.remove(token) }
}
