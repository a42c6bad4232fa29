import Crypto
import DataProtection
import Foundation
import SystemPackage

/// A backup repository on storage rclone reaches (FORMAT.md §5.3): the same layout as a local
/// one, written so that nothing incomplete ever reads as complete.
///
/// A backup is made into this device's **staging area** for the location (a local repository in
/// the data root), then sent: the objects first, then the backup's files, its authentication
/// record last — a backup without its record lists as incomplete, whatever stopped it (a cut
/// connection, a killed process). What was staged and not sent goes up at the start of the next
/// run, and the engine's index keeps it from being read or copied again. Only ciphertext and
/// authenticated records ever leave the device. Reading (`restore`, `verify`, `backups`)
/// fetches what it needs into a local **mirror** and reads it as a local repository.
///
/// Writers hold a **lock file** in `locks/` (FORMAT.md §5.3), as restic does: a backup, forget
/// or prune finding another's fresh lock is refused as busy.
///
/// ```swift
/// let remote = try RemoteRepository(location: RemoteLocation("rclone:s3:bucket/backups"), layout: keybag.layout)
/// let summary = try await remote.backUp(with: BackupEngine(source: documents, repository: remote.staging, files: files))
/// let latest = try await remote.fetchForReading().latestAuthenticBackup(files: files, password: nil)
/// ```
public struct RemoteRepository: Sendable {
    public let location: RemoteLocation
    let rclone: Rclone
    /// `ROOT/backup-remote/SHA256(location)/`: this device's staging area and mirror for it.
    let area: URL

    /// The data-root entry (registered: an erase removes it) holding staging areas and mirrors.
    static let areaDirectoryName = "backup-remote"

