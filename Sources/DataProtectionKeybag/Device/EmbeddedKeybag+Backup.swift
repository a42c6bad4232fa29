import Crypto
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: backup keybag.
extension EmbeddedKeybag {
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
        guard let bPrivate = classBPrivateKey, classKeys[.complete] != nil else {
            throw KeybagError.deviceLocked(state)
        }
        let kdf = PasscodeKDF(logN: max(file.kdf.logN, 15), r: file.kdf.r, p: file.kdf.p)
        let backup = try BackupKeybag(
            sourceKeybagID: id, classKeys: classKeys, classBPrivate: bPrivate, password: password, kdf: kdf)
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
    package func adoptFileKey(
        _ wrapped: WrappedFileKey, from backupKeys: BackupClassKeys,
        as protectionClass: ProtectionClass? = nil
    ) throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        let key = try backupKeys.unwrap(wrapped)
        return (key, try wrap(key, for: protectionClass ?? wrapped.protectionClass))
    }
}
