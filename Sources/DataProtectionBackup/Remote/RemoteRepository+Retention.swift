import DataProtection
import Foundation

extension RemoteRepository {
    /// `forget` on the remote repository: decided on the mirror exactly as a local repository's
    /// (``BackupRepository/forget(policy:files:password:calendar:dryRun:)``), then each removed
    /// backup's directory is deleted remotely, under the remote lock.
    public func forget(
        policy: BackupRetentionPolicy, files: ProtectedFileManager, password: String?,
        calendar: Calendar = .current, dryRun: Bool = false
    ) async throws -> ForgetReport {
        guard policy.keepsSomething else { throw BackupError.emptyRetentionPolicy }
        guard !dryRun else {
            return try await fetchForReading().forget(
                policy: policy, files: files, password: password, calendar: calendar, dryRun: true)
        }
        return try await withLock(for: "forget") { _ in
            var report = try await fetchForReading().forget(
                policy: policy, files: files, password: password, calendar: calendar, dryRun: true)
            try await removeBackups(report.removed.map(\.id))
            report.dryRun = false
            return report
        }
    }

    /// `forget` of backups by ID, whatever they are.
    public func forget(ids: [String], dryRun: Bool = false) async throws -> ForgetReport {
        guard !dryRun else { return try await fetchForReading().forget(ids: ids, dryRun: true) }
        return try await withLock(for: "forget") { _ in
            var report = try await fetchForReading().forget(ids: ids, dryRun: true)
            // A remote backup without its record is `ID` there, `ID.incomplete` in the mirror.
            try await removeBackups(
                report.removed.map {
                    $0.id.hasSuffix(BackupRepository.incompleteSuffix)
                        ? String($0.id.dropLast(BackupRepository.incompleteSuffix.count)) : $0.id
                })
            report.dryRun = false
            return report
        }
    }

    /// Deletes backups' directories, each authentication record first: a deletion cut short
    /// leaves a backup that lists as incomplete, never one that half restores.
    func removeBackups(_ ids: [String]) async throws {
        try await rcloneStep("removing backups") {
            for id in ids {
                try await rclone.deleteFile("backups/\(id)/\(BackupAuthentication.fileName)")
                try await rclone.purge("backups/\(id)")
            }
        }
    }

    /// `prune` on the remote repository, under the remote lock: every object no finished backup
    /// lists is deleted, and every backup without its authentication record (under the lock, no
    /// writer is sending one). A backup whose object list cannot be read stops it before anything
    /// is deleted.
    public func prune(dryRun: Bool = false) async throws -> PruneReport {
        guard !dryRun else { return try await pruneLocked(dryRun: true) }
        return try await withLock(for: "prune") { _ in try await pruneLocked(dryRun: false) }
    }

    private func pruneLocked(dryRun: Bool) async throws -> PruneReport {
        let mirror = try await fetchForReading()
        let objects = try await rcloneStep("listing the repository's objects") { try await rclone.listFiles("objects") }
        var used = Set<String>()
        for backup in mirror.finishedBackups() {
            do { used.formUnion(try BackupRepository.objectList(of: backup)) } catch BackupError.badBackup(
                _, let reason)
            {
                throw BackupError.badBackup(path: remotePath(of: backup.path), reason: reason + "; nothing was pruned")
            }
        }
        var report = PruneReport(dryRun: dryRun)
        var unused: [String] = []
        for (path, size) in objects.sorted(by: { $0.key < $1.key }) {
            // Only `XX/SHA256` names are objects; anything else is left alone.
            let parts = path.split(separator: "/")
            guard parts.count == 2, BackupRepository.isObjectName(parts[1]), parts[1].hasPrefix(parts[0]) else {
                continue
            }
            if used.contains(String(parts[1])) {
                report.objectsKept += 1
                report.bytesKept += size
            } else {
                report.objectsRemoved += 1
                report.bytesRemoved += size
                unused.append(path)
            }
        }
        let incomplete = mirror.listBackups().filter { !$0.isComplete }.map(\.id)
        report.incompleteBackupsRemoved = incomplete.map { $0 + BackupRepository.incompleteSuffix }
        guard !dryRun else { return report }
        try await rcloneStep("pruning") {
            try await rclone.deleteFiles(in: "objects", unused)
            for id in incomplete { try await rclone.purge("backups/\(id)") }
        }
        return report
    }
}
