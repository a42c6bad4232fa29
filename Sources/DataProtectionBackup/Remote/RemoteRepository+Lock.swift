import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import Synchronization

extension RemoteRepository {
    /// A writer's lock file (`locks/ID`, FORMAT.md §5.3), rewritten every 5 minutes while it is
    /// held. A refresh that finds it gone or not its own (another process judged it stale and
    /// removed it), that finds another writer's fresh lock at two refreshes in a row (one that
    /// removed ours just before our rewrite), or that has failed for 10 minutes marks it
    /// **lost**: the writer then sends no further authentication record (``check(_:confirmedWithin:)``).
    final class RemoteLock: Sendable {
        let name: String
        let record: LockRecord
        private let lost = Mutex<String?>(nil)
        /// When the lock was last seen in place (taken, or found and rewritten by a refresh).
        private let confirmed = Mutex(ContinuousClock.now)
        /// Other writers' fresh locks the last refresh saw (a writer starting now backs off and
        /// removes its own within seconds; one still there at the next refresh holds the repository).
        private let suspects = Mutex<Set<String>>([])
        private let refresher = Mutex<Task<Void, Never>?>(nil)

        /// After this long without a successful rewrite the lock counts as lost: another
        /// writer's clock need only be 20 minutes ahead to judge it stale.
        static let lostAfter: Duration = .seconds(10 * 60)

        init(name: String, record: LockRecord) {
            self.name = name
            self.record = record
        }

        /// What one refresh found.
        enum RefreshOutcome: Equatable {
            case refreshed
            case lost(String)
            case failed
        }

        /// Starts rewriting the lock every `every` (its writes are never cut short by `stop()`).
        func startRefreshing(_ repository: RemoteRepository, every: Duration) {
            let task = Task { [self] in
                while !Task.isCancelled {
                    try? await Task.sleep(for: every)
                    if Task.isCancelled { break }
                    // Not cancelled with this task: a rewrite is never left half done.
                    let outcome = await Task.detached { await self.refreshOnce(repository) }.value
                    if case .lost(let why) = outcome {
                        markLost(why)
                        return
                    }
                    if sinceConfirmed > Self.lostAfter {
                        markLost(
                            "the repository's lock \(name) could not be refreshed for \(Int(Self.lostAfter.components.seconds / 60)) minutes"
                        )
                        return
                    }
                }
            }
            refresher.withLock { $0 = task }
        }

        /// Reads the lock back, rewrites it with the time now, and lists the others.
        func refreshOnce(_ repository: RemoteRepository) async -> RefreshOutcome {
            let rclone = repository.rclone
            let bytes: Data
            do { bytes = try await rclone.read("locks/" + name) } catch let failure as Rclone.Failure
                where failure.status == Rclone.fileNotFound || failure.status == Rclone.directoryNotFound
            {
                return .lost("the repository's lock \(name) was removed by another process meanwhile")
            } catch {
                return .failed
            }
            guard (try? RemoteRepository.decoder().decode(LockRecord.self, from: bytes))?.sameHolder(as: record) == true
            else {
                return .lost("the repository's lock \(name) was removed by another process meanwhile")
            }
            var fresh = record
            fresh.refreshed = Date()
            guard let encoded = try? RemoteRepository.encoder().encode(fresh),
                (try? await rclone.write(Array(encoded), to: "locks/" + name)) != nil
            else { return .failed }
            confirm()
            return await lookForOthers(repository)
        }

        /// Lists the other writers' fresh locks: one seen at the last look too holds the
        /// repository (it removed ours between our read and our rewrite) — the lock is lost.
        func lookForOthers(_ repository: RemoteRepository) async -> RefreshOutcome {
            guard let others = try? await repository.freshLocks(except: name) else { return .failed }
            let before = suspects.withLock { held in
                defer { held = Set(others.keys) }
                return held
            }
            if let name = others.keys.first(where: before.contains) {
                return .lost(
                    "another writer holds the repository (\(others[name]!)) and removed this one's lock meanwhile")
            }
            return .refreshed
        }

        /// Whether the last look saw another writer's fresh lock.
        var hasSuspects: Bool { suspects.withLock { !$0.isEmpty } }

        func confirm() { confirmed.withLock { $0 = .now } }

