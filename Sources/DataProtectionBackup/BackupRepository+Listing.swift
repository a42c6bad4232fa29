import DataProtection
import Foundation

/// One backup of a repository, as `restic snapshots` lists them: read from names and sizes
/// alone, without any key. Nothing here is authenticated; `verify` authenticates a backup.
public struct BackupListing: Sendable, Equatable, Codable {
    /// The backup's ID: its directory name under `REPOSITORY/backups/`.
    public var id: String
    /// The backup's directory.
    public var path: String
    /// When it was started, from its ID (UTC, to the second).
    public var created: Date?
    /// False for a backup that was interrupted (`ID.incomplete`): it cannot be restored.
    public var isComplete: Bool
    /// How many objects it uses (its object list's lines).
    public var objects: Int?
    /// Whether it carries a backup keybag: whether it restores on another device, with the backup password.
    public var carriesBackupKeybag: Bool
    /// The device (keybag) its authentication record names.
    public var device: UUID?
}

extension BackupRepository {
    /// Whether `url` looks like a repository (it has `backups/` and `objects/`) rather than one backup.
    public static func isRepository(_ url: URL) -> Bool {
        let repository = BackupRepository(url: url)
        return [repository.backups, repository.objects].allSatisfy { POSIXFile.kind($0.path).isDirectory }
            && POSIXFile.linkStatus(url.appendingPathComponent(objectListName).path) == nil
    }

    /// Every backup, finished or interrupted, oldest first.
    public func listBackups() -> [BackupListing] {
        backupNamesOldestFirst().map { name in
            let directory = backups.appendingPathComponent(name)
            let id = name.hasSuffix(Self.incompleteSuffix) ? String(name.dropLast(Self.incompleteSuffix.count)) : name
            let objectList = try? POSIXFile.readRegularFile(directory.appendingPathComponent(Self.objectListName).path, maxSize: 1 << 30)
            let record = (try? POSIXFile.readRegularFile(directory.appendingPathComponent(BackupAuthentication.fileName).path,
                                                         maxSize: BackupAuthentication.length))
                .flatMap { try? BackupAuthentication(bytes: $0, path: directory.path) }
            return BackupListing(
                id: id, path: directory.path, created: Self.creationDate(ofID: id),
                isComplete: !name.hasSuffix(Self.incompleteSuffix),
                objects: objectList.map { $0.reduce(0) { $1 == 0x0A ? $0 + 1 : $0 } },
                carriesBackupKeybag: POSIXFile.linkStatus(directory.appendingPathComponent(BackupKeybag.fileName).path) != nil,
                device: record?.keybagID)
        }
    }

    /// The newest finished backup (restic's `latest`).
    /// - Throws: ``BackupError/badBackup(path:reason:)`` when the repository has none.
    public func latestFinishedBackup() throws -> URL {
        guard let latest = finishedBackups().last else {
            throw BackupError.badBackup(path: url.path, reason: "the repository holds no finished backup")
        }
        return latest
    }

    /// The time an ID (`yyyyMMddTHHmmssZ-…`) was made at.
    static func creationDate(ofID id: String) -> Date? {
        guard let stamp = id.split(separator: "-").first else { return nil }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = BackupEngine.idDateFormat
        return formatter.date(from: String(stamp))
    }
}
