import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The worker: one thread that runs the rounds — merging what is pending into the file, reading back what
/// others wrote — when asked or when a set is due, all under `condition`.
extension PreferencesStore {
    /// How long after a set the worker writes it, unless a `synchronize()` did (``writeDue``).
    static let writeDelay: TimeInterval = 0.005

    func work() {
        condition.lock()
        while !stopped {
            let now = Date()
            if busy {
                condition.wait()
            } else if completed < requested {
                performRound()
                // (or the clock was set back)
            } else if let due = writeDue, due <= now || due.timeIntervalSince(now) > Self.writeDelay {
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
    func performRound(lockDeadline: Date? = nil) {
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
                switch change {
                case .set(let value): view[key] = value;
                case .remove: view[key] = nil
                }
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
}
