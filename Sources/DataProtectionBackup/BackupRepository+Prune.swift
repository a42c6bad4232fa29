import DataProtection
import DataProtectionSystem
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
    /// Interrupted backups (`ID.incomplete`), removed.
    public var incompleteBackupsRemoved: [String] = []
    /// What interrupted `forget`s left (`.forgotten-ID`), removed.
    public var forgottenBackupsRemoved: [String] = []
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
        // A dry run changes nothing, not even the lock file (a read-only repository can be asked).
        let lock = dryRun ? nil : try lockForWriting()
        defer { lock?.release() }
        var report = PruneReport(dryRun: dryRun)
        // Listed strictly: a listing that fails (EACCES, EIO, a stale NFS handle) must stop the
        // prune, never read as "no backups", which would make every object unused.
        let names = try Self.strictEntries(of: backups.path)
        var used = Set<String>()
        for name in names where !name.hasPrefix(".") && !name.hasSuffix(Self.incompleteSuffix) {
            do {
                used.formUnion(try Self.objectList(of: backups.appendingPathComponent(name)))
            } catch BackupError.badBackup(let path, let reason) {
                throw BackupError.badBackup(
                    path: path,
                    reason: reason + "; nothing was pruned: forget this backup by its ID if it is not one to keep")
            }
        }
        for name in names.sorted() where name.hasSuffix(Self.incompleteSuffix) || name.hasPrefix(Self.forgottenPrefix) {
            if name.hasPrefix(Self.forgottenPrefix) {
                report.forgottenBackupsRemoved.append(name)
            } else {
                report.incompleteBackupsRemoved.append(name)
            }
            // Descriptor-relative and never following a link: a planted link is removed, not what it points at.
            if !dryRun { try POSIXFile.removeTree(backups.appendingPathComponent(name).path) }
        }
        for prefix in try Self.strictEntries(of: objects.path).sorted() {
            // only object names (hex, checked below) are looked at inside
            guard prefix.utf8.count == 2 else { continue }
            try pruneObjects(in: prefix, used: used, dryRun: dryRun, report: &report)
        }
        if !dryRun { try POSIXFile.syncDirectory(backups.path) }
        return report
    }

    /// Prunes `objects/PREFIX`: opened without following a link (a planted `objects/ab -> elsewhere`
    /// is skipped, never emptied), its entries checked and removed relative to that descriptor,
    /// and only regular files named like objects.
    private func pruneObjects(in prefix: String, used: Set<String>, dryRun: Bool, report: inout PruneReport) throws {
        let path = objects.appendingPathComponent(prefix).path
        guard let st = POSIXFile.linkStatus(path), st.st_mode & S_IFMT == S_IFDIR else { return }
        let directory = try POSIXFile.open(path, .readOnly, options: [.directory, .noFollow])
        defer { try? directory.close() }
        for name in try Self.strictEntries(of: "/proc/self/fd/\(directory.rawValue)").sorted()
        where Self.isObjectName(Substring(name)) && name.hasPrefix(prefix) {
            var entry = stat()
            guard fstatat(directory.rawValue, name, &entry, AT_SYMLINK_NOFOLLOW) == 0, entry.st_mode & S_IFMT == S_IFREG
            else { continue }
            if used.contains(name) {
                report.objectsKept += 1
                report.bytesKept += Int64(entry.st_size)
                continue
            }
            report.objectsRemoved += 1
            report.bytesRemoved += Int64(entry.st_size)
            if !dryRun { try POSIXFile.check("unlink", path + "/" + name) { unlinkat(directory.rawValue, name, 0) } }
        }
    }

    /// A directory's entries, every failure thrown.
    static func strictEntries(of path: String) throws -> [String] {
        do { return try POSIXFile.directoryEntries(path) } catch {
            throw BackupError.badBackup(path: path, reason: "it cannot be listed (\(error)); nothing more was pruned")
        }
    }

    /// 64 lowercase hex digits: an object's name, and a line of an object list.
    /// The objects `backup` lists (its `objects.list`): a regular file of whole lines, each an
    /// object name.
    /// - Throws: ``BackupError/badBackup(path:reason:)`` when it cannot be read or is malformed.
    static func objectList(of backup: URL) throws -> [String] {
        let list: [UInt8]
        do {
            list = try POSIXFile.readRegularFile(
                backup.appendingPathComponent(objectListName).path, maxSize: RestoreEngine.objectListLimit)
        } catch {
            throw BackupError.badBackup(path: backup.path, reason: "its object list cannot be read (\(error))")
        }
        let lines = String(decoding: list, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
            .dropLast()
        guard list.last == UInt8(ascii: "\n") || list.isEmpty, lines.allSatisfy(isObjectName) else {
            throw BackupError.badBackup(path: backup.path, reason: "its object list is malformed")
        }
        return lines.map(String.init)
    }

    static func isObjectName(_ text: Substring) -> Bool {
        text.utf8.count == 64 && text.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }
}
