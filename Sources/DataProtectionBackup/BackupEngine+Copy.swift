import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// One file of a backup: left as the last backup has it, or read and stored now.
extension BackupEngine {
    /// What became of one file of the walk.
    enum FileCopy: Sendable {
        /// Unchanged since the latest backup, its object present: nothing read. `packs`: its
        /// chunk list's packs, when chunked.
        case unchanged(ManifestEntry, packs: [String]?)
        /// Read and stored now; `added` bytes are new in the repository.
        case stored(ManifestEntry, added: Int64, packs: [String]?)
        /// Looked at only (a dry run).
        case inspected(ManifestEntry)
        /// Removed, or replaced by something that is not a regular file, since the walk.
        case changed
    }

    /// How many files are read and stored at once: one per core (at most 4).
    static let copyWorkers = max(1, min(ProcessInfo.processInfo.activeProcessorCount, 4))
    /// How many files may wait, copied, behind one still being copied before no more is started.
    static let copyWindow = 64 * copyWorkers

    /// `entry` as the latest backup has it, when the file is unchanged since (same size and
    /// modification time) and what it needs is present (its object; a chunked file's list and
    /// packs: `list`); `nil` when it is to be read again.
    static func unchanged(
        _ entry: ManifestEntry, since old: ManifestEntry, list: BackupChunkList?,
        in repository: BackupRepository
    ) -> ManifestEntry? {
        guard old.size == entry.size, old.mtime == entry.mtime, let sha = old.sha256, repository.hasObject(sha),
            !old.chunked || list != nil
        else { return nil }
        var entry = entry
        entry.sha256 = sha
        entry.protectionClass = old.protectionClass
        entry.thisDeviceOnly = old.thisDeviceOnly
        entry.sealed = old.sealed
        entry.chunked = old.chunked
        entry.encryptedDatabase = old.encryptedDatabase
        return entry
    }

    /// Reads the file of `entry` and stores it — in chunks (``chunkingThreshold``), sealed
    /// (a plain file) or whole (a protected file) — comparing with `previous`, the chunk list of
    /// its earlier version. A dry run only looks at its class.
    func copy(_ entry: ManifestEntry, previous: BackupChunkList?) async throws -> FileCopy {
        var entry = entry
        let path = source.path + "/" + entry.path
        let url = URL(fileURLWithPath: path)
        if case .protected(let cls)? = try? ItemInspector.protection(ofItemAt: url) {
            entry.protectionClass = Int(cls.rawValue)
            entry.thisDeviceOnly = (try? ItemInspector.isThisDeviceOnly(url)) == true
        }
        guard !dryRun else { return .inspected(entry) }
        let stored: (sha256: String, size: Int64, added: Int64)
        var packs: [String]?
        do {
            if let chunked = try await storeInChunks(path, entry: &entry, previous: previous) {
                packs = chunked.packs
                stored = (chunked.list, chunked.size, chunked.bytesAdded)
            } else if entry.protectionClass == nil {
                let sealed = try await repository.storeSealed(path, files: files)
                stored = (sealed.sha256, sealed.size, sealed.size)
            } else {
                let whole = try repository.store(path, requireProtected: true)
                stored = (whole.sha256, whole.size, whole.size)
            }
        } catch let error as FileSystemError
            where error.operation == "open"
            && [.noSuchFileOrDirectory, .tooManySymbolicLinkLevels, .invalidArgument].contains(error.errno)
        {
            return .changed
        }
        entry.sealed = entry.protectionClass == nil && !entry.encryptedDatabase
        entry.sha256 = stored.sha256
        entry.size = stored.size   // what was captured, should the file have changed since lstat
        return .stored(entry, added: stored.added, packs: packs)
    }

