import DataProtection
import Foundation

extension RemoteRepository {
    /// A writer's lock file (`locks/ID`, FORMAT.md §5.3), kept fresh while it is held.
    final class RemoteLock: Sendable {
        let name: String
        let refresher: Task<Void, Never>
        init(name: String, refresher: Task<Void, Never>) {
            self.name = name
            self.refresher = refresher
        }
    }

    /// What a lock file holds (JSON).
    struct LockRecord: Codable {
        var host: String
        var pid: Int32
        var purpose: String
        var refreshed: Date
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

    /// Takes the writer lock: refused as busy when another writer's fresh lock is there, before
    /// or just after ours is written (then ours is removed again: two writers starting together
    /// both back off rather than both run).
    func acquireLock(for purpose: String) throws -> RemoteLock {
        func busyHolder(except own: String?) throws -> String? {
            for name in try rclone.listFiles("locks").keys where name != own && !name.contains("/") {
                guard let record = try? Self.decoder().decode(LockRecord.self, from: rclone.read("locks/" + name)) else { continue }
                // A stale lock — not refreshed for 30 minutes, or its process gone from this
                // host — holds nobody back, and is removed (as restic removes them).
                let gone = record.host == ProcessInfo.processInfo.hostName && record.pid != getpid() && kill(record.pid, 0) != 0 && errno == ESRCH
                if gone || Date().timeIntervalSince(record.refreshed) > Self.staleAfter {
                    try? rclone.deleteFile("locks/" + name)
                    continue
                }
                return "\(record.purpose) by pid \(record.pid) on \(record.host), lock \(name)"
            }
            return nil
        }
        do {
            if let holder = try busyHolder(except: nil) { throw BackupError.repositoryBusy(path: location.description, holder: holder) }
            let name = UUID().uuidString.lowercased()
            let record = LockRecord(host: ProcessInfo.processInfo.hostName, pid: getpid(), purpose: purpose, refreshed: Date())
            try rclone.write(Array(try Self.encoder().encode(record)), to: "locks/" + name)
            if let holder = try busyHolder(except: name) {
                try? rclone.deleteFile("locks/" + name)
                throw BackupError.repositoryBusy(path: location.description, holder: holder)
            }
            let rclone = self.rclone
            let refresher = Task {
                while !Task.isCancelled {
                    try? await Task.sleep(for: Self.refreshEvery)
                    if Task.isCancelled { break }
                    var fresh = record
                    fresh.refreshed = Date()
                    if let bytes = try? Self.encoder().encode(fresh) { try? rclone.write(Array(bytes), to: "locks/" + name) }
                }
            }
            return RemoteLock(name: name, refresher: refresher)
        } catch let failure as Rclone.Failure {
            throw failed(failure, "taking the repository's lock")
        }
    }

    /// Removes the lock file (a failure leaves it to go stale).
    func releaseLock(_ lock: RemoteLock) {
        lock.refresher.cancel()
        try? rclone.deleteFile("locks/" + lock.name)
    }
}
