import CLinuxShims
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
final class PreferencesStore: @unchecked Sendable {
    enum Change { case set(Any), remove }
    /// What identifies one version of the file without reading it.
    struct FileIdentity: Equatable { var device: UInt64, inode: UInt64, size: Int64, modified: Int, modifiedNanoseconds: Int }

    let url: URL?
    let files: ProtectedFileManager?
    /// The property list's path, its directory's and its lock file's (worked out once: each
    /// write needs them).
    private let path: String, directory: String, lockPath: String
    let logger = Logger(label: "preferences")
    weak var owner: ProtectedUserDefaults?

    // Everything below is guarded by `condition`.
    private let condition = NSCondition()
    private var stored: [String: Any] = [:]
    private var registered: [String: Any] = [:]
    private var pending: [String: Change] = [:]
    private var requested = 0      // work requests (sets, syncs, file events)
    private var completed = 0      // requests the worker has finished
    private var lastOK = true
    private var lastError: (any Error)?
    private var stopped = false
    private var knownFile: FileIdentity?
    /// The values in the file as last read or written (``knownFile``'s): a write that finds the
    /// file unchanged since needs not read it again.
    private var knownValues: [String: Any]?
    private var streams: [UUID: AsyncStream<Void>.Continuation] = [:]
    private var wake: [Int32] = [-1, -1]

    init(url: URL?, files: ProtectedFileManager?) {
        self.url = url
        self.files = files
        path = url?.path ?? ""
        directory = url?.deletingLastPathComponent().path ?? ""
        lockPath = url.map { $0.deletingLastPathComponent().appendingPathComponent(Self.lockFileName(forPlistNamed: $0.lastPathComponent)).path } ?? ""
    }

