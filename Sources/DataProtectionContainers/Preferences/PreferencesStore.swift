import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
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
///
/// One lock, `condition`, guards every mutable field below it; the facets are the values (here),
/// ``work()`` (+Worker), ``merge(_:known:ownUnflushed:lockDeadline:)`` (+Merge), ``flush(lockDeadline:)``
/// (+Flushing) and ``watch()`` (+Watcher).
/// `@unchecked Sendable`: every mutable field is read and written only under `condition`.
final class PreferencesStore: @unchecked Sendable {
    enum Change { case set(Any), remove }

    let url: URL?
    let files: ProtectedFileManager?
    /// The property list's path, its directory's, its lock file's and its last flushed
    /// version's (worked out once: each write needs them).
    let path: String, directory: String, lockPath: String, durablePath: String
    /// How long a write may stay unflushed (1 s; tests lengthen it to see the flush at stop).
    let flushDelay: TimeInterval
    /// How long finishing (``finish(until:)``) may wait for a running round or for the
    /// file's lock: rounds take milliseconds, a flush on a busy disk may take a few seconds (5 s;
    /// tests shorten it).
    let finishingTimeLimit: TimeInterval
    let logger = Logger(label: "preferences")
    weak var owner: ProtectedUserDefaults?

    // Everything below is guarded by `condition` (facets in other files read and write it, always under it).
    let condition = NSCondition()
    var stored: [String: Any] = [:]
    var registered: [String: Any] = [:]
    var pending: [String: Change] = [:]
    var requested = 0   // work requests (syncs, file events, sets once due)
    var completed = 0   // requests the worker has finished
    var lastOK = true
    var lastError: (any Error)?
    var stopped = false
    /// The file as last read or written, held open (``PinnedFile``).
    var knownFile: PinnedFile?
    /// The values in the file as last read or written (``knownFile``'s): a write that finds the
    /// file unchanged since needs not read it again.
    var knownValues: [String: Any]?
    /// The plist as this process last wrote it unflushed, while the version it kept is there:
    /// its next write may replace it unflushed too. Any other plist beside a kept version (another
    /// process wrote it, or a run that ended before flushing) is flushed before it is replaced.
    var ownUnflushedFile: PinnedFile?
    var streams: [UUID: AsyncStream<Void>.Continuation] = [:]
    var wake: [Int32] = [-1, -1]
    /// A round (a merge, or a flush) is running, on the worker or on a thread in ``synchronize()``.
    var busy = false
    var worker: Thread?
    /// When the writes not yet flushed must be (`nil`: none).
    var flushDue: Date?
    /// When the worker writes what was set (`nil`: nothing waits for it). A set is written
    /// ``writeDelay`` later, not at once: a `synchronize()` meanwhile writes it on its own thread
    /// (no hand-over to the worker and back), and sets in a row are written once.
    var writeDue: Date?
    /// Until when the worker waits, when it waits for a time (`nil`: until woken): a set due
    /// later needs not wake it.
    var workerWaitsUntil: Date?
    /// Whether the file system can give the plist a second name (`link(2)`): where it cannot,
    /// every write is flushed before ``synchronize()`` returns. Used by rounds only (one at a time).
    var canDeferFlush = true
    /// Whether ``finish(until:)`` ran (what is left after it is the worker's).
    var finished = false
    /// Whether this store's first round removed what killed writers left (``removeLeftovers()``).
    /// Used by rounds only.
    var leftoversRemoved = false

    init(url: URL?, files: ProtectedFileManager?, flushDelay: TimeInterval = 1, finishingTimeLimit: TimeInterval = 5) {
        self.url = url
        self.files = files
        self.flushDelay = flushDelay
        self.finishingTimeLimit = finishingTimeLimit
        path = url?.path ?? ""
        directory = url?.deletingLastPathComponent().path ?? ""
        lockPath = Self.sibling(of: url, named: Self.lockFileName(forPlistNamed:))
        durablePath = Self.sibling(of: url, named: Self.durableCopyName(forPlistNamed:))
    }

    /// The path of the file beside the plist at `url` that `name` names from the plist's name
    /// (empty without a plist).
    private static func sibling(of url: URL?, named name: (String) -> String) -> String {
        url.map { $0.deletingLastPathComponent().appendingPathComponent(name($0.lastPathComponent)).path } ?? ""
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
        if let value {
            stored[key] = value; pending[key] = .set(value)
        } else {
            stored[key] = nil; pending[key] = .remove
        }
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

    func announce() {
        condition.lock(); let continuations = Array(streams.values); condition.unlock()
        for continuation in continuations { continuation.yield() }
        if let owner {
            NotificationCenter.default.post(name: ProtectedUserDefaults.didChangeNotification, object: owner)
        }
    }

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
            logger.notice(
                "\(path): a write is still running after the time allowed (the file's lock may be held by another process): it is finished when it can be, unless this process exits first"
            )
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
