import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Flushing: deferred durability, as `cfprefsd` defers it — the plist `fsync`ed within ``flushDelay``,
/// its last flushed version kept beside it until then, and everything flushed when the process exits.
extension PreferencesStore {
    /// Flushes the plist and drops its kept version, under the file's lock. `false` when it
    /// could not (it is tried again later); `true` too when it was not this process's to flush.
    func flush(lockDeadline: Date? = nil) -> Bool {
        condition.lock(); let verified = knownFile; condition.unlock()
        guard url != nil, refusal() == nil, case .success(let lock) = lockFile(until: lockDeadline) else {
            return false
        }
        defer { close(lock) }
        return flushLocked(verified: verified)
    }

    /// ``flush()`` with the lock held: `fsync` the plist, then its directory (the renames), and
    /// only then remove `.ID.plist.durable` (and flush that too). Only when the plist is the one
    /// this process last read whole or wrote (`verified`): the kept version is never dropped for
    /// a plist nobody has read since a power cut — another writer, who changed it since, or the
    /// reader this process becomes when the watcher sees the change, flushes it.
    @discardableResult
    func flushLocked(verified: PinnedFile?) -> Bool {
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
}
