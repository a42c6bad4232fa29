import DataProtection
import DataProtectionBackup
import DataProtectionSystem
import Foundation
import Synchronization

/// Local paths that stand for something the user named otherwise (a remote repository's mirror
/// on this device): messages show the user's name for them.
enum DisplayedPaths {
    private static let aliases = Mutex<[(local: String, shown: String)]>([])

    static func show(_ local: String, as shown: String) { aliases.withLock { $0.append((local, shown)) } }

    static func apply(_ text: String) -> String {
        aliases.withLock { $0 }.reduce(text) { $0.replacingOccurrences(of: $1.local, with: $1.shown) }
    }
}

/// A remote repository argument (`rclone:REMOTE:PATH[/backups/ID]`, `sftp:…`): the repository
/// and, when one was named, the backup's ID.
func remoteRepository(
    _ argument: String, layout: DataRootLayout, namingABackup: Bool = false
) throws -> (RemoteRepository, id: String?) {
    var repository = argument
    var id: String?
    // Only `restore` and `verify` take REPOSITORY/backups/ID, and only an ID's shape is split
    // off: a repository may itself live under a directory called `backups`.
    if namingABackup, let range = argument.range(of: "/backups/", options: .backwards) {
        let tail = argument[range.upperBound...]
        if RemoteRepository.isBackupID(tail) {
            id = String(tail)
            repository = String(argument[..<range.lowerBound])
        }
    }
    let remote = try RemoteRepository(location: RemoteLocation(repository), layout: layout)
    DisplayedPaths.show(remote.mirror.url.path, as: repository)
    return (remote, id)
}

/// A remote backup fetched for reading: the mirror's backups and, for `restore` and `verify`,
/// the objects of the one named (or of the latest that authenticates).
func fetchRemoteBackup(
    _ argument: String, files: ProtectedFileManager, password: String?, quiet: Bool
) async throws -> (URL, RemoteRepository) {
    let (remote, id) = try remoteRepository(argument, layout: files.keybag.layout, namingABackup: true)
    let mirror = try await remote.fetchForReading()
    let backup: URL
    if let id {
        backup = mirror.backupURL(id: id)
        guard POSIXFile.kind(backup.path).exists else {
            if POSIXFile.kind(mirror.backupURL(id: id, incomplete: true).path).exists {
                throw BackupError.incompleteBackup(path: argument)
            }
            throw BackupError.notABackup(path: argument)
        }
    } else {
        backup = try await mirror.latestAuthenticBackup(files: files, password: password) { skipped, why in
            printError(
                "dpctl: warning: passing over \(LosslessPath.display(skipped.lastPathComponent)): \(LosslessPath.display(DisplayedPaths.apply(String(describing: why))))"
            )
        }
        if !quiet { printError("dpctl: using the latest backup, \(LosslessPath.display(backup.lastPathComponent))") }
    }
    try await remote.fetchObjects(of: backup)
    return (backup, remote)
}