    public init(location: RemoteLocation, layout: DataRootLayout) throws {
        self.location = location
        rclone = try Rclone(location: location)
        _ = try? layout.register(Self.areaDirectoryName)
        let name = Array(SHA256.hash(data: Data(location.rcloneTarget.utf8))).hex
        area = URL(fileURLWithPath: layout.path(Self.areaDirectoryName)).appendingPathComponent(name)
        try FileManager.default.createDirectory(at: area, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    /// Whether `name` has a backup ID's shape, `yyyyMMddTHHmmssZ-` and 7 or 8 hex digits: only
    /// such names under `backups/` are read, listed or ever deleted.
    public static func isBackupID<S: StringProtocol>(_ name: S) -> Bool {
        let bytes = Array(name.utf8)
        guard bytes.count == 24 || bytes.count == 25, bytes[8] == UInt8(ascii: "T"), bytes[15] == UInt8(ascii: "Z"),
              bytes[16] == UInt8(ascii: "-") else { return false }
        let digits = bytes[0..<8] + bytes[9..<15]
        return digits.allSatisfy { (0x30...0x39).contains($0) }
            && bytes[17...].allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// What a backup is written into before it is sent (a local repository).
    public var staging: BackupRepository { BackupRepository(url: area.appendingPathComponent("staging")) }
    /// What reading fetches into (a local repository, emptied of objects after each use).
    var mirror: BackupRepository { BackupRepository(url: area.appendingPathComponent("mirror")) }

    func failed(_ failure: Rclone.Failure, _ doing: String) -> BackupError {
        .remoteFailed(location.description, reason: "\(doing) failed (rclone: \(failure.message))")
    }

    // MARK: - Backing up

    /// Runs `engine` into the staging area and sends the backup, with whatever earlier runs
    /// left staged. `engine.repository` is replaced by the staging area.
    /// - Throws: ``BackupError/remoteFailed(_:reason:)`` when the storage cannot be reached or a
    ///   transfer fails (what was stored stays staged and is sent by the next run);
    ///   ``BackupError/repositoryBusy(path:holder:)`` when another writer holds a lock.
    public func backUp(with engine: BackupEngine, log: (String) -> Void = { _ in },
                       progress: (BackupProgress) -> Void = { _ in }) async throws -> BackupSummary {
        if engine.dryRun {
            // Walk and log only: nothing is locked, listed or sent.
            var engine = engine
            engine.repository = staging
            return try await engine.run(log: log, progress: progress)
        }
        let lock = try acquireLock(for: "backup")
        defer { releaseLock(lock) }
        try sendStaged(log: log)
        var staging = self.staging
        do {
            staging.objectsElsewhere = try remoteObjectNames()
        } catch let failure as Rclone.Failure {
            throw failed(failure, "listing the repository's objects")
        }
        var engine = engine
        engine.repository = staging
        let summary = try await engine.run(log: log, progress: progress)
        try sendStaged(log: log)
        return summary
    }

    /// Sends every finished backup in the staging area, oldest first: its objects (each once: one
    /// already there with its size is not sent again), then its manifest, object list and backup
    /// keybag, then its authentication record; then removes it from the staging area. Staged
    /// objects are removed once sent, but chunk lists, which the next backup compares with.
    func sendStaged(log: (String) -> Void) throws {
        let staging = self.staging
        guard POSIXFile.kind(staging.backups.path).isDirectory else { return }
        let finished = staging.finishedBackups()
        guard !finished.isEmpty || ((try? POSIXFile.directoryEntries(staging.objects.path)) ?? []).contains(where: { !$0.hasPrefix(".") }) else { return }
        do {
            try rclone.upload(staging.objects, to: "objects", exclude: [".*", "/.*/**"])
            // A staged backup counts on objects it found on the remote when it ran; a prune
            // since (its run failed, the lock was let go) may have removed some. Such a backup is
            // never sent: its record would vouch for objects that are gone. The next backup
            // stores what is missing again (the index only trusts objects that are present).
            let present = finished.isEmpty ? [] : try remoteObjectNames()
            for backup in finished {
                let id = backup.lastPathComponent
                if let missing = ((try? BackupRepository.objectList(of: backup)) ?? []).first(where: { !present.contains($0) }) {
                    try FileManager.default.removeItem(at: backup)
                    log("Not sent: backup \(id): object \(missing.prefix(12))… it uses is no longer in \(location.description) (pruned since it was made); this backup stores it again")
                    continue
                }
                let names = try POSIXFile.directoryEntries(backup.path).filter { $0 != BackupAuthentication.fileName && !$0.hasPrefix(".") }
                try rclone.upload(backup, to: "backups/\(id)", files: names, sizeOnly: false)
                try rclone.upload(backup, to: "backups/\(id)", files: [BackupAuthentication.fileName], sizeOnly: false)
                try FileManager.default.removeItem(at: backup)
                log("Sent: backup \(id) to \(location.description)")
            }
        } catch let failure as Rclone.Failure {
            throw failed(failure, "sending the backup")
        }
        // Sent: what stays is the chunk lists (small; the next backup of a big file reads its list).
        for directory in (try? POSIXFile.directoryEntries(staging.objects.path)) ?? [] where !directory.hasPrefix(".") {
            let path = staging.objects.path + "/" + directory
            for name in (try? POSIXFile.directoryEntries(path)) ?? [] {
                let file = path + "/" + name
                let head = (try? POSIXFile.openRegularFile(file)).flatMap { fd in
                    defer { try? fd.close() }
                    return try? POSIXFile.read(fd, count: 8, at: 0, path: file)
                }
                if head != BackupChunkList.magic { unlink(file) }
            }
        }
    }

    // MARK: - Reading

    /// Fetches the repository's backups (their small files, no objects) into the mirror and
    /// returns it as a local repository: a backup without its authentication record reads as
    /// incomplete there.
    public func fetchForReading() throws -> BackupRepository {
        let mirror = self.mirror
        try? FileManager.default.removeItem(at: mirror.backups)
        try FileManager.default.createDirectory(at: mirror.objects, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(at: mirror.backups, withIntermediateDirectories: true)
        do {
            // Only directories named as backups are fetched: anything else under backups/ is not ours.
            let names = try rclone.listDirectories("backups").filter { Self.isBackupID($0) }
            if !names.isEmpty { try rclone.download("backups", to: mirror.backups, include: names.map { "/\($0)/**" }) }
        } catch let failure as Rclone.Failure {
            throw failed(failure, "reading the repository's backups")
        }
        for name in try POSIXFile.directoryEntries(mirror.backups.path) where !name.hasPrefix(".") && !name.hasSuffix(BackupRepository.incompleteSuffix) {
            let directory = mirror.backups.appendingPathComponent(name)
            // Present means whole: a record cut short (a backend that writes in place) is missing.
            let record = POSIXFile.linkStatus(directory.appendingPathComponent(BackupAuthentication.fileName).path)
            if record.map({ Int($0.st_size) != BackupAuthentication.length }) ?? true {
                try POSIXFile.call("rename", directory.path) { rename($0, directory.path + BackupRepository.incompleteSuffix) }
            }
        }
        return mirror
    }

    /// Fetches the objects a backup of the mirror lists (those the storage has; a missing one is
    /// named as damage by the restore or verification that follows).
    public func fetchObjects(of backup: URL) throws {
        let names = (try? BackupRepository.objectList(of: backup)) ?? []
        do { try rclone.download("objects", to: mirror.objects, files: names.map { "\($0.prefix(2))/\($0)" }) } catch let failure as Rclone.Failure {
            throw failed(failure, "fetching the backup's objects")
        }
    }

    /// Empties the mirror's objects (after a restore or a verification).
    public func discardFetchedObjects() {
        try? FileManager.default.removeItem(at: mirror.objects)
    }

    /// The names of the objects the remote holds (`objects/XX/NAME`).
    func remoteObjectNames() throws -> Set<String> {
        Set(try rclone.listFiles("objects").keys.map { String($0.split(separator: "/").last ?? "") })
    }

    /// The remote path of a backup of the mirror, for messages and listings.
    public func remotePath(of local: String) -> String {
        local.hasPrefix(mirror.url.path) ? location.description + String(local.dropFirst(mirror.url.path.count)) : local
    }
}
