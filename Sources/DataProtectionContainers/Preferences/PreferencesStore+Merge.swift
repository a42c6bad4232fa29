import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Merging: under the file's `flock`, the file read, the pending changes applied key by key, the file
/// written whole (never over one that cannot be read, unless its flushed version was kept).
extension PreferencesStore {
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

        static func failed(_ error: any Error) -> MergeOutcome {
            MergeOutcome(values: nil, identity: nil, ok: false, error: error)
        }
    }

    /// Under the file's lock: reads the file, applies `changes`, writes it if anything changed.
    /// An unreadable file is never overwritten — unless a power cut left it so while its last
    /// flushed version was kept (`.ID.plist.durable`): that version takes its place.
    func merge(
        _ changes: [String: Change], known: (file: PinnedFile, values: [String: Any])?, ownUnflushed: PinnedFile?,
        lockDeadline: Date?
    ) -> MergeOutcome {
        guard let url, let files else { return MergeOutcome() }
        // Nothing to write and the file as this process left it: nothing to read either (one
        // `lstat`, no lock: a writer that replaces it meanwhile is seen by the watcher).
        if changes.isEmpty, let known, known.file.isStill(at: path) {
            return MergeOutcome(values: nil, identity: known.file)
        }
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
            // nothing new on either side
            if changes.isEmpty { return MergeOutcome(values: nil, identity: known.file) }
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
                logger.notice(
                    "\(error) — as a power cut can leave a file not yet flushed: its last flushed version (\(Self.durableCopyName(forPlistNamed: url.lastPathComponent))) is restored"
                )
                values = kept
                before = keptFile   // renamed: the same inode, now at the path
            }
        }
        var kept = POSIXFile.linkStatus(durablePath) != nil
        guard !changes.isEmpty else { return MergeOutcome(values: values, identity: before, flushSoon: kept) }
        for (key, change) in changes {
            switch change {
            case .set(let value): values[key] = value;
            case .remove: values[key] = nil
            }
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
                guard flushLocked(verified: before) else {
                    throw ContainerError.refusedItem(path: path, reason: "cannot be flushed")
                }
                kept = false
            }
            if !canDeferFlush || before == nil {
                // A first file: flushed before anything relies on it.
                try write(data, files: files, explicit: explicit, deviceOnly: deviceOnly, .durable)
            } else if kept {
                // This process's own unflushed plist, the flushed version kept already.
                try write(
                    data, files: files, explicit: explicit, deviceOnly: deviceOnly,
                    POSIXFile.Replacement(flushes: false))
                unflushed = true
            } else {
                do {
                    try write(
                        data, files: files, explicit: explicit, deviceOnly: deviceOnly,
                        POSIXFile.Replacement(flushes: false, keepingReplacedAt: durablePath))
                    unflushed = true
                } catch let error as ProtectedFileError where Self.cannotLink(error) {
                    logger.notice(
                        "\(directory): the file system cannot link the plist a second time: preferences are flushed at every write"
                    )
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
    func readWithoutLock(known: (file: PinnedFile, values: [String: Any])?) -> MergeOutcome? {
        let kept = POSIXFile.linkStatus(durablePath) != nil
        // Read through its pin: the values are the pinned version's.
        do {
            guard let pinned = try PinnedFile.at(path) else {
                return MergeOutcome(values: [:], identity: nil, flushSoon: kept)
            }
            if let known, pinned.identity == known.file.identity {
                return MergeOutcome(values: nil, identity: known.file)
            }
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
    func removeLeftovers() {
        leftoversRemoved = true
        guard let url else { return }
        let prefix = POSIXFile.temporarySiblingPrefix(forName: url.lastPathComponent)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasPrefix(prefix)
        {
            let leftover = directory + "/" + name
            guard let st = POSIXFile.linkStatus(leftover), st.st_mode & S_IFMT == S_IFREG else { continue }
            if unlink(leftover) == 0 {
                logger.notice("\(leftover): removed (left by a writer that was stopped mid-write)")
            }
        }
    }

    /// The lock file, opened (never through a link) and `flock`ed — waited for until `deadline`
    /// at most, when there is one.
    func lockFile(until deadline: Date?) -> Result<Int32, any Error> {
        let lock = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard lock >= 0 else {
            let error = ContainerError.fileSystem(
                FileSystemError("open", path: lockPath, errno: Errno(rawValue: errno)))
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
            if failure == EWOULDBLOCK {
                logger.notice("\(lockPath): held by another process past the time this one may wait")
            }
            return .failure(
                ContainerError.fileSystem(FileSystemError("flock", path: lockPath, errno: Errno(rawValue: failure))))
        }
        return .success(lock)
    }

    /// Writes `data` as the plist (see
    /// ``ProtectedFileManager/write(_:to:protection:thisDeviceOnly:access:replacement:)``).
    func write(
        _ data: Data, files: ProtectedFileManager, explicit: ProtectionClass?, deviceOnly: Bool,
        _ replacement: POSIXFile.Replacement
    ) throws {
        guard let url else { return }
        try runBlocking {
            try await files.write(
                data, to: url, protection: explicit, thisDeviceOnly: deviceOnly, replacement: replacement)
        }
    }

    /// The dictionary in `pinned` (the plist, or its kept version, at `path`): a regular file
    /// (never a link, a FIFO), opened through its pin and checked again, then read through that
    /// very descriptor (/proc/self/fd/N): what is read is the version pinned, whatever is put at
    /// the path meanwhile.
    func readValues(_ pinned: PinnedFile, named path: String) throws -> [String: Any] {
        guard let files else { return [:] }
        guard pinned.isRegularFile else {
            throw ContainerError.refusedItem(path: path, reason: "is not a regular file")
        }
        let fd = open(pinned.reopenPath, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        var st = stat()
        guard fd >= 0, fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG,
            UInt64(st.st_dev) == pinned.identity.device, UInt64(st.st_ino) == pinned.identity.inode
        else {
            if fd >= 0 { close(fd) }
            throw ContainerError.refusedItem(path: path, reason: "is not a regular file")
        }
        defer { close(fd) }
        do {
            let data = try runBlocking { try await files.contents(of: URL(fileURLWithPath: "/proc/self/fd/\(fd)")) }
            guard
                let dictionary = try? PropertyListSerialization.propertyList(from: data, options: [], format: nil)
                    as? [String: Any]
            else {
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

    /// Why the file must not be touched: its directory is reached through a link (`openat2` with
    /// `RESOLVE_NO_SYMLINKS`: one call, where resolving the path walked it in Swift), or it is
    /// there and is not a regular file (a link, a FIFO, a directory).
    func refusal() -> ContainerError? {
        let opened =
            (try? LosslessPath.withCString(directory) { path in
                Result { () throws(Errno) in
                    try SystemCall.openat2(AT_FDCWD, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, resolve: .noSymlinks)
                }
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
}
