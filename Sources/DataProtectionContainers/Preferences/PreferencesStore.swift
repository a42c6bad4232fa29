import DataProtectionSystem
import DataProtection
import DataProtectionKeybag
import Foundation
import Logging
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// The machinery behind ``ProtectedUserDefaults``: the values in memory, a worker thread that
/// merges pending changes into the file key by key under `flock`, and a watcher (inotify on the
/// directory) that has the worker read back what other processes wrote.
///
/// Durability is deferred, as `cfprefsd` defers it on iOS: a write is whole and visible to every
/// process when ``synchronize()`` returns, and flushed to the disk within ``flushDelay`` (at once
/// when the store stops or the process exits). Until then the last flushed version is kept
/// beside the plist (`.ID.plist.durable`, a second link to it made before the first unflushed
/// write replaces it), and a plist a power cut left unreadable is restored from it (FORMAT.md §10.4).
/// `@unchecked Sendable`: every mutable field is read and written only under `condition` (callers, the worker and the watcher all take it); the file's work runs on the worker thread alone.
final class PreferencesStore: @unchecked Sendable {
    enum Change { case set(Any), remove }

    let url: URL?
    let files: ProtectedFileManager?
    /// The property list's path, its directory's, its lock file's and its last flushed
    /// version's (worked out once: each write needs them).
    private let path: String, directory: String, lockPath: String, durablePath: String
    /// How long a write may stay unflushed (1 s; tests lengthen it to see the flush at stop).
    let flushDelay: TimeInterval
    /// How long finishing (``finish(until:)``) may wait for a running round or for the
    /// file's lock: rounds take milliseconds, a flush on a busy disk may take a few seconds (5 s;
    /// tests shorten it).
    let finishingTimeLimit: TimeInterval
    let logger = Logger(label: "preferences")
    weak var owner: ProtectedUserDefaults?

    // Everything below is guarded by `condition`.
    private let condition = NSCondition()
    private var stored: [String: Any] = [:]
    private var registered: [String: Any] = [:]
    private var pending: [String: Change] = [:]
    private var requested = 0      // work requests (syncs, file events, sets once due)
    private var completed = 0      // requests the worker has finished
    private var lastOK = true
    private var lastError: (any Error)?
    private var stopped = false
    /// The file as last read or written, held open (``PinnedFile``).
    private var knownFile: PinnedFile?
    /// The values in the file as last read or written (``knownFile``'s): a write that finds the
    /// file unchanged since needs not read it again.
    private var knownValues: [String: Any]?
    /// The plist as this process last wrote it unflushed, while the version it kept is there:
    /// its next write may replace it unflushed too. Any other plist beside a kept version (another
    /// process wrote it, or a run that ended before flushing) is flushed before it is replaced.
    private var ownUnflushedFile: PinnedFile?
    private var streams: [UUID: AsyncStream<Void>.Continuation] = [:]
    private var wake: [Int32] = [-1, -1]
    /// A round (a merge, or a flush) is running, on the worker or on a thread in ``synchronize()``.
    private var busy = false
    private var worker: Thread?
    /// When the writes not yet flushed must be (`nil`: none).
    private var flushDue: Date?
    /// When the worker writes what was set (`nil`: nothing waits for it). A set is written
    /// ``writeDelay`` later, not at once: a `synchronize()` meanwhile writes it on its own thread
    /// (no hand-over to the worker and back), and sets in a row are written once.
    private var writeDue: Date?
    /// Until when the worker waits, when it waits for a time (`nil`: until woken): a set due
    /// later needs not wake it.
    private var workerWaitsUntil: Date?
    /// Whether the file system can give the plist a second name (`link(2)`): where it cannot,
    /// every write is flushed before ``synchronize()`` returns. Used by rounds only (one at a time).
    private var canDeferFlush = true
    /// Whether ``finish(until:)`` ran (what is left after it is the worker's).
    private var finished = false
    /// Whether this store's first round removed what killed writers left (``removeLeftovers()``).
    /// Used by rounds only.
    private var leftoversRemoved = false