    /// Stores a file that is kept as it is — a protected file, or an encrypted database the
    /// recognizer vouches for — in chunks cut where its format puts segments or pages (FORMAT.md
    /// §5.2), when it is big enough; `nil` when the file is to be stored otherwise (whole, or
    /// sealed). Marks `entry` chunked (and an encrypted database).
    private func storeInChunks(
        _ path: String, entry: inout ManifestEntry, previous: BackupChunkList?
    ) async throws -> BackupRepository.ChunkedFile? {
        guard entry.size >= Self.chunkingThreshold else { return nil }
        if entry.protectionClass != nil {
            let boundaries: (first: Int, stride: Int)?
            do { boundaries = try ItemInspector.segmentBoundaries(ofFileAt: path) } catch ProtectedFileError.noSuchFile(
                let missing)
            {
                throw FileSystemError("open", path: missing, errno: .noSuchFileOrDirectory)
            }
            // No longer a protected file (replaced since it was looked at): never stored as it is.
            guard let (first, stride) = boundaries else {
                throw FileSystemError("open", path: path, errno: .invalidArgument)
            }
            // Segments longer than a chunk may be (format 1 up to 16 MiB): the file is stored whole.
            guard max(first, stride) <= BackupChunkList.maximumChunkLength else { return nil }
            let stored = try repository.storeChunked(
                path, boundaries: ChunkBoundaries(first: first, stride: stride), previous: previous,
                requireProtected: true)
            entry.chunked = true
            return stored
        }
        guard let check = await encryptedDatabases?(URL(fileURLWithPath: path)) else { return nil }
        let pageSize = check.pageSize
        do {
            // Every page stored as it is must authenticate as ciphertext: one that does not (or a
            // file that is not a whole number of pages) makes it a plain file, sealed.
            let stored = try repository.storeChunked(
                path, boundaries: ChunkBoundaries(first: pageSize, stride: pageSize), previous: previous
            ) { page, index in
                page.count == pageSize && check.authenticates(page, index + 1)
            }
            entry.chunked = true
            entry.encryptedDatabase = true
            return stored
        } catch is BackupRepository.NotCiphertext {
            return nil
        }
    }

    /// The chunk list of an earlier version of a file, checked, when every pack it names is
    /// present; `nil` otherwise (the file is then stored anew).
    func previousChunkList(_ entry: ManifestEntry) -> BackupChunkList? {
        guard let sha = entry.sha256, let list = try? repository.chunkList(sha, size: entry.size),
            list.packs.allSatisfy(repository.hasObject)
        else { return nil }
        return list
    }

    /// Copies the walk's regular files into the repository — read, sealed and hashed on every
    /// core, taken in the walk's order (the log and the progress are as if copied one by one) —
    /// and leaves out those removed or replaced since the walk (``BackupSkipReason/changed``).
    /// What is stored is recorded on the device as it goes: an interrupted run's files are not
    /// copied again by the next one. Returns each chunked file's packs, by its list.
    func copyFiles(
        _ entries: inout [ManifestEntry], totalBytes: Int64, previous: [String: ManifestEntry],
        summary: inout BackupSummary,
        log: (String) -> Void, progress: (BackupProgress) -> Void
    ) async throws -> [String: [String]] {
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
                let reason = BackupSkipReason.changed
                log(reason.logLine(LosslessPath.display(source.path + "/" + entries[index].path)))
                reason.count(in: &summary)
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
                log(
                    "Backed up for this device only (not restorable on another device): \(LosslessPath.display(source.path + "/" + entry.path))"
                )
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
                        let old = previous[entry.path].flatMap { $0.kind == .file ? $0 : nil }
                        // An earlier chunked version's list (checked) whose packs are all present.
                        let oldList = old.flatMap { old in old.chunked ? previousChunkList(old) : nil }
                        waiting.append(index)
                        if let old, let unchanged = Self.unchanged(entry, since: old, list: oldList, in: repository) {
                            finished[index] = .unchanged(unchanged, packs: oldList?.packs)
                        } else {
                            // At most `copyWorkers` copies at once, and a bounded window behind a slow
                            // one: the progress moves and the partial index keeps up.
                            while running > 0, running >= Self.copyWorkers || waiting.count - next > Self.copyWindow,
                                let (index, copy) = try await group.next()
                            {
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
        return packsOfList
    }
}
