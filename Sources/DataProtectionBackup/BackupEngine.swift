import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Backs up a directory into a ``BackupRepository``, the way iOS's MobileBackup treats an app
/// container: items excluded from backup — by their own attribute, or by the caller's
/// ``BackupExclusionPolicy`` (an app container's `Library/Caches` and `tmp`) — are skipped and
/// logged in MobileBackup's words; protected files are copied as ciphertext — nothing is
/// decrypted, so it works while the device is locked. Plain files are sealed on the way in as
/// class-B protected objects (class B wraps with the public key alone, so this too works while
/// locked): nothing in a backup is readable without this device's keys or the backup password.
///
/// ```swift
/// let files = ProtectedFileManager(keybag: keybag)
/// let summary = try await BackupEngine(source: container, repository: BackupRepository(url: dest), files: files)
///     .run { line in print(line) }        // "Not backed up (attribute): …"
/// ```
public struct BackupEngine: Sendable {

    public var source: URL
    public var repository: BackupRepository
    /// The device: seals plain files, and its `backup-keybag` is copied into the backup.
    public var files: ProtectedFileManager
    /// Walk and log only; write nothing.
    public var dryRun = false
    /// What is excluded from backup besides items carrying the exclusion attribute.
    public var policy: BackupExclusionPolicy
    /// The clock a backup's time (its ID, and the manifest's `created`) is read from.
    public var clock: any KeybagClock
    /// Recognizes encrypted databases, stored as they are (in chunks) instead of sealed whole;
    /// `nil`: every plain file is sealed.
    public var encryptedDatabases: EncryptedDatabaseRecognizer?
    /// Files of at least this many bytes, stored as they are (protected files, encrypted
    /// databases), are stored in chunks (FORMAT.md §5.2): 1 MiB.
    public static let chunkingThreshold: Int64 = 1 << 20

    public init(
        source: URL, repository: BackupRepository, files: ProtectedFileManager, dryRun: Bool = false,
        policy: BackupExclusionPolicy = .none, clock: any KeybagClock = SystemClock()
    ) {
        self.source = source.standardizedFileURL
        self.repository = repository
        self.files = files
        self.dryRun = dryRun
        self.policy = policy
        self.clock = clock
    }

    /// Runs the backup: the walk decides what is backed up (``walk(into:log:)``, each item left
    /// out for a ``BackupSkipReason``), the files are copied
    /// (``copyFiles(_:totalBytes:previous:summary:log:progress:)``),
    /// and the backup is sealed (``seal(_:packsOfList:id:started:into:summary:log:)``). `log`
    /// receives MobileBackup-style lines; `progress` the files and bytes done so far, out of the
    /// totals the walk found before anything was copied.
    public func run(
        log: (String) -> Void = { _ in }, progress: (BackupProgress) -> Void = { _ in }
    ) async throws -> BackupSummary {
        guard POSIXFile.kind(source.path).isDirectory else { throw BackupError.noSuchSource(path: source.path) }
        var summary = BackupSummary()
        let previous = previousEntries()
        let started = clock.now()
        let id = Self.makeID(at: started)
        let inProgress = repository.backups.appendingPathComponent(id + BackupRepository.incompleteSuffix)
        // One backup at a time per repository; leftovers of killed runs are removed under the lock.
        try repository.requireUsableAsDestination()
        let repositoryLock = dryRun ? nil : try repository.lockForWriting()
        defer { repositoryLock?.release() }
        if !dryRun {
            try POSIXFile.call("mkdir", inProgress.path) { mkdir($0, 0o700) }
        }

        var (entries, totalBytes) = try walk(into: &summary, log: log)

        let packsOfList = try await copyFiles(
            &entries, totalBytes: totalBytes, previous: previous, summary: &summary,
            log: log, progress: progress)
        summary.backup = id
        guard !dryRun else { return summary }

        try await seal(
            entries, packsOfList: packsOfList, id: id, started: started, into: inProgress, summary: &summary, log: log)
        return summary
    }

    /// Incremental: an unchanged file (same size and modification time as in the latest
    /// finished backup, object present) is not read again. The last manifest is sealed in the
    /// repository; the device keeps its own plain copy (in its data root) so that this works
    /// while locked: the index of the last finished backup, then what an interrupted one stored
    /// since (newer), by path.
    func previousEntries() -> [String: ManifestEntry] {
        var previous: [String: ManifestEntry] = [:]
        for url in [indexURL, partialIndexURL] {
            if let entries = try? BackupManifest.open(at: url).entries() {
                for entry in entries where entry.sha256.map(repository.hasObject) ?? true {
                    previous[entry.path] = entry
                }
            }
        }
        return previous
    }

    /// The chunk lists the device's index (and an unfinished run's) names: those the next backup
    /// of a big file compares with.
    func chunkListsInIndex() -> Set<String> {
        var lists = Set<String>()
        for url in [indexURL, partialIndexURL] {
            for entry in (try? BackupManifest.open(at: url).entries()) ?? [] where entry.chunked {
                entry.sha256.map { _ = lists.insert($0) }
            }
        }
        return lists
    }

    /// `ROOT/backup-index/SHA256(repository path).partial.sqlite`: the files an unfinished
    /// backup into that repository stored (same schema as the index), removed once one finishes.
    var partialIndexURL: URL { indexURL.deletingPathExtension().appendingPathExtension("partial.sqlite") }

    /// Opens (or makes) the partial index, in the data root's registered index directory.
    static func openPartialIndex(at url: URL, layout: DataRootLayout) throws -> BackupManifest {
        _ = try? layout.register(indexDirectoryName)
        try FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        if let existing = try? BackupManifest.openForUpdate(at: url), existing.format == BackupManifest.formatVersion {
            return existing
        }
        removeDatabase(at: url)   // unreadable: started again
        return try BackupManifest.create(at: url)
    }

    /// Removes an SQLite database and the files SQLite keeps beside it.
    static func removeDatabase(at url: URL) {
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(url.path + suffix) }
    }

    /// The data-root entry (registered, so an erase removes it) holding the incremental indexes.
    static let indexDirectoryName = "backup-index"

    /// `ROOT/backup-index/SHA256(repository path).sqlite`: the device's plain copy of the last
    /// manifest it wrote to that repository.
    var indexURL: URL {
        let name = Array(SHA256.hash(data: Data(repository.url.path.utf8))).hex
        return URL(fileURLWithPath: files.keybag.layout.path(Self.indexDirectoryName)).appendingPathComponent(
            "\(name).sqlite")
    }

    static func makeID(at date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = idDateFormat
        return formatter.string(from: date) + "-" + String(format: "%08x", UInt32.random(in: 0...UInt32.max))
    }

    /// How a backup ID starts: the UTC time it was made, to the second.
    static let idDateFormat = "yyyyMMdd'T'HHmmss'Z'"
}
