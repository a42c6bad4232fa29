import DataProtection
import Foundation

extension RemoteRepository {
    /// `forget` on the remote repository: decided on the mirror exactly as a local repository's
    /// (``BackupRepository/forget(policy:files:password:calendar:dryRun:)``), then each removed
    /// backup's directory is deleted remotely, under the remote lock.
    public func forget(policy: BackupRetentionPolicy, files: ProtectedFileManager, password: String?,
                       calendar: Calendar = .current, dryRun: Bool = false) async throws -> ForgetReport {
        guard policy.keepsSomething else { throw BackupError.emptyRetentionPolicy }
        let lock = dryRun ? nil : try acquireLock(for: "forget")
        defer { lock.map(releaseLock) }
        var report = try await fetchForReading().forget(policy: policy, files: files, password: password, calendar: calendar, dryRun: true)
        if !dryRun { try removeBackups(report.removed.map(\.id)) }
        report.dryRun = dryRun
        return report
    }

    /// `forget` of backups by ID, whatever they are.
    public func forget(ids: [String], dryRun: Bool = false) throws -> ForgetReport {
        let lock = dryRun ? nil : try acquireLock(for: "forget")
        defer { lock.map(releaseLock) }
        var report = try fetchForReading().forget(ids: ids, dryRun: true)
        // A remote backup without its record is `ID` there, `ID.incomplete` in the mirror.
        if !dryRun { try removeBackups(report.removed.map { $0.id.hasSuffix(BackupRepository.incompleteSuffix) ? String($0.id.dropLast(BackupRepository.incompleteSuffix.count)) : $0.id }) }
        report.dryRun = dryRun
        return report
    }

    /// Deletes backups' directories, each authentication record first: a deletion cut short
    /// leaves a backup that lists as incomplete, never one that half restores.
    func removeBackups(_ ids: [String]) throws {
        do {
            for id in ids {
                try rclone.deleteFile("backups/\(id)/\(BackupAuthentication.fileName)")
                try rclone.purge("backups/\(id)")
            }
        } catch let failure as Rclone.Failure {
            throw failed(failure, "removing backups")
        }
    }

    /// `prune` on the remote repository, under the remote lock: every object no finished backup
    /// lists is deleted, and every backup without its authentication record (under the lock, no
    /// writer is sending one). A backup whose object list cannot be read stops it before anything
    /// is deleted.
    public func prune(dryRun: Bool = false) throws -> PruneReport {
        let lock = dryRun ? nil : try acquireLock(for: "prune")
        defer { lock.map(releaseLock) }
        let mirror = try fetchForReading()
        let objects: [String: (size: Int64, modified: Date?)]
        do { objects = try rclone.listFiles("objects") } catch let failure as Rclone.Failure {
            throw failed(failure, "listing the repository's objects")
        }
        var used = Set<String>()
        for backup in mirror.finishedBackups() {
            do { used.formUnion(try BackupRepository.objectList(of: backup)) } catch BackupError.badBackup(_, let reason) {
                throw BackupError.badBackup(path: remotePath(of: backup.path), reason: reason + "; nothing was pruned")
            }
        }
        var report = PruneReport(dryRun: dryRun)
        var unused: [String] = []
        for (path, item) in objects.sorted(by: { $0.key < $1.key }) {
            // Only `XX/SHA256` names are objects; anything else is left alone.
            let parts = path.split(separator: "/")
            guard parts.count == 2, BackupRepository.isObjectName(parts[1]), parts[1].hasPrefix(parts[0]) else { continue }
            if used.contains(String(parts[1])) {
                report.objectsKept += 1
                report.bytesKept += item.size
            } else {
                report.objectsRemoved += 1
                report.bytesRemoved += item.size
                unused.append(path)
            }
        }
        let incomplete = mirror.listBackups().filter { !$0.isComplete }.map(\.id)
        report.incompleteBackupsRemoved = incomplete.map { $0 + BackupRepository.incompleteSuffix }
        guard !dryRun else { return report }
        do {
            try rclone.deleteFiles(in: "objects", unused)
            for id in incomplete { try rclone.purge("backups/\(id)") }
        } catch let failure as Rclone.Failure {
            throw failed(failure, "pruning")
        }
        return report
    }
}
