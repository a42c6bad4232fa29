import Crypto
import DataProtectionSystem
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
        Self.destroyRootFiles(layout)
        cancelGrace()
        for cls in ProtectionClass.allCases { discard(cls) }
        isErased = true
        state = .beforeFirstUnlock
        logger.notice("device erased")
        emit(.willBecomeUnavailable)
        if let tpmFailure {
            logger.error("the TPM objects of the erased device could not be removed: \(tpmFailure)")
            throw KeybagError.tpm("the device was erased, but its TPM objects could not be removed: \(tpmFailure)")
        }
    }

    /// Crypto-erases a device that cannot be opened (its TPM refuses — PCRs changed — or its
    /// keybag is damaged): the TPM objects the root names are removed, then its files destroyed.
    ///
    /// The handles are read from files that cannot be authenticated without the device secret,
    /// so only handles inside this library's own ranges are touched.
    package static func eraseUnopened(root: String, tpmTCTI: String) throws {
        let layout = DataRootLayout(root: root)
        guard
            POSIXFile.kind(layout.keybag).exists || POSIXFile.kind(layout.deviceSecret).exists
                || POSIXFile.kind(layout.tpmBinding).exists
        else {
            throw KeybagError.notInitialized(root: root)
        }
        var tpmFailure: Error?
        if let bytes = try? POSIXFile.readAll(layout.tpmBinding),
            let record = try? TPMBindingRecord.decode(bytes, path: layout.tpmBinding)
        {
            var objects = [record.deviceObject]
            var indices: [UInt32] = []
            if let keybag = try? POSIXFile.readAll(layout.keybag), keybag.count == KeybagFile.totalSize,
                keybag[400] == 1
            {
                let u32 = { (offset: Int) in keybag[offset..<offset + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
                objects.append(u32(404))
                indices = [u32(408), u32(412)]
            }
            objects = objects.filter { TPMDevice.persistentRange.contains($0) }
            indices = indices.filter { TPMDevice.counterRange.contains($0) }
            do {
                try TPMDevice(tcti: tpmTCTI).remove(
                    objects: objects, counter: indices.first, base: indices.dropFirst().first)
            } catch { tpmFailure = error }
        }
        destroyRootFiles(layout)
        if let tpmFailure {
            throw KeybagError.tpm("the device was erased, but its TPM objects could not be removed: \(tpmFailure)")
        }
    }

    /// Overwrites and removes the device secret and the keybag, then every other file of the root.
    static func destroyRootFiles(_ layout: DataRootLayout) {
        DeviceSecret.destroy(in: layout.root)
        unlink(layout.tpmBinding)
        for keybagPath in [layout.keybag, layout.keybagSpare] {
            if let fd = try? POSIXFile.open(keybagPath, .writeOnly, options: [.noFollow]) {
                try? POSIXFile.write(fd, randomBytes(KeybagFile.totalSize), at: 0, path: keybagPath)
                try? POSIXFile.sync(fd, path: keybagPath)
                try? fd.close()
            }
            unlink(keybagPath)
        }
        unlink(layout.keybagLock)
        unlink(layout.backupKeybag)
        // What other layers keep in the root (the backup layer's index of backed-up names …).
        layout.removeRegisteredEntries()
        try? POSIXFile.syncDirectory(layout.root)
    }
}
