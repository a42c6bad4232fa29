import Crypto
import Foundation
import Logging
import Synchronization

/// The backup keybag: the class keys wrapped for a backup password, so that another device can
/// restore this one's backups.
extension Keybag {
    /// Where ``setBackupPassword(_:)`` keeps the backup keybag.
    public var backupKeybagURL: URL { URL(fileURLWithPath: layout.backupKeybag) }

    /// Wraps every class key under a backup password into `ROOT/backup-keybag` (replacing any
    /// earlier one). Needs the device unlocked: the A and B keys must be in memory.
    public func setBackupPassword(_ password: String) async throws {
        try await backend.setBackupPassword(SecretBytes(utf8: password))
    }

    /// The key this device authenticates its backups with (FORMAT.md §5.1), derived from the
    /// class D key: available in every lock state, never computable from a repository's contents.
    package func backupAuthenticationKey() async throws -> SymmetricKey {
        try await backend.backupAuthenticationKey()
    }

    /// Takes over a file key wrapped by another device, given that device's class keys (from its
    /// backup keybag): returns it wrapped under this keybag, in the same class or `protectionClass`.
    public func adoptFileKey(
        _ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
        as protectionClass: ProtectionClass? = nil
    ) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        try await backend.adoptFileKey(wrapped, from: backupKeys, as: protectionClass)
    }
}
