import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// What a backup did.
public struct BackupSummary: Sendable, Equatable, Codable {
    public var backup: String = ""
    public var files = 0
    public var directories = 0
    public var symlinks = 0
    public var protectedFiles = 0
    /// Protected files bound to this device: they restore only here.
    public var thisDeviceOnlyFiles = 0
    /// Files whose content was copied into the repository (the rest were already there).
    public var filesCopied = 0
    public var bytesCopied: Int64 = 0
    public var skippedByAttribute = 0
    /// Items the engine's ``BackupExclusionPolicy`` excludes (for app containers: `Library/Caches`, `tmp`).
    public var skippedByPolicy = 0
    /// The repository itself, when it lies inside the backed-up directory (0 or 1).
    public var skippedRepository = 0
    /// A data root's own files (device secret, keybag, their locks: ``DataRootLayout/deviceFileNames``),
    /// never backed up whatever the source is.
    public var skippedDeviceFiles = 0
    /// Files removed, or replaced by something that is not a regular file, between the walk and their copy.
    public var skippedChanged = 0
    public var hasBackupKeybag = false
}

/// How far a backup or a restore is: items (files; for a restore, every entry) and bytes done,
/// out of totals known before the first byte is copied.
public struct BackupProgress: Sendable, Equatable {
    public var items: Int
    public var totalItems: Int
    public var bytes: Int64
    public var totalBytes: Int64

