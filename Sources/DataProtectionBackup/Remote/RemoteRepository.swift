import Crypto
import DataProtection
import DataProtectionSystem
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
/// try await remote.fetchObjects(of: latest)
/// ```
public struct RemoteRepository: Sendable {
    public let location: RemoteLocation
    let rclone: Rclone
    /// `ROOT/backup-remote/SHA256(identity)/`: this device's staging area and mirrors for it.
    let area: URL
    /// This run's own mirror (removed when the last copy of this value goes).
    private let mirrorDirectory: MirrorDirectory

    /// The data-root entry (registered: an erase removes it) holding staging areas and mirrors.
    static let areaDirectoryName = "backup-remote"

    public init(location: RemoteLocation, layout: DataRootLayout) throws {
        self.location = location
        rclone = try Rclone(location: location)
        _ = try? layout.register(Self.areaDirectoryName)
        // Keyed by what names the storage, not by how it is reached (key or known-hosts file).
        let name = Array(SHA256.hash(data: Data(location.identity.utf8))).hex
        area = URL(fileURLWithPath: layout.path(Self.areaDirectoryName)).appendingPathComponent(name)
        try FileManager.default.createDirectory(
            at: area, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        mirrorDirectory = try MirrorDirectory(in: area.appendingPathComponent("mirrors"))
    }

    /// Whether `name` has a backup ID's shape, `yyyyMMddTHHmmssZ-` and 7 or 8 hex digits: only
    /// such names under `backups/` are read, listed or ever deleted.
    public static func isBackupID<S: StringProtocol>(_ name: S) -> Bool {
        let bytes = Array(name.utf8)
        guard bytes.count == 24 || bytes.count == 25, bytes[8] == UInt8(ascii: "T"), bytes[15] == UInt8(ascii: "Z"),
            bytes[16] == UInt8(ascii: "-")
        else { return false }
        let digits = bytes[0..<8] + bytes[9..<15]
        return digits.allSatisfy { (0x30...0x39).contains($0) }
            && bytes[17...].allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// What a backup is written into before it is sent (a local repository).
    public var staging: BackupRepository { BackupRepository(url: area.appendingPathComponent("staging")) }
    /// What reading fetches into: a local repository of this run's own, removed with it (and,
    /// after a killed run, by the next one).
    public var mirror: BackupRepository { BackupRepository(url: mirrorDirectory.url) }

    /// Runs one step of rclone calls; their failures become ``BackupError/remoteFailed(_:reason:)``
    /// ("`doing` failed (rclone: …)"), a cancellation ``BackupError/remoteInterrupted(_:doing:)``.
    func rcloneStep<T>(_ doing: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let failure as Rclone.Failure {
            throw BackupError.remoteFailed(location.description, reason: "\(doing) failed (rclone: \(failure.message))")
        } catch is CancellationError {
            throw BackupError.remoteInterrupted(location.description, doing: doing)
        }
    }

    // MARK: - Backing up

    /// Runs `engine` into the staging area and sends the backup, with whatever earlier runs
    /// left staged. `engine.repository` is replaced by the staging area.
    /// - Throws: ``BackupError/remoteFailed(_:reason:)`` when the storage cannot be reached or a
    ///   transfer fails (what was stored stays staged and is sent by the next run);
    ///   ``BackupError/repositoryBusy(path:holder:)`` when another writer holds a lock.
    public func backUp(
        with engine: BackupEngine, log: (String) -> Void = { _ in },
        progress: (BackupProgress) -> Void = { _ in }
    ) async throws -> BackupSummary {
        var engine = engine
        engine.repository = staging
        if engine.dryRun {
            // Walk and log only: nothing is locked, listed or sent.
            return try await engine.run(log: log, progress: progress)
        }
        return try await withLock(for: "backup") { lock in
            // One listing of the remote's objects serves the whole run: under the lock no prune
            // removes any, and what this run sends is added to it.
            var present = try await remoteObjectNames()
            try await sendStaged(lock: lock, present: &present, log: log)
            engine.repository.objectsElsewhere = present
            let summary = try await engine.run(log: log, progress: progress)
            let sent = try await sendStaged(
                lock: lock, present: &present, log: log, keepingChunkLists: engine.chunkListsInIndex())
            // Sent, or the run failed: a backup of this run dropped as "not sent" is an error.
            guard sent.contains(summary.backup) else {
                throw BackupError.remoteFailed(
                    location.description,
                    reason: "backup \(summary.backup) was not sent (an object it uses is no longer there): run it again"
                )
            }
            return summary
        }
    }

    /// Sends every finished backup in the staging area, oldest first: its objects (each once: one
    /// already there with its size is not sent again), then its manifest, object list and backup
    /// keybag, then — the lock checked still ours — its authentication record; then removes it
    /// from the staging area. Staged objects are removed once sent, but chunk lists, which the
    /// next backup compares with: those of `keepingChunkLists` when given (the others go), all
    /// of them otherwise. `present` is what the remote holds, and gains what is sent.
    /// - Returns: the IDs of the backups sent.
    @discardableResult
    func sendStaged(
        lock: RemoteLock, present: inout Set<String>, log: (String) -> Void, keepingChunkLists: Set<String>? = nil,
        lockConfirmedWithin: Duration = RemoteRepository.refreshEvery
    ) async throws -> Set<String> {
        let staging = self.staging
        guard POSIXFile.kind(staging.backups.path).isDirectory else { return [] }
        let finished = staging.finishedBackups()
        // Chunk lists sent already are listed here, so that they are not looked up again.
        let sentListsFile = staging.url.appendingPathComponent(".sent-chunk-lists")
        var sentLists = Set(
            ((try? String(contentsOf: sentListsFile, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init))
        // A list sent once goes again if the remote no longer has it (emptied, or pruned by
        // another device): the backups that name it would be dropped otherwise.
        sentLists.formIntersection(present)
        let waiting = Self.stagedObjects(in: staging).filter { !sentLists.contains($0.name) }
        guard !finished.isEmpty || !waiting.isEmpty else { return [] }
        var sent = Set<String>()
        try await rcloneStep("sending the backup") {
            // A staged backup counts on objects it found on the remote when it ran; a prune
            // since (its run failed, the lock was let go) may have removed some. Such a backup is
            // never sent: its record would vouch for objects that are gone. The next backup
            // stores what is missing again (the index only trusts objects that are present).
            present.formUnion(waiting.map(\.name))
            var sending: [URL] = []
            for backup in finished {
                if let missing = ((try? BackupRepository.objectList(of: backup)) ?? []).first(where: {
                    !present.contains($0)
                }) {
                    try FileManager.default.removeItem(at: backup)
                    log(
                        "Not sent: backup \(backup.lastPathComponent): object \(missing.prefix(12))… it uses is no longer in \(location.description) (pruned since it was made); this backup stores it again"
                    )
                } else {
                    sending.append(backup)
                }
            }
            // One transfer: the objects and every backup's files but its record (none of them
            // makes anything read as complete) …
            var files = waiting.map { "objects/" + $0.path }
            for backup in sending {
                files += try POSIXFile.directoryEntries(backup.path).filter {
                    $0 != BackupAuthentication.fileName && !$0.hasPrefix(".")
                }
                .map { "backups/\(backup.lastPathComponent)/" + $0 }
            }
            try await rclone.upload(staging.url, to: "", files: files)
            // … then, the lock checked still ours, each record, oldest first.
            for backup in sending {
                let id = backup.lastPathComponent
                try await check(lock, confirmedWithin: lockConfirmedWithin)
                try await rclone.upload(
                    backup, to: "backups/\(id)", files: [BackupAuthentication.fileName], sizeOnly: false)
                try FileManager.default.removeItem(at: backup)
                sent.insert(id)
                log("Sent: backup \(id) to \(location.description)")
            }
        }
        // Sent: what stays is the chunk lists (small; the next backup of a big file reads its list).
        for object in waiting {
            let file = staging.objects.path + "/" + object.path
            let head = (try? POSIXFile.openRegularFile(file)).flatMap { fd in
                defer { try? fd.close() }
                return try? POSIXFile.read(fd, count: 8, at: 0, path: file)
            }
            if head == BackupChunkList.magic { sentLists.insert(object.name) } else { unlink(file) }
        }
        if let keep = keepingChunkLists {
            for name in sentLists.subtracting(keep) { unlink(staging.objectURL(name).path) }
            sentLists.formIntersection(keep)
        }
        try? Data(sentLists.sorted().map { $0 + "\n" }.joined().utf8).write(to: sentListsFile, options: .atomic)
        return sent
    }

    /// The objects in a staging area: `XX/NAME` paths and their names.
    static func stagedObjects(in staging: BackupRepository) -> [(path: String, name: String)] {
        var objects: [(path: String, name: String)] = []
        for directory in (try? POSIXFile.directoryEntries(staging.objects.path)) ?? [] where !directory.hasPrefix(".") {
            for name in (try? POSIXFile.directoryEntries(staging.objects.path + "/" + directory)) ?? []
            where BackupRepository.isObjectName(Substring(name)) {
                objects.append((directory + "/" + name, name))
            }
        }
        return objects
    }

    // MARK: - Reading

    /// Fetches the repository's backups (their small files, no objects) into this run's mirror
    /// and returns it as a local repository: a backup without its authentication record reads
    /// as incomplete there.
    public func fetchForReading() async throws -> BackupRepository {
        let mirror = self.mirror
        try? FileManager.default.removeItem(at: mirror.backups)
        try BackupRepository.makeOwnerOnlyDirectory(mirror.objects)
        try BackupRepository.makeOwnerOnlyDirectory(mirror.backups)
        try await rcloneStep("reading the repository's backups") {
            // Only directories named as backups are fetched: anything else under backups/ is not ours.
            let names = try await rclone.listDirectories("backups").filter { Self.isBackupID($0) }
            if !names.isEmpty {
                try await rclone.download("backups", to: mirror.backups, include: names.map { "/\($0)/**" })
            }
        }
        for name in try POSIXFile.directoryEntries(mirror.backups.path)
        where !name.hasPrefix(".") && !name.hasSuffix(BackupRepository.incompleteSuffix) {
            let directory = mirror.backups.appendingPathComponent(name)
            // Present means whole: a record cut short (a backend that writes in place) is missing.
            let record = POSIXFile.linkStatus(directory.appendingPathComponent(BackupAuthentication.fileName).path)
            if record.map({ Int($0.st_size) != BackupAuthentication.length }) ?? true {
                try POSIXFile.call("rename", directory.path) {
                    rename($0, directory.path + BackupRepository.incompleteSuffix)
                }
            }
        }
        return mirror
    }

    /// Fetches the objects a backup of the mirror lists (those the storage has; a missing one is
    /// named as damage by the restore or verification that follows).
    public func fetchObjects(of backup: URL) async throws {
        let names = (try? BackupRepository.objectList(of: backup)) ?? []
        try await rcloneStep("fetching the backup's objects") {
            try await rclone.download("objects", to: mirror.objects, files: names.map { "\($0.prefix(2))/\($0)" })
        }
    }

    /// Removes this run's mirror (after a restore or a verification): what was fetched goes.
    public func discardMirror() {
        mirrorDirectory.remove()
    }

    /// The names of the objects the remote holds (`objects/XX/NAME`).
    func remoteObjectNames() async throws -> Set<String> {
        try await rcloneStep("listing the repository's objects") {
            // Only `XX/SHA256` names of objects that are not empty (a cut upload may leave one).
            var names = Set<String>()
            for (path, size) in try await rclone.listFiles("objects") where size > 0 {
                let parts = path.split(separator: "/")
                if parts.count == 2, BackupRepository.isObjectName(parts[1]), parts[1].hasPrefix(parts[0]) {
                    names.insert(String(parts[1]))
                }
            }
            return names
        }
    }

    /// The remote path of a backup of the mirror, for messages and listings.
    public func remotePath(of local: String) -> String {
        local.hasPrefix(mirror.url.path) ? location.description + String(local.dropFirst(mirror.url.path.count)) : local
    }
}
