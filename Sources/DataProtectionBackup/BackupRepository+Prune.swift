import DataProtection
import Foundation
import SystemPackage

/// What `prune` removed and kept.
public struct PruneReport: Sendable, Equatable, Codable {
    /// Objects no finished backup uses, removed (or, in a dry run, that would be).
    public var objectsRemoved = 0
    public var bytesRemoved: Int64 = 0
    /// Objects some finished backup uses.
    public var objectsKept = 0
    public var bytesKept: Int64 = 0
    /// Interrupted backups (`ID.incomplete`) and the remains of interrupted `forget`s, removed.
    public var incompleteBackupsRemoved: [String] = []
    public var dryRun: Bool
}

extension BackupRepository {
    /// Removes every object that no finished backup uses, and every interrupted backup, as
    /// `restic prune` does after `forget`.
    ///
    /// **Locking.** Prune holds the repository's writer lock (`DEST/lock`, the one every backup
    /// holds for its whole run) for its whole run: a backup and a prune never overlap — the one
    /// that comes second is refused at once as busy (exit 75), naming the holder, and nothing is
    /// changed. So no object a running backup has stored, or found already stored and counts on,
    /// can be removed under it; and an `ID.incomplete` seen under the lock is one no process is
    /// writing. (restic does the same with its exclusive lock; our lock is a `flock`, which the
    /// kernel drops with a killed process, so a stale lock never blocks anyone.) Restores and
    /// verifications take no lock: one of a backup forgotten meanwhile fails on a missing
    /// object, as it should.
    ///
    /// The objects kept are those listed by every finished backup — whether or not it
    /// authenticates for this device (another device's backups keep theirs) — and a backup whose
    /// object list cannot be read stops the prune before anything is removed: it could need any
    /// object. Names in `objects/` that are not objects are left alone.
    public func prune(dryRun: Bool = false) throws -> PruneReport {
        try requireRepository()
        let lock = try lockForWriting()
        defer { lock.release() }
        var report = PruneReport(dryRun: dryRun)
        var used = Set<String>()
        for backup in finishedBackups() {
            let path = backup.appendingPathComponent(Self.objectListName).path
            let list: [UInt8]
            do { list = try POSIXFile.readRegularFile(path, maxSize: RestoreEngine.objectListLimit) } catch {
                throw BackupError.badBackup(path: backup.path, reason: "its object list cannot be read (\(error)); nothing was pruned: "
                                            + "forget this backup by its ID if it is not one to keep")
            }
            let lines = String(decoding: list, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).dropLast()
            guard list.last == UInt8(ascii: "\n") || list.isEmpty, lines.allSatisfy(Self.isObjectName) else {
                throw BackupError.badBackup(path: backup.path, reason: "its object list is malformed; nothing was pruned: "
                                            + "forget this backup by its ID if it is not one to keep")
            }
            used.formUnion(lines.map(String.init))
        }
        for name in (try? POSIXFile.directoryEntries(backups.path)) ?? []
        where name.hasSuffix(Self.incompleteSuffix) || name.hasPrefix(Self.forgottenPrefix) {
            report.incompleteBackupsRemoved.append(name)
            if !dryRun { try FileManager.default.removeItem(at: backups.appendingPathComponent(name)) }
        }
        report.incompleteBackupsRemoved.sort()
        for prefix in ((try? POSIXFile.directoryEntries(objects.path)) ?? []).sorted() {
            let directory = objects.appendingPathComponent(prefix).path
            guard prefix.utf8.count == 2, POSIXFile.kind(directory).isDirectory else { continue }
            for name in ((try? POSIXFile.directoryEntries(directory)) ?? []).sorted() where Self.isObjectName(Substring(name)) && name.hasPrefix(prefix) {
                guard let st = POSIXFile.linkStatus(directory + "/" + name) else { continue }
                if used.contains(name) {
                    report.objectsKept += 1
                    report.bytesKept += Int64(st.st_size)
                    continue
                }
                report.objectsRemoved += 1
                report.bytesRemoved += Int64(st.st_size)
                if !dryRun { try POSIXFile.call("unlink", directory + "/" + name) { unlink($0) } }
            }
        }
        if !dryRun { try POSIXFile.syncDirectory(backups.path) }
        return report
    }

    /// 64 lowercase hex digits: an object's name, and a line of an object list.
    static func isObjectName(_ text: Substring) -> Bool {
        text.utf8.count == 64 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}