    public init(items: Int, totalItems: Int, bytes: Int64, totalBytes: Int64) {
        self.items = items
        self.totalItems = totalItems
        self.bytes = bytes
        self.totalBytes = totalBytes
    }
}

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

    public init(source: URL, repository: BackupRepository, files: ProtectedFileManager, dryRun: Bool = false,
                policy: BackupExclusionPolicy = .none, clock: any KeybagClock = SystemClock()) {
        self.source = source.standardizedFileURL
        self.repository = repository
        self.files = files
        self.dryRun = dryRun
        self.policy = policy
        self.clock = clock
    }

    /// Runs the backup. `log` receives MobileBackup-style lines; `progress` the files and bytes
    /// done so far, out of the totals the walk found before anything was copied.
    public func run(log: (String) -> Void = { _ in }, progress: (BackupProgress) -> Void = { _ in }) async throws -> BackupSummary {
        guard POSIXFile.kind(source.path).isDirectory else { throw BackupError.noSuchSource(path: source.path) }
        var summary = BackupSummary()
        // Incremental: an unchanged file (same size and modification time as in the latest
        // finished backup, object present) is not read again.
        // The last manifest is sealed in the repository; the device keeps its own plain copy
        // (in its data root) so that this works while locked.
        var previousByPath: [String: ManifestEntry] = [:]
        // The index of the last finished backup, then what an interrupted one stored since (newer).
        for url in [indexURL, partialIndexURL] {
            if let entries = try? BackupManifest.open(at: url).entries() {
                for entry in entries where entry.sha256.map(repository.hasObject) ?? true { previousByPath[entry.path] = entry }
            }
        }

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

        var entries: [ManifestEntry] = []
        var totalBytes: Int64 = 0
        // A repository inside the source is never backed up into itself (found by identity, not by name).
        let repositoryIdentity = POSIXFile.status(repository.url.path).map { ($0.st_dev, $0.st_ino) }
        if case .excludedByAncestor(let ancestor) = try BackupExclusionAttribute.exclusion(of: source) {
            log("Not backed up (attribute): \(source.path) (marked: \(ancestor.path))")
            summary.skippedByAttribute += 1
        } else {
            // The device's own data root, found by identity (any spelling of it); any other data root by its files.
            let deviceRoot = POSIXFile.status(files.keybag.root).map { ($0.st_dev, $0.st_ino) }
            var pending = [""]
            while let relative = pending.popLast() {
                let directory = relative.isEmpty ? source.path : source.path + "/" + relative
                // Names as bytes (readdir): none is skipped or merged, whatever its encoding.
                let names = try POSIXFile.directoryEntries(directory).sorted { LosslessPath.bytes(of: $0).lexicographicallyPrecedes(LosslessPath.bytes(of: $1)) }
                let isDataRoot = POSIXFile.status(directory).map { st in deviceRoot.map { $0 == (st.st_dev, st.st_ino) } == true } == true
                    || DataRootLayout.isDataRoot(directory)
                for name in names {
                    let rel = relative.isEmpty ? name : relative + "/" + name
                    let path = source.path + "/" + rel
                    let shown = LosslessPath.display(path)
                    if isDataRoot, DataRootLayout.deviceFileNames.contains(name) {
                        log("Not backed up (the device's own keys and keybag are never backed up): \(shown)")
                        summary.skippedDeviceFiles += 1
                        continue
                    }
                    if policy.excludes(rel) {
                        log("Not backed up (blacklist): \(shown)")   // MobileBackup's own words
                        summary.skippedByPolicy += 1
                        continue
                    }
                    guard let st = POSIXFile.linkStatus(path) else { continue }
                    let type = st.st_mode & S_IFMT
                    if type != S_IFLNK, (try? BackupExclusionAttribute.isExcluded(path)) == true {
                        log("Not backed up (attribute): \(shown)")
                        summary.skippedByAttribute += 1
                        continue
                    }
                    let mtime = Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9
                    var entry = ManifestEntry(path: rel, kind: .file, mode: Int(st.st_mode & 0o7777), mtime: mtime, size: Int64(st.st_size))
                    switch type {
                    case S_IFDIR where repositoryIdentity.map { $0 == (st.st_dev, st.st_ino) } == true:
                        log("Not backed up (the backup repository): \(shown)")
                        summary.skippedRepository += 1
                        continue
                    case S_IFDIR:
                        entry.kind = .directory
                        entry.size = 0
                        // Its default class is part of what it promises the files made in it later.
                        entry.defaultClass = try DirectoryDefault.get(path).map { Int($0.rawValue) }
                        summary.directories += 1
                        pending.append(rel)
                    case S_IFLNK:
                        entry.kind = .symlink
                        entry.size = 0
                        entry.linkTarget = try POSIXFile.linkTarget(path)
                        summary.symlinks += 1
                    case S_IFREG:
                        // Read and copied below, once the walk knows how much there is.
                        summary.files += 1
                        totalBytes += entry.size
                    default:
                        log("Not backed up (unsupported file type): \(shown)")
                        continue
                    }
                    entries.append(entry)
                }
            }
        }

        // The files, with progress out of known totals. A file removed or replaced by a link, a
        // FIFO or a device since the walk is left out (its name may now lead anywhere).
        var done = BackupProgress(items: 0, totalItems: summary.files, bytes: 0, totalBytes: totalBytes)
        var vanished = IndexSet()
        // What this run stores is recorded on the device as it goes (in batches): an interrupted
        // run's files are not copied again by the next one.
        let partial = dryRun ? nil : try? Self.openPartialIndex(at: partialIndexURL, layout: files.keybag.layout)
        // Each chunked file's packs, by its list (for the object list).
        var packsOfList: [String: [String]] = [:]
        var unrecorded: [ManifestEntry] = []
        func record(force: Bool) {
            guard let partial, !unrecorded.isEmpty, force || unrecorded.count >= 64 else { return }
            if (try? partial.upsert(unrecorded)) != nil { unrecorded.removeAll() }
        }
        /// Takes one file's outcome into the manifest, the summary, the log and the progress, in
        /// the walk's order.
        func take(_ index: Int, _ copy: FileCopy) {
            var entry: ManifestEntry
            switch copy {
            case .changed:
                log("Not backed up (changed during the backup): \(LosslessPath.display(source.path + "/" + entries[index].path))")
                summary.skippedChanged += 1
                summary.files -= 1
                vanished.insert(index)
                done.items += 1
                return
            case .unchanged(let unchanged, let packs):
                entry = unchanged
                if let packs { packsOfList[unchanged.sha256!] = packs }
            case .inspected(let inspected):
                entry = inspected
            case .stored(let stored, let added, let packs):
                entry = stored
                if let packs { packsOfList[stored.sha256!] = packs }
                summary.filesCopied += 1
                summary.bytesCopied += added
                log("Backed up: \(LosslessPath.display(source.path + "/" + entry.path))")
                unrecorded.append(entry)
                record(force: false)
            }
            if entry.protectionClass != nil { summary.protectedFiles += 1 }
            if entry.thisDeviceOnly {
                summary.thisDeviceOnlyFiles += 1
                log("Backed up for this device only (not restorable on another device): \(LosslessPath.display(source.path + "/" + entry.path))")
            }
            done.bytes += entries[index].size
            done.items += 1
            entries[index] = entry
            progress(done)
        }
        // Files are read, sealed and hashed on every core, and taken in the walk's order: the log
        // and the progress are as if copied one by one.
        do {
            try await withThrowingTaskGroup(of: (Int, FileCopy).self) { group in
                var waiting: [Int] = []   // in the walk's order, from `next`
                var next = 0
                var finished: [Int: FileCopy] = [:]
                var running = 0
                func takeFinished() throws {
                    while next < waiting.count, finished[waiting[next]] != nil {
                        try Task.checkCancellation()
                        take(waiting[next], finished.removeValue(forKey: waiting[next])!)
                        next += 1
                    }
                }
                do {
                    for index in entries.indices where entries[index].kind == .file {
                        try Task.checkCancellation()
                        let entry = entries[index]
                        let old = previousByPath[entry.path].flatMap { $0.kind == .file ? $0 : nil }
                        // An earlier chunked version's list (checked) whose packs are all present.
                        let oldList = old.flatMap { old in old.chunked ? previousChunkList(old) : nil }
                        waiting.append(index)
                        if let old, let unchanged = Self.unchanged(entry, since: old, list: oldList, in: repository) {
                            finished[index] = .unchanged(unchanged, packs: oldList?.packs)
                        } else {
                            // At most `copyWorkers` copies at once, and a bounded window behind a slow
                            // one: the progress moves and the partial index keeps up.
                            while running > 0, running >= Self.copyWorkers || waiting.count - next > Self.copyWindow,
                                  let (index, copy) = try await group.next() {
                                finished[index] = copy
                                running -= 1
                                try takeFinished()
                            }
                            group.addTask { (index, try await self.copy(entry, previous: oldList)) }
                            running += 1
                        }
                        try takeFinished()
                    }
                    while let (index, copy) = try await group.next() {
                        finished[index] = copy
                        try takeFinished()
                    }
                } catch {
                    // Whatever stops the run, the copies that finished (past a gap in the walk's
                    // order too) are taken — logged, counted, recorded: the next run does not make
                    // them again.
                    group.cancelAll()
                    while let result = await group.nextResult() {
                        if case .success(let (index, copy)) = result { finished[index] = copy }
                    }
                    for (index, copy) in finished.sorted(by: { $0.key < $1.key }) { take(index, copy) }
                    throw error
                }
            }
        } catch is CancellationError {
            record(force: true)
            throw BackupError.interrupted(stored: done.items, total: summary.files)
        } catch {
            record(force: true)
            throw error
        }
        record(force: true)
        entries = entries.enumerated().filter { !vanished.contains($0.offset) }.map(\.element)
        summary.backup = id
        guard !dryRun else { return summary }

        // The backup keybag travels with the backup, so another device can restore it.
        let backupKeybag = files.keybag.backupKeybagURL
        var backupKeybagBytes: [UInt8]?
        if POSIXFile.kind(backupKeybag.path).exists {
            let bytes = try POSIXFile.readAll(backupKeybag.path)
            try POSIXFile.writeAtomically(inProgress.appendingPathComponent(BackupKeybag.fileName).path, bytes, permissions: .ownerReadWrite)
            backupKeybagBytes = bytes
            summary.hasBackupKeybag = true
        } else {
            log("Note: no backup keybag (set a backup password): this backup restores on this device only")
        }
        // The manifest, sealed like a plain file (class B: possible while locked); the object
        // list, which reveals nothing, lets `verify` check the objects.
        var meta = ["source": source.path, "created": ISO8601DateFormatter().string(from: started), "id": id]
        if let rootDefault = try DirectoryDefault.get(source.path) { meta["defaultClass"] = "\(rootDefault.rawValue)" }
        let manifest = try BackupManifest.create(at: nil)
        try manifest.insert(entries, meta: meta)
        let manifestURL = inProgress.appendingPathComponent(BackupManifest.fileName)
        try await files.write(try manifest.serialized(), to: manifestURL, protection: .completeUnlessOpen, thisDeviceOnly: false)
        try POSIXFile.call("chmod", manifestURL.path) { chmod($0, 0o600) }   // the repository's files are its owner's only
        var used = Set(entries.compactMap(\.sha256))
        for entry in entries where entry.chunked {
            guard let list = entry.sha256, let packs = packsOfList[list] else {
                throw BackupError.badBackup(path: repository.url.path, reason: "the packs of \(LosslessPath.display(entry.path)) are not known")
            }
            used.formUnion(packs)
        }
        let objectList = Array(used.sorted().map { $0 + "\n" }.joined().utf8)
        try POSIXFile.writeAtomically(inProgress.appendingPathComponent(BackupRepository.objectListName).path, objectList, permissions: .ownerReadWrite)
        // Last, what makes it authentic: a MAC only this device (or the backup password) can make.
        let contents = BackupAuthentication.Contents(backupID: id, manifest: try POSIXFile.readAll(manifestURL.path),
                                                     objectList: objectList, backupKeybag: backupKeybagBytes)
        let authentication = BackupAuthentication(keybagID: files.keybag.id, contents: contents,
                                                  key: try await files.keybag.backupAuthenticationKey())
        try POSIXFile.writeAtomically(inProgress.appendingPathComponent(BackupAuthentication.fileName).path, authentication.encoded, permissions: .ownerReadWrite)
        try POSIXFile.syncDirectory(inProgress.path)
        let finished = repository.backups.appendingPathComponent(id)
        try POSIXFile.call("rename", inProgress.path, finished.path) { rename($0, $1) }
        try POSIXFile.syncDirectory(repository.backups.path)

        // The device's own copy for the next incremental run (a failure here only costs speed),
        // in a root entry an erase removes.
        _ = try? files.keybag.layout.register(Self.indexDirectoryName)
        try? FileManager.default.createDirectory(at: indexURL.deletingLastPathComponent(), withIntermediateDirectories: true,
                                                 attributes: [.posixPermissions: 0o700])
        let indexTemp = indexURL.deletingLastPathComponent().appendingPathComponent(".\(UUID().uuidString).tmp")
        if (try? BackupManifest.create(at: indexTemp).insert(entries, meta: meta)) != nil {
            _ = try? POSIXFile.call("rename", indexTemp.path, indexURL.path) { rename($0, $1) }
        }
        _ = try? POSIXFile.call("unlink", indexTemp.path) { unlink($0) }
        // The finished backup's index covers what the interrupted ones stored.
        Self.removeDatabase(at: partialIndexURL)
        return summary
    }

    /// The chunk lists the device's index (and an unfinished run's) names: those the next backup
    /// of a big file compares with.
    func chunkListsInIndex() -> Set<String> {
        var lists = Set<String>()
        for url in [indexURL, partialIndexURL] {
            for entry in (try? BackupManifest.open(at: url).entries()) ?? [] where entry.chunked { entry.sha256.map { _ = lists.insert($0) } }
        }
        return lists
    }

    /// `ROOT/backup-index/SHA256(repository path).partial.sqlite`: the files an unfinished
    /// backup into that repository stored (same schema as the index), removed once one finishes.
    var partialIndexURL: URL { indexURL.deletingPathExtension().appendingPathExtension("partial.sqlite") }

    /// Opens (or makes) the partial index, in the data root's registered index directory.
    static func openPartialIndex(at url: URL, layout: DataRootLayout) throws -> BackupManifest {
        _ = try? layout.register(indexDirectoryName)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        if let existing = try? BackupManifest.openForUpdate(at: url), existing.format == BackupManifest.formatVersion { return existing }
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
        return URL(fileURLWithPath: files.keybag.layout.path(Self.indexDirectoryName)).appendingPathComponent("\(name).sqlite")
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
