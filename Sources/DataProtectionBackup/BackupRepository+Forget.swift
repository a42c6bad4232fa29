import DataProtection
import DataProtectionSystem
import Foundation

/// What `forget` decided and did: the backups kept (with the rules that keep them), those
/// removed, and those it left alone because it could not authenticate them.
public struct ForgetReport: Sendable, Equatable, Codable {
    /// One backup `forget` kept or removed.
    public struct Item: Sendable, Equatable, Codable {
        public var id: String
        public var created: Date?
        /// The backed-up directory (backups are grouped by device and directory, as restic
        /// groups snapshots by host and paths); nil when IDs were given.
        public var source: String?
        /// The rules that keep it (`last`, `hourly`, `daily` …); empty for a removed backup.
        public var reasons: [String]
    }

    /// A finished backup `forget` neither kept nor removed: another device's, or one that does
    /// not authenticate. Only `dpctl forget REPO ID` removes it.
    public struct LeftAlone: Sendable, Equatable, Codable {
        public var id: String
        public var reason: String
    }

    public var kept: [Item] = []
    public var removed: [Item] = []
    public var leftAlone: [LeftAlone] = []
    /// Whether nothing was removed, only decided.
    public var dryRun: Bool
}

extension BackupRepository {
    /// Forgets the backups `policy` does not keep, as `restic forget` does: each group of
    /// backups — one device's backups of one directory — is decided on its own, newest first.
    /// Objects stay until ``prune(files:password:dryRun:)``.
    ///
    /// Only backups that authenticate count (this device's, or with `password` those of the
    /// device whose backup password it is): a planted backup can neither make `forget` keep it in
    /// the place of a real one nor be counted as one; it is left alone and reported. Reading each
    /// backup's directory needs its manifest, so the device must have been unlocked (class B).
    /// A removed backup is first renamed to a hidden name (it is gone from every listing at once),
    /// then deleted.
    public func forget(
        policy: BackupRetentionPolicy, files: ProtectedFileManager, password: String?,
        calendar: Calendar = .current, dryRun: Bool = false
    ) async throws -> ForgetReport {
        guard policy.keepsSomething else { throw BackupError.emptyRetentionPolicy }
        try requireRepository()
        // The writer lock, as restic's forget takes its exclusive lock: never beside a backup or a prune.
        let lock = dryRun ? nil : try lockForWriting()
        defer { lock?.release() }
        var report = ForgetReport(dryRun: dryRun)
        var groups: [String: [(id: String, created: Date, source: String)]] = [:]
        for backup in finishedBackups() {
            let engine = RestoreEngine(backup: backup)
            let authenticated: RestoreEngine.AuthenticatedBackup
            do {
                authenticated = try await engine.authenticate(files: files, password: password)
            } catch let error as BackupError {
                switch error {
                case .passwordNeeded:
                    report.leftAlone.append(
                        .init(
                            id: backup.lastPathComponent,
                            reason: "made by another device: give its backup password to decide on it"))
                    continue
                case .notAuthentic, .badBackup, .notABackup, .wrongBackupPassword:
                    report.leftAlone.append(.init(id: backup.lastPathComponent, reason: String(describing: error)))
                    continue
                default: throw error
                }
            }
            let source = try await engine.manifest(of: authenticated, files: files).meta("source") ?? ""
            let created = Self.creationDate(ofID: authenticated.id) ?? .distantPast
            // By the directory's bytes: two spellings of one name (NFC, NFD) are two directories.
            let key =
                authenticated.device.uuidString + "/"
                + LosslessPath.key(source).map { String(format: "%02x", $0) }.joined()
            groups[key, default: []].append((authenticated.id, created, source))
        }
        for key in groups.keys.sorted() {
            let members = groups[key]!   // oldest first, as the repository orders them
            let sources = Dictionary(uniqueKeysWithValues: members.map { ($0.id, $0.source) })
            for decision in policy.decide(members.map { ($0.id, $0.created) }, calendar: calendar) {
                let item = ForgetReport.Item(
                    id: decision.id, created: decision.created, source: sources[decision.id],
                    reasons: decision.reasons.map(\.rawValue))
                if decision.isKept { report.kept.append(item) } else { report.removed.append(item) }
            }
        }
        if !dryRun { try remove(report.removed.map(\.id)) }
        return report
    }

    /// Forgets the backups named (finished or incomplete), whatever they are — the way to remove
    /// a backup that does not authenticate.
    /// - Throws: ``BackupError/noSuchBackup(id:)`` for an ID the repository does not hold (nothing is removed).
    public func forget(ids: [String], dryRun: Bool = false) throws -> ForgetReport {
        try requireRepository()
        // Under the writer lock: a running backup's own `ID.incomplete` cannot be taken from under it.
        let lock = dryRun ? nil : try lockForWriting()
        defer { lock?.release() }
        let present = Set(backupNamesOldestFirst())
        var report = ForgetReport(dryRun: dryRun)
        for id in ids {
            let name = present.contains(id) ? id : id + Self.incompleteSuffix
            guard !id.isEmpty, !id.contains("/"), !id.hasPrefix("."), present.contains(name) else {
                throw BackupError.noSuchBackup(id: id)
            }
            report.removed.append(.init(id: name, created: Self.creationDate(ofID: id), source: nil, reasons: []))
        }
        if !dryRun { try remove(report.removed.map(\.id)) }
        return report
    }

    /// Removes backup directories: each renamed to `.forgotten-NAME` first (gone from every
    /// listing at once, and whole or absent should the deletion be interrupted), then deleted.
    func remove(_ names: [String]) throws {
        for name in names {
            let hidden = backups.appendingPathComponent(Self.forgottenPrefix + name)
            try POSIXFile.call("rename", backups.appendingPathComponent(name).path, hidden.path) { rename($0, $1) }
        }
        try POSIXFile.syncDirectory(backups.path)
        for name in names { try POSIXFile.removeTree(backups.appendingPathComponent(Self.forgottenPrefix + name).path) }
    }

    /// A forgotten backup's name until it is deleted (what an interrupted deletion leaves; prune removes it).
    static let forgottenPrefix = ".forgotten-"

    /// - Throws: ``BackupError/notARepository(path:)`` unless `url` holds `backups/` and `objects/`.
    func requireRepository() throws {
        guard Self.isRepository(url) else { throw BackupError.notARepository(path: url.path) }
    }
}