    init(url: URL?, files: ProtectedFileManager?, flushDelay: TimeInterval = 1, finishingTimeLimit: TimeInterval = 5) {
        self.url = url
        self.files = files
        self.flushDelay = flushDelay
        self.finishingTimeLimit = finishingTimeLimit
        path = url?.path ?? ""
        directory = url?.deletingLastPathComponent().path ?? ""
        lockPath = url.map { $0.deletingLastPathComponent().appendingPathComponent(Self.lockFileName(forPlistNamed: $0.lastPathComponent)).path } ?? ""
        durablePath = url.map { $0.deletingLastPathComponent().appendingPathComponent(Self.durableCopyName(forPlistNamed: $0.lastPathComponent)).path } ?? ""
    }

    /// Loads the file, then starts the worker and the watcher.
    func start() {
        guard url != nil else { return }
        if let ends = try? SystemCall.pipe2CloseOnExec() { wake = [ends.read, ends.write] }
        let worker = Thread { [self] in work() }
        worker.name = "preferences"
        condition.lock(); self.worker = worker; condition.unlock()
        worker.start()
        Self.flushedAtExit.add(self)
        let watcher = Thread { [self] in watch() }
        watcher.name = "preferences watcher"
        watcher.start()
        _ = synchronize()
    }

    deinit {
        for fd in wake where fd >= 0 { close(fd) }
    }

    // MARK: - Values

    func value(forKey key: String) -> Any? {
        condition.lock(); defer { condition.unlock() }
        return stored[key] ?? registered[key]
    }

    func snapshot() -> [String: Any] {
        condition.lock(); defer { condition.unlock() }
        return registered.merging(stored) { $1 }
    }

    func register(_ defaults: [String: Any]) {
        condition.lock(); defer { condition.unlock() }
        registered.merge(defaults) { $1 }
    }

    func set(_ value: Any?, forKey key: String) {
        condition.lock()
        if let value { stored[key] = value; pending[key] = .set(value) } else { stored[key] = nil; pending[key] = .remove }
        // A write already due is left as it is — unless it lies further ahead than a write is
        // ever put off (the clock was set back): then it is due again from now.
        let now = Date()
        if writeDue.map({ $0.timeIntervalSince(now) > Self.writeDelay }) ?? true {
            let due = now.addingTimeInterval(Self.writeDelay)
            writeDue = due
            if workerWaitsUntil.map({ $0 > due }) ?? true { condition.broadcast() }
        }
        condition.unlock()
        announce()
    }

    /// Waits until everything asked so far is written and the file read back.
    func synchronize() -> Bool { (try? synchronizeOrThrow()) != nil }

    /// ``synchronize()``, throwing why it failed.
    func synchronizeOrThrow() throws {
        guard url != nil else { return }
        condition.lock(); defer { condition.unlock() }
        requested += 1
        let ticket = requested
        condition.broadcast()
        while completed < ticket && !stopped {
            // No round running: this thread runs it (no hand-over to the worker and back).
            if busy { condition.wait() } else { performRound() }
        }
        if !lastOK { throw lastError ?? ContainerError.launchFailed("preferences could not be written") }
    }

