import DataProtection
@testable import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// forget's policies on backups made on a virtual clock (which are kept, exactly), grouping by
/// directory, planted backups left alone, and prune: what it removes, what it keeps, and that it
/// never runs beside a backup.
@Suite struct ForgetAndPruneTests {
    static func utc() -> Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar
    }

    static func date(_ text: String) -> Date { ISO8601DateFormatter().date(from: text)! }

    @Test func periodsAreCountedFromTheNewestBackupAsResticCountsThem() {
        let policy = BackupRetentionPolicy(keepWeekly: 2)
        // 2026-12-31 (Thursday) and 2027-01-01 (Friday) are both in ISO week 53 of 2026.
        let backups = [("a", Self.date("2026-12-24T12:00:00Z")), ("b", Self.date("2026-12-31T12:00:00Z")),
                       ("c", Self.date("2027-01-01T12:00:00Z")), ("d", Self.date("2026-12-10T12:00:00Z"))]
        let decisions = policy.decide(backups.map { (id: $0.0, created: $0.1) }, calendar: Self.utc())
        #expect(decisions.map(\.id) == ["c", "b", "a", "d"])
        #expect(decisions.filter(\.isKept).map(\.id) == ["c", "a"])
        #expect(BackupRetentionPolicy(keepLast: 2).decide(backups.map { (id: $0.0, created: $0.1) }).filter(\.isKept).map(\.id) == ["c", "b"])
        #expect(!BackupRetentionPolicy().keepsSomething)
        // Fewer days with a backup than asked for: the oldest is kept too (restic 0.17).
        let spare = BackupRetentionPolicy(keepDaily: 7).decide([("x", Self.date("2026-12-24T08:00:00Z")), ("y", Self.date("2026-12-24T12:00:00Z")),
                                                                 ("z", Self.date("2026-12-25T12:00:00Z"))], calendar: Self.utc())
        #expect(spare.map(\.reasons) == [[.daily], [.daily], [.oldest]])
        // Two of the same second keep the order given (oldest first).
        let same = Self.date("2026-12-24T08:00:00Z")
        #expect(BackupRetentionPolicy(keepLast: 1).decide([("b", same), ("a", same)]).filter(\.isKept).map(\.id) == ["a"])
    }

    @Test func forgetKeepsExactlyWhatThePolicySaysPerDirectoryAndLeavesPlantedBackupsAlone() async throws {
        let base = temporaryDirectory()
        let keybag = try await Keybag.create(root: base.appendingPathComponent("device").path, passcode: nil, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        let repository = BackupRepository(url: base.appendingPathComponent("repo"))
        let documents = base.appendingPathComponent("Documents"), photos = base.appendingPathComponent("Photos")
        for directory in [documents, photos] { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        let clock = ManualClock(start: Self.date("2026-01-05T10:00:00Z"))
        var ids: [String: String] = [:]
        let times = ["b1": "2026-01-05T10:00:00Z", "b2": "2026-01-20T10:00:00Z", "b3": "2026-02-10T10:00:00Z", "b4": "2026-02-11T09:00:00Z",
                     "b5": "2026-02-11T15:00:00Z", "b6": "2026-02-12T08:00:00Z", "b7": "2026-02-12T20:00:00Z"]
        for name in times.keys.sorted() {
            clock.advance(by: Self.date(times[name]!).timeIntervalSince(clock.now()))
            try await files.write(Data("version \(name)".utf8), to: documents.appendingPathComponent("notes.txt"), protection: .complete)
            ids[name] = try await BackupEngine(source: documents, repository: repository, files: files, clock: clock).run().backup
        }
        clock.advance(by: 3600)
        try Data("photo".utf8).write(to: photos.appendingPathComponent("p.jpg"))
        let photoBackup = try await BackupEngine(source: photos, repository: repository, files: files, clock: clock).run().backup
        // A planted backup: a real one copied under a newer ID (the ID is authenticated).
        let planted = "20260301T000000Z-deadbeef"
        try FileManager.default.copyItem(at: repository.backups.appendingPathComponent(ids["b6"]!), to: repository.backups.appendingPathComponent(planted))

        let policy = BackupRetentionPolicy(keepLast: 1, keepDaily: 2, keepMonthly: 2)
        let dry = try await repository.forget(policy: policy, files: files, password: nil, calendar: Self.utc(), dryRun: true)
        #expect(repository.finishedBackups().count == 9)   // a dry run removes nothing
        let report = try await repository.forget(policy: policy, files: files, password: nil, calendar: Self.utc())
        #expect(dry.kept == report.kept && dry.removed == report.removed)
        let kept = Dictionary(uniqueKeysWithValues: report.kept.map { ($0.id, $0.reasons) })
        #expect(kept == [ids["b7"]!: ["last", "daily", "monthly"], ids["b5"]!: ["daily"], ids["b2"]!: ["monthly"],
                         photoBackup: ["last", "daily", "monthly"]])
        #expect(Set(report.removed.map(\.id)) == Set(["b1", "b3", "b4", "b6"].map { ids[$0]! }))
        #expect(report.leftAlone.map(\.id) == [planted])
        #expect(Set(repository.finishedBackups().map(\.lastPathComponent)) == Set(kept.keys).union([planted]))

        // Prune: what only forgotten backups used goes; every kept backup verifies and restores.
        let objectsBefore = try Self.objectCount(repository)
        let pruned = try repository.prune()
        #expect(pruned.objectsRemoved == 3 && pruned.objectsKept == objectsBefore - 3)   // b1's, b3's and b4's notes (b6's: the planted copy)
        #expect(try Self.objectCount(repository) == objectsBefore - 3)
        for id in kept.keys {
            #expect(try await RestoreEngine(backup: repository.backups.appendingPathComponent(id)).verify(files: files, password: nil) > 0)
        }
        let restored = base.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: repository.backups.appendingPathComponent(ids["b2"]!)).restore(to: restored, files: files, password: nil)
        #expect(try await files.contents(of: restored.appendingPathComponent("notes.txt")) == Data("version b2".utf8))
        #expect(try repository.prune().objectsRemoved == 0)

        // By ID: the planted backup too; an unknown ID removes nothing.
        #expect(throws: BackupError.noSuchBackup(id: "nope")) { _ = try repository.forget(ids: [planted, "nope"]) }
        #expect(repository.finishedBackups().contains { $0.lastPathComponent == planted })
        #expect(try repository.forget(ids: [planted]).removed.map(\.id) == [planted])
        await #expect(throws: BackupError.emptyRetentionPolicy) {
            _ = try await repository.forget(policy: BackupRetentionPolicy(), files: files, password: nil)
        }
    }

    /// A prune never runs beside a backup: tried while a backup is under way (from its progress),
    /// it is refused as busy and removes nothing; the backup finishes and verifies. Incomplete
    /// backups and the remains of an interrupted forget go with the next prune.
    @Test func pruneAndBackupNeverOverlap() async throws {
        let bench = try await BackupBench.make()
        let (base, files, repository, source) = (bench.base, bench.files, bench.repository, bench.source)
        for n in 0..<3 { try Data("file \(n)".utf8).write(to: source.appendingPathComponent("f\(n)")) }
        let first = try await BackupEngine(source: source, repository: repository, files: files).run().backup
        // Its objects are used by no finished backup once it is forgotten: fair game for a prune, but not during the next backup.
        _ = try repository.forget(ids: [first])
        nonisolated(unsafe) var during: Result<PruneReport, any Error>?
        let summary = try await BackupEngine(source: source, repository: repository, files: files).run(progress: { _ in
            if during == nil { during = Result { try repository.prune() } }
        })
        guard case .failure(BackupError.repositoryBusy(_, let holder))? = during else { Issue.record("prune ran during a backup: \(String(describing: during))"); return }
        #expect(holder?.contains("pid \(getpid())") == true)
        #expect(try await RestoreEngine(backup: repository.backups.appendingPathComponent(summary.backup)).verify(files: files, password: nil) == 3)

        // A prune holding the lock: a backup is refused and writes nothing.
        let lock = try repository.lockForWriting()
        await #expect(throws: BackupError.self) { _ = try await BackupEngine(source: source, repository: repository, files: files).run() }
        lock.release()
        #expect(repository.finishedBackups().count == 1)

        let killed = repository.backups.appendingPathComponent("20260101T000000Z-0badf00d.incomplete")
        let halfForgotten = repository.backups.appendingPathComponent(".forgotten-20260101T000000Z-00000001")
        for directory in [killed, halfForgotten] { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        let pruned = try repository.prune()
        #expect(pruned.incompleteBackupsRemoved == ["20260101T000000Z-0badf00d.incomplete"])
        #expect(pruned.forgottenBackupsRemoved == [".forgotten-20260101T000000Z-00000001"])
        #expect(pruned.objectsRemoved == 0 && pruned.objectsKept == 3)
        #expect(try FileManager.default.contentsOfDirectory(atPath: repository.backups.path) == [summary.backup])

        // A planted `objects/ab -> elsewhere` (another tool's repository, named the same way) is
        // never emptied, nor is a planted `backups/X.incomplete -> elsewhere` followed.
        let elsewhere = base.appendingPathComponent("restic-data")
        try FileManager.default.createDirectory(at: elsewhere, withIntermediateDirectories: true)
        let theirs = elsewhere.appendingPathComponent("ab" + String(repeating: "0", count: 62))
        try Data("their pack".utf8).write(to: theirs)
        try? FileManager.default.removeItem(at: repository.objects.appendingPathComponent("ab"))
        try FileManager.default.createSymbolicLink(at: repository.objects.appendingPathComponent("ab"), withDestinationURL: elsewhere)
        try FileManager.default.createSymbolicLink(at: repository.backups.appendingPathComponent("20260101T000000Z-00000002.incomplete"),
                                                   withDestinationURL: elsewhere)
        _ = try repository.prune()
        #expect(FileManager.default.fileExists(atPath: theirs.path))
        #expect(try FileManager.default.contentsOfDirectory(atPath: repository.backups.path) == [summary.backup])
    }

    static func objectCount(_ repository: BackupRepository) throws -> Int {
        (FileManager.default.enumerator(atPath: repository.url.appendingPathComponent("objects").path)?.allObjects as? [String] ?? [])
            .filter { $0.count == 67 }.count
    }
}
