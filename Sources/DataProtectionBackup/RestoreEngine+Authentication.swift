import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Authentication: a backup is read only once its authentication record verifies, and only the
/// bytes it covers.
extension RestoreEngine {
    /// Checks the backup's authentication record and returns what it covers.
    func authenticate(files: ProtectedFileManager, password: String?) async throws -> AuthenticatedBackup {
        let id = backup.lastPathComponent
        if id.hasSuffix(BackupRepository.incompleteSuffix) { throw BackupError.incompleteBackup(path: backup.path) }
        guard POSIXFile.kind(file(BackupRepository.objectListName)).exists else {
            let backupFiles = [BackupAuthentication.fileName, BackupManifest.fileName, BackupKeybag.fileName]
            if !backupFiles.contains(where: { POSIXFile.linkStatus(file($0)) != nil }) {
                throw BackupError.notABackup(path: backup.path)
            }
            throw BackupError.badBackup(
                path: backup.path, reason: "no object list (not a backup, or an unfinished one)")
        }
        guard POSIXFile.kind(file(BackupAuthentication.fileName)).exists else {
            throw BackupError.notAuthentic(
                path: backup.path,
                reason:
                    "it has no authentication record (made by a version before backups were authenticated, or planted)")
        }
        // Each file read once, only if it is a regular file of a plausible size: a repository's
        // symlink to /dev/zero, a FIFO or a sparse terabyte is refused, not read.
        func read(_ name: String, maxSize: Int) throws -> [UInt8] {
            do { return try POSIXFile.readRegularFile(file(name), maxSize: maxSize) } catch let error as FileSystemError
            {
                throw BackupError.badBackup(
                    path: backup.path,
                    reason: "\(name) is not a regular file of at most \(maxSize) bytes (\(error.errno))")
            }
        }
        let record = try BackupAuthentication(
            bytes: try read(BackupAuthentication.fileName, maxSize: BackupAuthentication.length), path: backup.path)
        guard POSIXFile.linkStatus(file(BackupManifest.fileName)) != nil else {
            throw BackupError.badBackup(path: backup.path, reason: "no manifest")
        }
        let manifest = try read(BackupManifest.fileName, maxSize: Self.manifestLimit)
        let objectList = try read(BackupRepository.objectListName, maxSize: Self.objectListLimit)
        let keybagBytes =
            POSIXFile.linkStatus(file(BackupKeybag.fileName)) != nil
            ? try read(BackupKeybag.fileName, maxSize: BackupKeybag.totalSize) : nil

        let key: SymmetricKey
        var backupKeys: BackupClassKeys?
        if record.keybagID == files.keybag.id {
            key = try await files.keybag.backupAuthenticationKey()
        } else {
            guard let keybagBytes else {
                throw BackupError.badBackup(
                    path: backup.path,
                    reason:
                        "it was made by another device (keybag \(record.keybagID)) and carries no backup keybag: it restores only there"
                )
            }
            guard let password else { throw BackupError.passwordNeeded(files: 1) }
            let keys: BackupClassKeys
            do { keys = try BackupKeybag(bytes: keybagBytes).unlock(password: password) } catch KeybagError
                .wrongBackupPassword
            {
                throw BackupError.wrongBackupPassword
            }
            guard keys.sourceKeybagID == record.keybagID else {
                throw BackupError.notAuthentic(
                    path: backup.path,
                    reason:
                        "its backup keybag belongs to another device than the one named by its authentication record")
            }
            key = keys.backupAuthenticationKey
            backupKeys = keys
        }
        let contents = BackupAuthentication.Contents(
            backupID: id, manifest: manifest, objectList: objectList, backupKeybag: keybagBytes)
        guard record.check(contents, key: key) else {
            throw BackupError.notAuthentic(
                path: backup.path,
                reason:
                    "its authentication does not match its contents: it was modified, or was not made by this device (or by the device whose backup password was given)"
            )
        }
        guard let text = String(validating: objectList, as: UTF8.self) else {
            throw BackupError.badBackup(path: backup.path, reason: "malformed object list")
        }
        let objects = text.split(separator: "\n").map(String.init)
        guard objects.allSatisfy({ BackupRepository.isObjectName(Substring($0)) }) else {
            throw BackupError.badBackup(path: backup.path, reason: "malformed object list")
        }
        return AuthenticatedBackup(
            id: id, sealedManifest: manifest, objects: objects, backupKeys: backupKeys, device: record.keybagID)
    }

    /// Opens the authenticated, sealed manifest: with this device's class B key when this device
    /// made the backup, else with the backup password (its copy is rewrapped for this device).
    public func manifest(files: ProtectedFileManager, password: String?) async throws -> BackupManifest {
        try await manifest(of: try await authenticate(files: files, password: password), files: files)
    }

    func manifest(of authenticated: AuthenticatedBackup, files: ProtectedFileManager) async throws -> BackupManifest {
        // The checked bytes go to a private file: nothing can swap them after the check.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "dp-manifest-\(UUID().uuidString)")
        try POSIXFile.call("mkdir", directory.path) { mkdir($0, 0o700) }
        defer { try? FileManager.default.removeItem(at: directory) }
        let copy = directory.appendingPathComponent(BackupManifest.fileName)
        try POSIXFile.writeAtomically(copy.path, authenticated.sealedManifest, permissions: .ownerReadWrite)
        // Errors name the manifest in the repository, never the private copy.
        var bytes: Data
        do {
            if let keys = authenticated.backupKeys { try await files.adoptFile(at: copy, from: keys) }
            bytes = try await files.contents(of: copy)
        } catch let error as ProtectedFileError where error.path == copy.path {
            throw error.naming(file(BackupManifest.fileName))
        }
        defer { bytes.resetBytes(in: 0..<bytes.count) }
        let manifest = try BackupManifest.deserialize([UInt8](bytes), path: file(BackupManifest.fileName))
        guard try manifest.meta("id") == authenticated.id else {
            throw BackupError.notAuthentic(path: backup.path, reason: "its manifest names another backup")
        }
        return manifest
    }

    static func keybagID(of url: URL) throws -> UUID {
        let fd = try POSIXFile.open(url.path, .readOnly)
        defer { try? fd.close() }
        let header = try POSIXFile.read(fd, count: 48, at: 0, path: url.path)
        guard header.count == 48 else {
            throw BackupError.badBackup(path: url.path, reason: "truncated protected file")
        }
        return UUID(bytes: Array(header[32..<48]))
    }
}
