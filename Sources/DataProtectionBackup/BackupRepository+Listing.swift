import DataProtection
import DataProtectionSystem
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
            // Each line of an object list is 64 hex digits and a newline: its size says how many.
            let objectListSize = POSIXFile.linkStatus(directory.appendingPathComponent(Self.objectListName).path)
                .flatMap { $0.st_mode & S_IFMT == S_IFREG && $0.st_size % 65 == 0 ? Int($0.st_size / 65) : nil }
            let record =
                (try? POSIXFile.readRegularFile(
                    directory.appendingPathComponent(BackupAuthentication.fileName).path,
                    maxSize: BackupAuthentication.length))
                .flatMap { try? BackupAuthentication(bytes: $0, path: directory.path) }
            return BackupListing(
                id: id, path: directory.path, created: Self.creationDate(ofID: id),
                isComplete: !name.hasSuffix(Self.incompleteSuffix),
                objects: objectListSize,
                carriesBackupKeybag: POSIXFile.linkStatus(directory.appendingPathComponent(BackupKeybag.fileName).path)
                    != nil,
                device: record?.keybagID)
        }
    }

    /// The newest finished backup that authenticates for this device (or for the holder of
    /// `password`): restic's `latest`. A newer entry that does not authenticate — planted by
    /// someone without the keys, damaged — is passed over and reported to `skipped`, so it
    /// cannot make the repository unusable.
    /// - Throws: ``BackupError/noFinishedBackup(path:)`` when there is no finished backup,
    ///   ``BackupError/notAuthentic(path:reason:)`` when there are some and none authenticates;
    ///   a wrong or missing backup password as ``RestoreEngine`` throws it.
    public func latestAuthenticBackup(
        files: ProtectedFileManager, password: String?,
        skipped: (URL, any Error) -> Void = { _, _ in }
    ) async throws -> URL {
        let finished = finishedBackups()
        for candidate in finished.reversed() {
            do {
                _ = try await RestoreEngine(backup: candidate).authenticate(files: files, password: password)
                return candidate
            } catch let error as BackupError {
                switch error {
                case .notAuthentic, .badBackup, .incompleteBackup: skipped(candidate, error)
                default: throw error
                }
            }
        }
        if finished.isEmpty { throw BackupError.noFinishedBackup(path: url.path) }
        throw BackupError.notAuthentic(
            path: url.path, reason: "none of its \(finished.count) finished backup(s) authenticates")
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