        /// How long ago the lock was last seen in place.
        var sinceConfirmed: Duration { ContinuousClock.now - confirmed.withLock { $0 } }

        func markLost(_ why: String) { lost.withLock { if $0 == nil { $0 = why } } }

        /// Why the lock was lost, or nil while it is held.
        var lostReason: String? { lost.withLock { $0 } }

        /// Stops refreshing, and waits for a rewrite under way to end.
        func stop() async {
            guard let task = refresher.withLock({ $0 }) else { return }
            task.cancel()
            await task.value
        }
    }

    /// What a lock file holds (JSON). `machine` and `boot` are app-specific hashes of
    /// `/etc/machine-id` and of the boot ID (never the IDs themselves); with `started` (the
    /// process's start time, in clock ticks since boot) they tell a lock whose process is gone
    /// on this machine from one of a live process on another machine of the same host name.
    struct LockRecord: Codable, Sendable {
        var host: String
        var pid: Int32
        var purpose: String
        var refreshed: Date
        var machine: String?
        var boot: String?
        var started: UInt64?
        /// The process's PID namespace (`/proc/self/ns/pid`'s link, `pid:[INODE]`): containers
        /// of one machine share its machine and boot IDs, not their process IDs.
        var pidNamespace: String?

        /// The same writer: what was written when the lock was taken (its time aside).
        func sameHolder(as other: LockRecord) -> Bool {
            host == other.host && pid == other.pid && purpose == other.purpose && machine == other.machine
                && boot == other.boot && started == other.started && pidNamespace == other.pidNamespace
        }

        /// Whether the writer is known to be gone: a lock of this host, machine, boot and PID
        /// namespace whose process has ended (or whose pid now names a process started at another
        /// time). Without them (or elsewhere) nothing is known: only its age says.
        var writerIsGone: Bool {
            guard let machine, let boot, let pidNamespace, machine == LockRecord.thisMachine,
                boot == LockRecord.thisBoot,
                pidNamespace == LockRecord.thisPIDNamespace, host == ProcessInfo.processInfo.hostName, pid != getpid()
            else { return false }
            if kill(pid, 0) != 0 && errno == ESRCH { return true }
            guard let started, let now = LockRecord.startTime(of: pid) else { return false }
            return now != started
        }

        /// The record of a lock taken now by this process.
        static func now(purpose: String) -> LockRecord {
            LockRecord(
                host: ProcessInfo.processInfo.hostName, pid: getpid(), purpose: purpose, refreshed: Date(),
                machine: thisMachine, boot: thisBoot, started: startTime(of: getpid()), pidNamespace: thisPIDNamespace)
        }

        static let thisPIDNamespace = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid")

        static let thisMachine = appSpecific("/etc/machine-id")
        static let thisBoot = appSpecific("/proc/sys/kernel/random/boot_id")

        /// HMAC-SHA256(ID, "DataProtection remote lock"), hex (systemd's advice: an ID is
        /// confidential, an application-specific value derived from it is not).
        static func appSpecific(_ file: String) -> String? {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { return nil }
            let id = text.trimmingCharacters(in: .whitespacesAndNewlines).replacingOccurrences(of: "-", with: "")
            guard id.count == 32 else { return nil }
            let mac = HMAC<SHA256>.authenticationCode(
                for: Data("DataProtection remote lock".utf8), using: SymmetricKey(data: Data(id.utf8)))
            return Array(Array(mac).prefix(16)).hex
        }

        /// `/proc/PID/stat`'s 22nd field: when the process started, in clock ticks since boot.
        static func startTime(of pid: Int32) -> UInt64? {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                let close = stat.lastIndex(of: ")")
            else { return nil }
            // After "PID (COMM)": field 3 onward; the start time is field 22.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            return fields.count > 19 ? UInt64(fields[19]) : nil
        }
    }

