import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Sealing a backup: what makes it whole, restorable elsewhere and authentic, then the device's
/// own index for the next incremental run.
extension BackupEngine {
    /// Writes the backup keybag, the manifest (sealed like a plain file), the object list and the
    /// authentication into `inProgress`, then renames it to its ID: a backup is there whole or
    /// not at all. Then records `entries` as the device's index for the next run.
    func seal(
        _ entries: [ManifestEntry], packsOfList: [String: [String]], id: String, started: Date, into inProgress: URL,
        summary: inout BackupSummary, log: (String) -> Void
    ) async throws {
        // The backup keybag travels with the backup, so another device can restore it.
        let backupKeybag = files.keybag.backupKeybagURL
        var backupKeybagBytes: [UInt8]?
        if POSIXFile.kind(backupKeybag.path).exists {
            let bytes = try POSIXFile.readAll(backupKeybag.path)
            try POSIXFile.writeAtomically(
                inProgress.appendingPathComponent(BackupKeybag.fileName).path, bytes, permissions: .ownerReadWrite)
            backupKeybagBytes = bytes
            summary.hasBackupKeybag = true
        } else {
            log("Note: no backup keybag (set a backup password): this backup restores on this device only")
        }
        // The manifest, sealed like a plain file (class B: possible while locked); the object
        // list, which reveals nothing, lets `verify` check the objects.
        var meta = ["source": source.path, "created": ISO8601DateFormatter().string(from: started), "id": id]
        if let rootDefault = try DirectoryDefault.get(source.path) { meta["defaultClass"] = "\(rootDefault.rawValue)" }
        let manifest = try BackupManifest.create(at: nil)
        try manifest.insert(entries, meta: meta)
        let manifestURL = inProgress.appendingPathComponent(BackupManifest.fileName)
        try await files.write(
            try manifest.serialized(), to: manifestURL, protection: .completeUnlessOpen, thisDeviceOnly: false)
        // the repository's files are its owner's only
        try POSIXFile.call("chmod", manifestURL.path) { chmod($0, 0o600) }
        var used = Set(entries.compactMap(\.sha256))
        for entry in entries where entry.chunked {
            guard let list = entry.sha256, let packs = packsOfList[list] else {
                throw BackupError.badBackup(
                    path: repository.url.path, reason: "the packs of \(LosslessPath.display(entry.path)) are not known")
            }
            used.formUnion(packs)
        }
        let objectList = Array(used.sorted().map { $0 + "\n" }.joined().utf8)
        try POSIXFile.writeAtomically(
            inProgress.appendingPathComponent(BackupRepository.objectListName).path, objectList,
            permissions: .ownerReadWrite)
        // Last, what makes it authentic: a MAC only this device (or the backup password) can make.
        let contents = BackupAuthentication.Contents(
            backupID: id, manifest: try POSIXFile.readAll(manifestURL.path),
            objectList: objectList, backupKeybag: backupKeybagBytes)
        let authentication = BackupAuthentication(
            keybagID: files.keybag.id, contents: contents,
            key: try await files.keybag.backupAuthenticationKey())
        try POSIXFile.writeAtomically(
            inProgress.appendingPathComponent(BackupAuthentication.fileName).path, authentication.encoded,
            permissions: .ownerReadWrite)
        try POSIXFile.syncDirectory(inProgress.path)
        let finished = repository.backups.appendingPathComponent(id)
        try POSIXFile.call("rename", inProgress.path, finished.path) { rename($0, $1) }
        try POSIXFile.syncDirectory(repository.backups.path)

        // The device's own copy for the next incremental run (a failure here only costs speed),
        // in a root entry an erase removes.
        _ = try? files.keybag.layout.register(Self.indexDirectoryName)
        try? FileManager.default.createDirectory(
            at: indexURL.deletingLastPathComponent(), withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        let indexTemp = indexURL.deletingLastPathComponent().appendingPathComponent(".\(UUID().uuidString).tmp")
        if (try? BackupManifest.create(at: indexTemp).insert(entries, meta: meta)) != nil {
            _ = try? POSIXFile.call("rename", indexTemp.path, indexURL.path) { rename($0, $1) }
        }
        _ = try? POSIXFile.call("unlink", indexTemp.path) { unlink($0) }
        // The finished backup's index covers what the interrupted ones stored.
        Self.removeDatabase(at: partialIndexURL)
    }
}