    /// Loads the file, then starts the worker and the watcher.
    func start() {
        guard url != nil else { return }
        _ = pipe(&wake)
        for fd in wake { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let worker = Thread { [self] in work() }
        worker.name = "preferences"
        worker.start()
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
        requested += 1
        condition.broadcast()
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
        while completed < ticket && !stopped { condition.wait() }
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

    private func work() {
        while true {
            condition.lock()
            while completed >= requested && !stopped { condition.wait() }
            if stopped { condition.unlock(); return }
            let ticket = requested
            let changes = pending
            pending = [:]
            let known = knownFile.map { ($0, knownValues ?? [:]) }
            condition.unlock()

            let outcome = merge(changes, known: known)

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
            if !outcome.ok {
                // Not written (a locked class, a full disk): kept for the next attempt, unless
                // set again since.
                for (key, change) in changes where pending[key] == nil { pending[key] = change }
            }
            lastOK = outcome.ok
            lastError = outcome.error
            completed = ticket
            condition.broadcast()
            condition.unlock()
            if changedElsewhere { announce() }
        }
    }

    /// The empty file beside a plist (`.ID.plist.lock`) that writers `flock`: coordination, not data.
    static func lockFileName(forPlistNamed name: String) -> String { "." + name + ".lock" }

    /// Whether `name` is such a lock file's name.
    static func isLockFileName(_ name: String) -> Bool { name.hasPrefix(".") && name.hasSuffix(".plist.lock") }

    /// Under the file's lock: reads the file, applies `changes`, writes it if anything changed.
    /// Returns the values now in the file (`nil` when they could not be read) and whether all
    /// went well. An unreadable file is never overwritten.
    private func merge(_ changes: [String: Change], known: (file: FileIdentity, values: [String: Any])?) -> (values: [String: Any]?, identity: FileIdentity?, ok: Bool, error: (any Error)?) {
        guard let url, let files else { return (nil, nil, true, nil) }
        // The file and its directory are the app's: never follow a link planted there (to another
        // app's preferences, or out of the container), never read a FIFO or a device.
        if let refusal = refusal() {
            logger.notice("\(refusal)")
            return (nil, nil, false, refusal)
        }
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard lock >= 0 else {
            let error = ContainerError.fileSystem(FileSystemError("open", path: lockPath, errno: Errno(rawValue: errno)))
            logger.notice("\(error)")
            return (nil, nil, false, error)
        }
        defer { close(lock) }
        var lockStatus = stat()
        guard fstat(lock, &lockStatus) == 0, lockStatus.st_mode & S_IFMT == S_IFREG else {
            return (nil, nil, false, ContainerError.refusedItem(path: lockPath, reason: "is not a regular file"))
        }
        while flock(lock, LOCK_EX) != 0 && errno == EINTR {}

        var values: [String: Any] = [:]
        let before = identity(path)
        if let before, let known, before == known.file {
            if changes.isEmpty { return (nil, known.file, true, nil) }   // nothing new on either side
            values = known.values   // nobody wrote it since: what it holds is known
        } else if before != nil {
            // Opened without following a link, checked to be a regular file, then read through
            // that very descriptor (/proc/self/fd/N): a link swapped in afterwards changes nothing.
            let fd = open(url.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            var st = stat()
            guard fd >= 0, fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
                if fd >= 0 { close(fd) }
                let error = ContainerError.refusedItem(path: url.path, reason: "is not a regular file")
                logger.notice("\(error)")
                return (nil, nil, false, error)
            }
            defer { close(fd) }
            do {
                let data = try runBlocking { try await files.contents(of: URL(fileURLWithPath: "/proc/self/fd/\(fd)")) }
                guard let dictionary = try PropertyListSerialization.propertyList(from: data, options: [], format: nil) as? [String: Any] else {
                    throw ContainerError.refusedItem(path: url.path, reason: "is not a property-list dictionary")
                }
                values = dictionary
            } catch {
                // Errors name the preferences file, not the descriptor it was read through.
                let error = (error as? ProtectedFileError)?.naming(url.path) ?? error
                logger.notice("\(url.path): cannot be read: \(error)")
                return (nil, nil, false, error)
            }
        }
        guard !changes.isEmpty else { return (values, before, true, nil) }
        for (key, change) in changes {
            switch change { case .set(let value): values[key] = value; case .remove: values[key] = nil }
        }
        do {
            let data = try PropertyListSerialization.data(fromPropertyList: values, format: .binary, options: 0)
            try runBlocking { try await files.write(data, to: url) }
        } catch {
            logger.notice("\(url.path): cannot be written: \(error)")
            return (nil, nil, false, error)
        }
        return (values, identity(path), true, nil)
    }

    /// Why the file must not be touched: its directory is reached through a link (`openat2` with
    /// `RESOLVE_NO_SYMLINKS`: one call, where resolving the path walked it in Swift), or it is
    /// there and is not a regular file (a link, a FIFO, a directory).
    private func refusal() -> ContainerError? {
        let fd = (try? LosslessPath.withCString(directory) {
            cshim_openat2(AT_FDCWD, $0, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, UInt64(CSHIM_RESOLVE_NO_SYMLINKS))
        }) ?? -ELOOP
        if fd == -ENOSYS {
            // A kernel before openat2 (5.6): the directory's resolved path must be its own.
            guard let resolved = realpath(directory, nil) else { return nil }
            defer { free(resolved) }
            if String(cString: resolved) != URL(fileURLWithPath: directory).standardizedFileURL.path {
                return .refusedItem(path: directory, reason: "is reached through a symbolic link")
            }
        } else if fd < 0 {
            if fd == -ELOOP || fd == -ENOTDIR { return .refusedItem(path: directory, reason: "is reached through a symbolic link") }
            // Missing or unreadable: the write itself says what is wrong.
        } else {
            close(fd)
        }
        var st = stat()
        if lstat(path, &st) == 0, st.st_mode & S_IFMT != S_IFREG {
            return .refusedItem(path: path, reason: "is not a regular file")
        }
        return nil
    }

    private func identity(_ path: String) -> FileIdentity? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        return FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino), size: Int64(st.st_size),
                            modified: Int(st.st_mtim.tv_sec), modifiedNanoseconds: Int(st.st_mtim.tv_nsec))
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
                condition.lock(); requested += 1; condition.broadcast(); condition.unlock()
            }
        }
    }

    /// Stops the worker and the watcher (the defaults object went away).
    func stop() {
        condition.lock(); stopped = true; condition.broadcast(); condition.unlock()
        if wake[1] >= 0 { var byte: UInt8 = 1; _ = write(wake[1], &byte, 1) }
    }
}
