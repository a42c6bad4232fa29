import DataProtection
@testable import DataProtectionBackup
import DataProtectionTestSupport
import Foundation
import Testing

/// An interrupted backup (its task cancelled, as Ctrl-C does in dpctl) says how far it got, and
/// the next run does not copy again what it stored — plain files included, which are sealed
/// anew (with a new key) every time they are copied.
@Suite struct InterruptedBackupTests {
    @Test func theNextBackupResumesWithoutCopyingAgain() async throws {
        let bench = try await BackupBench.make()
        let (base, files, repository, source) = (bench.base, bench.files, bench.repository, bench.source)
        for n in 0..<20 {
            if n % 2 == 0 {
                try await files.write(Data("protected \(n)".utf8), to: source.appendingPathComponent("f\(n)"), protection: .complete)
            } else {
                try Data("plain \(n)".utf8).write(to: source.appendingPathComponent("f\(n)"))
            }
        }
        // In a task of its own, cancelled from inside once 7 files are stored.
        let firstLog = LogLines()
        let interrupted = await Task {
            try await BackupEngine(source: source, repository: repository, files: files).run(log: { firstLog.append($0) }, progress: { done in
                if done.items == 7 { withUnsafeCurrentTask { $0?.cancel() } }
            })
        }.result
        guard case .failure(BackupError.interrupted(let stored, let total)) = interrupted else {
            Issue.record("not interrupted: \(interrupted)")
            return
        }
        // Files are copied two or more at a time: those whose copy had finished are stored too.
        #expect((7...7 + BackupEngine.copyWorkers).contains(stored) && total == 20)
        // Every file counted as stored was logged as backed up: none finished and was dropped.
        #expect(firstLog.lines.filter { $0.hasPrefix("Backed up: ") }.count == stored)
        #expect(repository.finishedBackups().isEmpty)
        #expect(repository.listBackups().map(\.isComplete) == [false])
        var logged: [String] = []
        let resumed = try await BackupEngine(source: source, repository: repository, files: files).run(log: { logged.append($0) })
        #expect(resumed.filesCopied == 20 - stored && resumed.files == 20)
        #expect(logged.filter { $0.hasPrefix("Backed up: ") }.count == 20 - stored)
        #expect(try await RestoreEngine(backup: repository.finishedBackups()[0]).verify(files: files, password: nil) == 20)
        // The finished backup's index now covers everything: no partial index is left.
        let engine = BackupEngine(source: source, repository: repository, files: files)
        #expect(!FileManager.default.fileExists(atPath: engine.partialIndexURL.path))
        #expect(try FileManager.default.contentsOfDirectory(atPath: engine.indexURL.deletingLastPathComponent().path) == [engine.indexURL.lastPathComponent])
        let restored = base.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: repository.finishedBackups()[0]).restore(to: restored, files: files, password: nil)
        for n in [0, 1, 18, 19] {
            let expected = Data((n % 2 == 0 ? "protected \(n)" : "plain \(n)").utf8)
            #expect(try await files.contents(of: restored.appendingPathComponent("f\(n)")) == expected)
        }
        // An interrupted restore leaves nothing, and says so.
        let halfway = base.appendingPathComponent("halfway")
        let stopped = await Task {
            try await RestoreEngine(backup: repository.finishedBackups()[0]).restore(to: halfway, files: files, password: nil, progress: { done in
                if done.items == 5 { withUnsafeCurrentTask { $0?.cancel() } }
            })
        }.result
        guard case .failure(BackupError.restoreInterrupted(let path)) = stopped else { Issue.record("not interrupted: \(stopped)"); return }
        #expect(path == halfway.path)
        #expect(!FileManager.default.fileExists(atPath: halfway.path))
        #expect(try FileManager.default.contentsOfDirectory(atPath: base.path).filter { $0.contains("dp-restore") }.isEmpty)
        // prune then removes the interrupted backup's directory; nothing the finished one uses.
        let pruned = try repository.prune()
        #expect(pruned.incompleteBackupsRemoved.count == 1 && pruned.objectsRemoved == 0)
    }
}

/// Lines a log closure receives, kept for a test.
private final class LogLines: @unchecked Sendable {
    private(set) var lines: [String] = []
    func append(_ line: String) { lines.append(line) }
}