    func changes() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let token = UUID()
        condition.lock(); streams[token] = continuation; condition.unlock()
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            self.condition.lock(); self.streams[token] = nil; self.condition.unlock()
        }
        return stream
    }

    private func announce() {
        condition.lock(); let continuations = Array(streams.values); condition.unlock()
        for continuation in continuations { continuation.yield() }
        if let owner { NotificationCenter.default.post(name: ProtectedUserDefaults.didChangeNotification, object: owner) }
    }

    // MARK: - The worker

    /// How long after a set the worker writes it, unless a `synchronize()` did (``writeDue``).
    static let writeDelay: TimeInterval = 0.005

    private func work() {
        condition.lock()
        while !stopped {
            let now = Date()
            if busy {
                condition.wait()
            } else if completed < requested {
                performRound()
            } else if let due = writeDue, due <= now || due.timeIntervalSince(now) > Self.writeDelay {   // (or the clock was set back)
                requested += 1
                performRound()
            } else if let due = flushDue, due <= now {
                busy = true
                flushDue = nil
                condition.unlock()
                let flushed = flush()
                condition.lock()
                // Not flushed (no lock, an I/O error): tried again later, not forgotten.
                if !flushed, flushDue == nil { flushDue = Date(timeIntervalSinceNow: flushDelay) }
                busy = false
                condition.broadcast()
            } else if let due = [writeDue, flushDue].compactMap({ $0 }).min() {
                workerWaitsUntil = due
                _ = condition.wait(until: due)
                workerWaitsUntil = nil
            } else {
                condition.wait()
            }
        }
        // Stopped: what was set and not written, and the flush, are done by ``finish(until:)``
        // — or here, after it, when a round ran longer than finishing waits (the file's lock
        // held elsewhere): as soon as it ends, however long that takes (unless the process exits
        // first).
        while busy || !finished { condition.wait() }
        if !pending.isEmpty { performRound() }
        let unflushed = flushDue != nil
        flushDue = nil
        condition.unlock()
        if unflushed { _ = flush() }
    }

    /// One merge of what is pending with the file: called and returns with `condition` locked.
    /// The file's lock is waited for until `lockDeadline` at most, when there is one (finishing,
    /// so that a process holding it — another app of a shared App Group — cannot hold this one up).
    private func performRound(lockDeadline: Date? = nil) {
        busy = true
        let ticket = requested
        let changes = pending
        pending = [:]
        writeDue = nil
        let known = knownFile.map { (file: $0, values: knownValues ?? [:]) }
        let ownUnflushed = ownUnflushedFile
        condition.unlock()

        let outcome = merge(changes, known: known, ownUnflushed: ownUnflushed, lockDeadline: lockDeadline)

        condition.lock()
        var changedElsewhere = false
        if let values = outcome.values {
            // What others wrote, with what this process set since (still pending) on top.
            var view = values
            for (key, change) in pending {
                switch change { case .set(let value): view[key] = value; case .remove: view[key] = nil }
            }
            changedElsewhere = !NSDictionary(dictionary: stored).isEqual(to: view)
            stored = view
            knownFile = outcome.identity
            knownValues = outcome.identity == nil ? nil : values
        }
        if outcome.wrote { ownUnflushedFile = outcome.unflushed ? outcome.identity : nil }
        if !outcome.ok {
            // Not written (a locked class, a full disk): kept for the next attempt, unless
            // set again since.
            for (key, change) in changes where pending[key] == nil { pending[key] = change }
        }
        if outcome.flushSoon, flushDue == nil { flushDue = Date(timeIntervalSinceNow: flushDelay) }
        lastOK = outcome.ok
        lastError = outcome.error
        completed = ticket
        busy = false
        condition.broadcast()
        if changedElsewhere {
            condition.unlock()
            announce()
            condition.lock()
        }
    }

    /// The empty file beside a plist (`.ID.plist.lock`) that writers `flock`: coordination, not data.
    static func lockFileName(forPlistNamed name: String) -> String { "." + name + ".lock" }

    /// Whether `name` is such a lock file's name.
    static func isLockFileName(_ name: String) -> Bool { name.hasPrefix(".") && name.hasSuffix(".plist.lock") }

    /// The plist's last flushed version, kept beside it while newer writes are not yet flushed
    /// (`.ID.plist.durable`): a protected file of the plist's class, as the plist itself was.
    static func durableCopyName(forPlistNamed name: String) -> String { "." + name + ".durable" }

    /// What one merge did.
    struct MergeOutcome {
        /// The values now in the file (`nil` when they could not be read).
        var values: [String: Any]?
        var identity: PinnedFile?
        var ok = true
        var error: (any Error)?
        /// Whether this merge wrote the file, and whether without a flush.
        var wrote = false, unflushed = false
        /// A version is kept beside the plist: a flush is due within ``flushDelay``.
        var flushSoon = false

        static func failed(_ error: any Error) -> MergeOutcome { MergeOutcome(values: nil, identity: nil, ok: false, error: error) }
    }

    /// Under the file's lock: reads the file, applies `changes`, writes it if anything changed.
    /// An unreadable file is never overwritten — unless a power cut left it so while its last
    /// flushed version was kept (`.ID.plist.durable`): that version takes its place.
    private func merge(_ changes: [String: Change], known: (file: PinnedFile, values: [String: Any])?, ownUnflushed: PinnedFile?,
                       lockDeadline: Date?) -> MergeOutcome {
        guard let url, let files else { return MergeOutcome() }
        // Nothing to write and the file as this process left it: nothing to read either (one
        // `lstat`, no lock: a writer that replaces it meanwhile is seen by the watcher).
        if changes.isEmpty, let known, known.file.isStill(at: path) { return MergeOutcome(values: nil, identity: known.file) }
        // The file and its directory are the app's: never follow a link planted there (to another
        // app's preferences, or out of the container), never read a FIFO or a device.
        if let refusal = refusal() {
            logger.notice("\(refusal)")
            return .failed(refusal)
        }
        // Nothing to write: read without the writers' lock (every version is put in place whole,
        // so what is read is one of them), and a process holding the lock (another app of a
        // shared App Group) holds up no reader. Only a file that cannot be read as a power cut
        // can leave it is read again under the lock, where its kept version may take its place.
        if changes.isEmpty, let read = readWithoutLock(known: known) { return read }
        let lock: Int32
        switch lockFile(until: lockDeadline) {
        case .success(let fd): lock = fd
        case .failure(let error): return .failed(error)
        }
        defer { close(lock) }
        if !leftoversRemoved { removeLeftovers() }

        var values: [String: Any] = [:]
        var before: PinnedFile?
        do { before = try PinnedFile.at(path) } catch {
            logger.notice("\(error)")
            return .failed(error)
        }
        if let pinned = before, let known, pinned.identity == known.file.identity {
            if changes.isEmpty { return MergeOutcome(values: nil, identity: known.file) }   // nothing new on either side
            values = known.values   // nobody wrote it since: what it holds is known
        } else if let pinned = before {
            do {
                values = try readValues(pinned, named: path)
            } catch {
                let keptFile = Self.mayBeTornByPowerCut(error) ? try? PinnedFile.at(durablePath) : nil
                guard let keptFile, let kept = try? readValues(keptFile, named: durablePath) else {
                    logger.notice("\(path): cannot be read: \(error)")
                    return .failed(error)
                }
                // The kept version (flushed, whole, with its own class, mode and attributes) is
                // the plist again.
                do {
                    try POSIXFile.call("rename", durablePath, path) { rename($0, $1) }
                    try POSIXFile.syncDirectory(directory)
                } catch {
                    logger.notice("\(path): cannot be restored: \(error)")
                    return .failed(error)
                }
                logger.notice("\(error) — as a power cut can leave a file not yet flushed: its last flushed version (\(Self.durableCopyName(forPlistNamed: url.lastPathComponent))) is restored")
                values = kept
                before = keptFile   // renamed: the same inode, now at the path
            }
        }
        var kept = POSIXFile.linkStatus(durablePath) != nil
        guard !changes.isEmpty else { return MergeOutcome(values: values, identity: before, flushSoon: kept) }
        for (key, change) in changes {
            switch change { case .set(let value): values[key] = value; case .remove: values[key] = nil }
        }
        var unflushed = false
        do {
            let data = try PropertyListSerialization.data(fromPropertyList: values, format: .binary, options: 0)
            // The class: the stronger of the file's own (its header, read again: a class change
            // rewraps it in place) and the directory's. Nothing is lowered.
            let own = before == nil ? nil : try ItemInspector.classAndDeviceBinding(ofFileAt: path)
            let explicit = own.map { max($0.0, files.defaultProtection(forNewItemAtPath: path)) }
            let deviceOnly = own?.thisDeviceOnly ?? false
            if kept, let before, before.identity != ownUnflushed?.identity {
                // Beside a version kept by another writer (or by a run that ended before it
                // flushed), a plist not written by this process: flushed first (it was read
                // whole just now), so the version kept from now on is this one.
                guard flushLocked(verified: before) else { throw ContainerError.refusedItem(path: path, reason: "cannot be flushed") }
                kept = false
            }
            if !canDeferFlush || before == nil {
                // A first file: flushed before anything relies on it.
                try write(data, files: files, explicit: explicit, deviceOnly: deviceOnly, .durable)
            } else if kept {
                // This process's own unflushed plist, the flushed version kept already.
                try write(data, files: files, explicit: explicit, deviceOnly: deviceOnly, POSIXFile.Replacement(flushes: false))
                unflushed = true
            } else {
                do {
                    try write(data, files: files, explicit: explicit, deviceOnly: deviceOnly,
                              POSIXFile.Replacement(flushes: false, keepingReplacedAt: durablePath))
                    unflushed = true
                } catch let error as ProtectedFileError where Self.cannotLink(error) {
                    logger.notice("\(directory): the file system cannot link the plist a second time: preferences are flushed at every write")
                    canDeferFlush = false
                    try write(data, files: files, explicit: explicit, deviceOnly: deviceOnly, .durable)
                }
            }
        } catch {
            logger.notice("\(path): cannot be written: \(error)")
            return .failed(error)
        }
        // Not pinned (no descriptor left): not known, read again next time.
        let after = try? PinnedFile.at(path)
        if !unflushed { _ = flushLocked(verified: after) }   // flushed: a kept version is not needed any more
        return MergeOutcome(values: values, identity: after, wrote: true, unflushed: unflushed, flushSoon: unflushed)
    }

    /// A merge with nothing to write, without the lock (see ``merge(_:known:ownUnflushed:lockDeadline:)``);
    /// `nil` when the file must be read under the lock.
    private func readWithoutLock(known: (file: PinnedFile, values: [String: Any])?) -> MergeOutcome? {
        let kept = POSIXFile.linkStatus(durablePath) != nil
        // Read through its pin: the values are the pinned version's.
        do {
            guard let pinned = try PinnedFile.at(path) else { return MergeOutcome(values: [:], identity: nil, flushSoon: kept) }
            if let known, pinned.identity == known.file.identity { return MergeOutcome(values: nil, identity: known.file) }
            return MergeOutcome(values: try readValues(pinned, named: path), identity: pinned, flushSoon: kept)
        } catch {
            if Self.mayBeTornByPowerCut(error), kept { return nil }
            logger.notice("\(path): cannot be read: \(error)")
            return .failed(error)
        }
    }

    /// Removes the plist's temporary siblings (`.ID.plist.dp-tmp-*`) that a writer killed
    /// mid-write left: a new version not yet in place, or a replaced one not yet removed (which
    /// may hold values removed since). Under the lock: no writer of the plist is mid-write.
    private func removeLeftovers() {
        leftoversRemoved = true
        guard let url else { return }
        let prefix = POSIXFile.temporarySiblingPrefix(forName: url.lastPathComponent)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasPrefix(prefix) {
            let leftover = directory + "/" + name
            guard let st = POSIXFile.linkStatus(leftover), st.st_mode & S_IFMT == S_IFREG else { continue }
            if unlink(leftover) == 0 { logger.notice("\(leftover): removed (left by a writer that was stopped mid-write)") }
        }
    }

    /// The lock file, opened (never through a link) and `flock`ed — waited for until `deadline`
    /// at most, when there is one.
    private func lockFile(until deadline: Date?) -> Result<Int32, any Error> {
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard lock >= 0 else {
            let error = ContainerError.fileSystem(FileSystemError("open", path: lockPath, errno: Errno(rawValue: errno)))
            logger.notice("\(error)")
            return .failure(error)
        }
        var lockStatus = stat()
        guard fstat(lock, &lockStatus) == 0, lockStatus.st_mode & S_IFMT == S_IFREG else {
            close(lock)
            return .failure(ContainerError.refusedItem(path: lockPath, reason: "is not a regular file"))
        }
        var pause: useconds_t = 500
        while flock(lock, deadline == nil ? LOCK_EX : LOCK_EX | LOCK_NB) != 0 {
            let failure = errno
            if failure == EINTR { continue }
            if failure == EWOULDBLOCK, let deadline, Date() < deadline {
                usleep(pause)
                pause = min(pause * 2, 20_000)
                continue
            }
            close(lock)
            if failure == EWOULDBLOCK { logger.notice("\(lockPath): held by another process past the time this one may wait") }
            return .failure(ContainerError.fileSystem(FileSystemError("flock", path: lockPath, errno: Errno(rawValue: failure))))
        }
        return .success(lock)
    }

    /// Writes `data` as the plist (see ``ProtectedFileManager/write(_:to:protection:thisDeviceOnly:access:replacement:)``).
    private func write(_ data: Data, files: ProtectedFileManager, explicit: ProtectionClass?, deviceOnly: Bool,
                       _ replacement: POSIXFile.Replacement) throws {
        guard let url else { return }
        try runBlocking { try await files.write(data, to: url, protection: explicit, thisDeviceOnly: deviceOnly, replacement: replacement) }
    }

    /// The dictionary in `pinned` (the plist, or its kept version, at `path`): a regular file
    /// (never a link, a FIFO), opened through its pin and checked again, then read through that
    /// very descriptor (/proc/self/fd/N): what is read is the version pinned, whatever is put at
    /// the path meanwhile.
    private func readValues(_ pinned: PinnedFile, named path: String) throws -> [String: Any] {
        guard let files else { return [:] }
        guard pinned.isRegularFile else { throw ContainerError.refusedItem(path: path, reason: "is not a regular file") }
        let fd = open(pinned.reopenPath, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        var st = stat()
        guard fd >= 0, fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG,
              UInt64(st.st_dev) == pinned.identity.device, UInt64(st.st_ino) == pinned.identity.inode else {
            if fd >= 0 { close(fd) }
            throw ContainerError.refusedItem(path: path, reason: "is not a regular file")
        }
        defer { close(fd) }
        do {
            let data = try runBlocking { try await files.contents(of: URL(fileURLWithPath: "/proc/self/fd/\(fd)")) }
            guard let dictionary = try? PropertyListSerialization.propertyList(from: data, options: [], format: nil) as? [String: Any] else {
                throw ContainerError.refusedItem(path: path, reason: "is not a property-list dictionary")
            }
            return dictionary
        } catch {
            // Errors name the preferences file, not the descriptor it was read through.
            throw (error as? ProtectedFileError)?.naming(path) ?? error
        }
    }

    /// Whether a read failed as a file a power cut caught unflushed can make it fail: damaged
    /// (torn, zeroed, cut short) or no property list at all (empty, plain zeros) — not a locked
    /// class, a foreign keybag, a link or a FIFO.
    static func mayBeTornByPowerCut(_ error: any Error) -> Bool {
        switch error {
        case ProtectedFileError.damaged: true
        case ContainerError.refusedItem(_, let reason): reason == "is not a property-list dictionary"
        default: false
        }
    }

    /// Whether a write failed because the file system cannot give a file a second name.
    static func cannotLink(_ error: ProtectedFileError) -> Bool {
        guard case .fileSystem(let failure) = error, failure.operation == "link" else { return false }
        return [Errno.notPermitted, .notSupported, .noFunction, .tooManyLinks, .improperLink].contains(failure.errno)
    }

    // MARK: - Flushing

    /// Flushes the plist and drops its kept version, under the file's lock. `false` when it
    /// could not (it is tried again later); `true` too when it was not this process's to flush.
    private func flush(lockDeadline: Date? = nil) -> Bool {
        condition.lock(); let verified = knownFile; condition.unlock()
        guard url != nil, refusal() == nil, case .success(let lock) = lockFile(until: lockDeadline) else { return false }
        defer { close(lock) }
        return flushLocked(verified: verified)
    }

    /// ``flush()`` with the lock held: `fsync` the plist, then its directory (the renames), and
    /// only then remove `.ID.plist.durable` (and flush that too). Only when the plist is the one
    /// this process last read whole or wrote (`verified`): the kept version is never dropped for
    /// a plist nobody has read since a power cut — another writer, who changed it since, or the
    /// reader this process becomes when the watcher sees the change, flushes it.
    @discardableResult
    private func flushLocked(verified: PinnedFile?) -> Bool {
        guard POSIXFile.linkStatus(durablePath) != nil else { return true }
        guard let verified, verified.isStill(at: path) else { return true }
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { return false }
        var st = stat()
        let flushed = fstat(fd, &st) == 0 && st.st_mode & S_IFMT == S_IFREG && fsync(fd) == 0
        let failure = errno
        close(fd)
        guard flushed else {
            logger.notice("\(path): cannot be flushed: \(String(cString: strerror(failure)))")
            return false
        }
        do {
            try POSIXFile.syncDirectory(directory)
            // Gone already: another process flushed between the check and here (a lock through
            // another path to the same directory).
            try POSIXFile.call("unlink", durablePath) { unlink($0) == 0 || errno == ENOENT ? 0 : -1 }
            try POSIXFile.syncDirectory(directory)
        } catch {
            logger.notice("\(error)")
            return false
        }
        condition.lock(); ownUnflushedFile = nil; condition.unlock()
        return true
    }

    /// Stores whose pending writes are written, and unflushed ones flushed, when the process
    /// exits (`atexit`: ``finish(until:)``).
    static let flushedAtExit = LiveStores()

    /// `@unchecked Sendable`: every field is read and written only under `lock`.
    final class LiveStores: @unchecked Sendable {
        private let lock = NSLock()
        private var stores: [ObjectIdentifier: Weak] = [:]
        private var registered = false
        /// The process the stores belong to: a child forked without `exec` that exits writes
        /// nothing of its parent's (its copy of what was pending is stale, its worker gone).
        private var process: pid_t = 0
        struct Weak { weak var store: PreferencesStore? }

        func add(_ store: PreferencesStore) {
            lock.lock(); defer { lock.unlock() }
            stores[ObjectIdentifier(store)] = Weak(store: store)
            if !registered {
                registered = true
                process = getpid()
                atexit { PreferencesStore.flushedAtExit.flushAll() }
            }
        }

        func remove(_ store: PreferencesStore) {
            lock.lock(); defer { lock.unlock() }
            stores[ObjectIdentifier(store)] = nil
        }

        func flushAll() {
            lock.lock(); let live = stores.values.compactMap(\.store), mine = process == getpid(); lock.unlock()
            guard mine else { return }
            // One time limit for them all (a process with several stores waits no longer), yet
            // each store at least a second of its own (its limit, if shorter): one lock held
            // elsewhere cannot take every other store's chance to write.
            let deadline = Date(timeIntervalSinceNow: live.map(\.finishingTimeLimit).max() ?? 0)
            for store in live {
                store.finish(until: max(deadline, Date(timeIntervalSinceNow: min(1, store.finishingTimeLimit))))
            }
        }
    }

    /// Why the file must not be touched: its directory is reached through a link (`openat2` with
    /// `RESOLVE_NO_SYMLINKS`: one call, where resolving the path walked it in Swift), or it is
    /// there and is not a regular file (a link, a FIFO, a directory).
    private func refusal() -> ContainerError? {
        let opened = (try? LosslessPath.withCString(directory) { path in
            Result { () throws(Errno) in try SystemCall.openat2(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, resolve: .noSymlinks) }
        }) ?? .failure(.tooManySymbolicLinkLevels)
        if case .failure(.noFunction) = opened {
            // A kernel before openat2 (5.6): the directory's resolved path must be its own.
            guard let resolved = realpath(directory, nil) else { return nil }
            defer { free(resolved) }
            if String(cString: resolved) != URL(fileURLWithPath: directory).standardizedFileURL.path {
                return .refusedItem(path: directory, reason: "is reached through a symbolic link")
            }
        } else if case .failure(let error) = opened {
            if error == .tooManySymbolicLinkLevels || error == .notDirectory {
                return .refusedItem(path: directory, reason: "is reached through a symbolic link")
            }
            // Missing or unreadable: the write itself says what is wrong.
        } else if case .success(let fd) = opened {
            close(fd)
        }
        var st = stat()
        if lstat(path, &st) == 0, st.st_mode & S_IFMT != S_IFREG {
            return .refusedItem(path: path, reason: "is not a regular file")
        }
        return nil
    }

    // MARK: - The watcher

    /// Asks the worker to read the file back whenever it is replaced, written or removed.
    private func watch() {
        guard let url else { return }
        let fd = inotify_init1(Int32(IN_CLOEXEC))
        guard fd >= 0 else { return }
        defer { close(fd) }
        let directory = url.deletingLastPathComponent().path
        guard inotify_add_watch(fd, directory, UInt32(IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE | IN_CREATE)) >= 0 else { return }
        let name = url.lastPathComponent
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0), pollfd(fd: wake[0], events: Int16(POLLIN), revents: 0)]
            if poll(&fds, 2, -1) < 0 { if errno == EINTR { continue } else { return } }
            if fds[1].revents != 0 { return }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { if n < 0 && errno == EINTR { continue } else { return } }
            if inotifyEvents(buffer, count: n).contains(where: { $0.name == name }) {
                // The file as this process last read or wrote it (its own write's events): no
                // round needed, there is nothing new to read.
                let now = FileIdentity(path)
                condition.lock()
                if now == nil || now != knownFile?.identity || busy { requested += 1; condition.broadcast() }
                condition.unlock()
            }
            // A quiet moment before waiting again: the events meanwhile (a write is five or six
            // of them) queue up without waking this thread, so writers (this process and others)
            // pay for no wake-up each, and a burst is read at once.
            var quiet = pollfd(fd: wake[0], events: Int16(POLLIN), revents: 0)
            if poll(&quiet, 1, Self.watcherQuietMilliseconds) > 0 { return }
        }
    }

    /// How long the watcher lets events queue up after reading some (``watch()``).
    static let watcherQuietMilliseconds: Int32 = 5

    /// Stops the worker and the watcher (the defaults object went away), after writing what was
    /// set and not written yet and flushing what was written unflushed (``finish(until:)``).
    func stop() {
        Self.flushedAtExit.remove(self)
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
        finish(until: Date(timeIntervalSinceNow: finishingTimeLimit))
        if wake[1] >= 0 { var byte: UInt8 = 1; _ = Glibc.write(wake[1], &byte, 1) }
    }

    /// Writes what was set and not written yet, then flushes what was written unflushed: when
    /// the defaults go away and when the process exits. A value set is never lost for want of a
    /// `synchronize()` (on iOS it reaches `cfprefsd` at once; `synchronize()` is not needed).
    ///
    /// The round running finishes first — unless this is the worker (a notification's observer
    /// let the defaults go): the worker never waits here, it may be posting a notification that
    /// waits for this very thread. The round, and the file's lock, are waited for until `deadline`
    /// at most: another process holding the lock cannot hold this one up for good (what is still
    /// waiting then is written by the worker when it can, unless the process exits first).
    func finish(until deadline: Date) {
        condition.lock()
        if Thread.current !== worker {
            while busy { if !condition.wait(until: deadline) { break } }
        }
        if busy {
            logger.notice("\(path): a write is still running after the time allowed (the file's lock may be held by another process): it is finished when it can be, unless this process exits first")
        }
        if !busy, !pending.isEmpty { performRound(lockDeadline: deadline) }
        let unflushed = flushDue != nil
        flushDue = nil
        condition.unlock()
        let flushed = unflushed ? flush(lockDeadline: deadline) : true
        condition.lock()
        // Not flushed in time: after a stop, the worker flushes it when it can.
        if !flushed, flushDue == nil { flushDue = Date() }
        finished = true
        condition.broadcast()
        condition.unlock()
    }
}

