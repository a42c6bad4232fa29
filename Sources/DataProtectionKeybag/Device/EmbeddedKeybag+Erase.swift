import Crypto
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: erase.
extension EmbeddedKeybag {
    // MARK: - Erase

    /// Crypto-erases the device: the device secret and the keybag are overwritten and removed,
    /// every key in memory is dropped. Every protected file of this root becomes unrecoverable.
    package func erase() throws {
        // The TPM's objects first: a copy of the disk then opens nothing, even on this machine.
        var tpmFailure: Error?
        do { try removeTPMObjects() } catch { tpmFailure = error }
        DeviceSecret.destroy(in: root)
        unlink(layout.tpmBinding)
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
        if let tpmFailure {
            logger.error("the TPM objects of the erased device could not be removed: \(tpmFailure)")
            throw KeybagError.tpm("the device was erased, but its TPM objects could not be removed: \(tpmFailure)")
        }
    }
}