    /// A lock not refreshed for this long is stale: its writer is gone (restic's rule, 30 minutes).
    static let staleAfter: TimeInterval = 30 * 60
    /// How often a held lock is written again.
    static let refreshEvery: Duration = .seconds(5 * 60)

    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }

    static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }

    /// Takes the writer lock: ours is written, then the others are read; another writer's fresh
    /// lock makes it busy (ours is removed again: two writers starting together both back off
    /// rather than both run).
    func acquireLock(for purpose: String) async throws -> RemoteLock {
        try await rcloneStep("taking the repository's lock") {
            let lock = RemoteLock(name: UUID().uuidString.lowercased(), record: .now(purpose: purpose))
            try await rclone.write(Array(try Self.encoder().encode(lock.record)), to: "locks/" + lock.name)
            if let holder = try await busyHolder(except: lock.name) {
                try? await rclone.deleteFile("locks/" + lock.name)
                throw BackupError.repositoryBusy(path: location.description, holder: holder)
            }
            lock.confirm()
            lock.startRefreshing(self, every: Self.refreshEvery)
            return lock
        }
    }

    /// Who holds the repository, other than the lock `own`: nil when nobody does.
    private func busyHolder(except own: String?) async throws -> String? {
        try await freshLocks(except: own).sorted { $0.key < $1.key }.first?.value
    }

    /// The fresh locks other than `own`, each with its holder described. Stale locks — not
    /// refreshed for 30 minutes, or their process gone from this machine — hold nobody back and
    /// are removed (as restic removes them). A lock file that cannot be read or parsed counts as
    /// fresh until its file is 30 minutes old.
    func freshLocks(except own: String?) async throws -> [String: String] {
        var fresh: [String: String] = [:]
        for (name, item) in try await rclone.listFilesWithTimes("locks") where name != own && !name.contains("/") {
            let age = item.modified.map { Date().timeIntervalSince($0) } ?? 0
            guard let record = try? Self.decoder().decode(LockRecord.self, from: await rclone.read("locks/" + name))
            else {
                if age > Self.staleAfter {
                    try? await rclone.deleteFile("locks/" + name)
                    continue
                }
                fresh[name] = "an unreadable lock \(name), \(Int(age / 60)) minutes old"
                continue
            }
            if record.writerIsGone || Date().timeIntervalSince(record.refreshed) > Self.staleAfter {
                try? await rclone.deleteFile("locks/" + name)
                continue
            }
            fresh[name] = "\(record.purpose) by pid \(record.pid) on \(record.host), lock \(name)"
        }
        return fresh
    }

    /// Throws unless `lock` is still held: checked before each authentication record is sent,
    /// so that a writer whose lock another process removed (judging it stale) vouches for
    /// nothing more. Lost (by a refresh), or not rewritten for 10 minutes: refused. Seen in
    /// place less than `confirmedWithin` ago (5 minutes) with no other writer's lock about, it is
    /// not read again: no process judges a lock stale that young unless its clock is 25 minutes
    /// off. Otherwise it is refreshed now (read back, rewritten, the others listed).
    func check(_ lock: RemoteLock, confirmedWithin: Duration = refreshEvery) async throws {
        func refuse(_ why: String) -> BackupError {
            .remoteFailed(location.description, reason: why + "; nothing more was sent: run it again")
        }
        if let why = lock.lostReason { throw refuse(why) }
        if lock.sinceConfirmed > RemoteLock.lostAfter {
            lock.markLost(
                "the repository's lock \(lock.name) could not be refreshed for \(Int(RemoteLock.lostAfter.components.seconds / 60)) minutes"
            )
            throw refuse(lock.lostReason!)
        }
        guard lock.sinceConfirmed >= confirmedWithin || lock.hasSuspects else { return }
        switch await lock.refreshOnce(self) {
        case .refreshed: return
        case .lost(let why):
            lock.markLost(why)
            throw refuse(why)
        case .failed:
            throw BackupError.remoteFailed(
                location.description,
                reason: "checking the repository's lock failed; nothing more was sent: run it again")
        }
    }

    /// Stops refreshing the lock and removes its file (a failure leaves it to go stale).
    func releaseLock(_ lock: RemoteLock) async {
        await lock.stop()
        // Also after Ctrl-C: not cancelled with the task that was.
        let rclone = self.rclone
        await Task.detached { try? await rclone.deleteFile("locks/" + lock.name) }.value
    }

    /// Runs `body` under the lock for `purpose`, releasing it however `body` ends.
    func withLock<T>(for purpose: String, _ body: (RemoteLock) async throws -> T) async throws -> T {
        let lock = try await acquireLock(for: purpose)
        do {
            let result = try await body(lock)
            await releaseLock(lock)
            return result
        } catch {
            await releaseLock(lock)
            throw error
        }
    }
}
