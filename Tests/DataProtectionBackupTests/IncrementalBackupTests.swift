import DataProtection
@testable import DataProtectionBackup
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// Big files stored in chunks (FORMAT.md §5.2): a protected file with 1 % of its segments
/// rewritten costs about 1 % of its size in the next backup, not all of it — measured on the
/// repository's size — and every backup restores its own version byte for byte.
@Suite struct IncrementalBackupTests {
    /// Rewrites `count` distinct segments of a protected file at random (100 bytes at the start of each).
    static func rewriteSegments(of url: URL, files: ProtectedFileManager, segmentPlaintext: Int64, count: Int,
                                into expected: inout [UInt8]) async throws {
        let segments = Int64(expected.count) / segmentPlaintext
        var chosen = Set<Int64>()
        while chosen.count < count { chosen.insert(Int64.random(in: 1..<segments)) }
        let handle = try await files.openHandle(forUpdating: url)
        for segment in chosen {
            let offset = segment * segmentPlaintext
            let patch = (0..<100).map { _ in UInt8.random(in: 0...255) }
            try await handle.write(patch, at: offset)
            expected.replaceSubrange(Int(offset)..<Int(offset) + 100, with: patch)
        }
        try await handle.close()
    }

    @Test(arguments: [ProtectedFileAccessPattern.randomAccess, .sequential])
    func aProtectedFileWithOnePercentOfItsSegmentsRewrittenCostsAboutThatMuch(access: ProtectedFileAccessPattern) async throws {
        let bench = try await BackupBench.make()
        let url = bench.source.appendingPathComponent("journal.bin")
        var content = [UInt8](try #require(FileHandle(forReadingAtPath: "/dev/urandom")).readData(ofLength: 24 << 20))
        try await bench.files.write(Data(content), to: url, protection: .completeUntilFirstUserAuthentication, access: access)
        let original = content
        let fileSize = Int64(try FileManager.default.attributesOfItem(atPath: url.path)[.size] as! Int)

        let engine = BackupEngine(source: bench.source, repository: bench.repository, files: bench.files)
        let first = try await engine.run()
        #expect(first.filesCopied == 1)
        let afterFirst = regularFileBytes(under: bench.repository.url)
        #expect(afterFirst >= fileSize)

        // 1 % of the segments, each rewritten where it lies (new nonces there only).
        let (first0, stride) = try #require(try ItemInspector.segmentBoundaries(ofFileAt: url.path))
        #expect(first0 > 0)
        let segmentPlaintext = Int64(stride - 28)
        let segments = Int(fileSize / Int64(stride))
        try await Self.rewriteSegments(of: url, files: bench.files, segmentPlaintext: segmentPlaintext,
                                       count: max(1, segments / 100), into: &content)
        let second = try await engine.run()
        #expect(second.filesCopied == 1)
        let growth = regularFileBytes(under: bench.repository.url) - afterFirst
        // At most 5 % of the file (the target), and at least the rewritten segments: something was stored.
        #expect(growth <= fileSize / 20, "the second backup added \(growth) bytes for a \(fileSize)-byte file")
        #expect(growth >= Int64(segments / 100) * Int64(stride))
        #expect(second.bytesCopied <= fileSize / 20)

        // An unchanged third run stores nothing new but its own records.
        let beforeThird = regularFileBytes(under: bench.repository.url)
        let third = try await engine.run()
        #expect(third.filesCopied == 0)
        #expect(regularFileBytes(under: bench.repository.url) - beforeThird < 64 << 10)

        // Each backup restores its own version, byte for byte; the repository verifies.
        for (backup, expected) in [(first.backup, original), (second.backup, content)] {
            let restored = bench.base.appendingPathComponent("restored-\(backup)")
            let backupURL = bench.repository.url.appendingPathComponent("backups/\(backup)")
            #expect(try await RestoreEngine(backup: backupURL).verify(files: bench.files, password: nil) >= 2)
            _ = try await RestoreEngine(backup: backupURL).restore(to: restored, files: bench.files, password: nil)
            #expect([UInt8](try await bench.files.contents(of: restored.appendingPathComponent("journal.bin"))) == expected)
        }

        // One byte altered in the second backup's new pack: verify names the file, a restore
        // leaves it out and names it; the first backup, which does not use that pack, is intact.
        let secondBackup = bench.repository.url.appendingPathComponent("backups/\(second.backup)")
        let manifest = try await RestoreEngine(backup: secondBackup).manifest(files: bench.files, password: nil)
        let entry = try #require(try manifest.entries().first { $0.path == "journal.bin" })
        #expect(entry.chunked)
        let list = try bench.repository.chunkList(try #require(entry.sha256), size: entry.size)
        let firstManifest = try await RestoreEngine(backup: bench.repository.url.appendingPathComponent("backups/\(first.backup)"))
            .manifest(files: bench.files, password: nil)
        let firstEntry = try #require(try firstManifest.entries().first { $0.path == "journal.bin" })
        let firstPacks = Set(try bench.repository.chunkList(try #require(firstEntry.sha256), size: firstEntry.size).packs)
        let newPack = try #require(list.packs.first { !firstPacks.contains($0) })
        let packURL = bench.repository.objectURL(newPack)
        var packBytes = [UInt8](try Data(contentsOf: packURL))
        packBytes[packBytes.count / 2] ^= 0x01
        try Data(packBytes).write(to: packURL)
        let verification = try await RestoreEngine(backup: secondBackup).verification(files: bench.files, password: nil)
        #expect(verification.problems.map(\.object) == [newPack])
        #expect(verification.problems.first?.files == ["journal.bin"])
        let damaged = try await RestoreEngine(backup: secondBackup)
            .restore(to: bench.base.appendingPathComponent("damaged"), files: bench.files, password: nil)
        #expect(damaged.damagedFiles.map(\.path) == ["journal.bin"])
        #expect(!FileManager.default.fileExists(atPath: bench.base.appendingPathComponent("damaged/journal.bin").path))
        #expect(try await RestoreEngine(backup: bench.repository.url.appendingPathComponent("backups/\(first.backup)"))
            .verify(files: bench.files, password: nil) >= 2)
    }

    /// Segments longer than a chunk may be (format 1 allows 16 MiB) keep the file whole: it
    /// restores, and verifies.
    @Test func aFileOfSixteenMebibyteSegmentsIsStoredWhole() async throws {
        let bench = try await BackupBench.make()
        var files = bench.files
        files.segmentSizeLog2 = 24
        let url = bench.source.appendingPathComponent("video.bin")
        let content = try #require(FileHandle(forReadingAtPath: "/dev/urandom")).readData(ofLength: (16 << 20) + 5000)
        try await files.write(content, to: url, protection: .completeUntilFirstUserAuthentication)
        let summary = try await BackupEngine(source: bench.source, repository: bench.repository, files: bench.files).run()
        let backup = bench.repository.url.appendingPathComponent("backups/\(summary.backup)")
        let entry = try #require(try await RestoreEngine(backup: backup).manifest(files: bench.files, password: nil).entries().first { $0.path == "video.bin" })
        #expect(!entry.chunked)
        #expect(try await RestoreEngine(backup: backup).verify(files: bench.files, password: nil) == 1)
        let restored = bench.base.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: backup).restore(to: restored, files: bench.files, password: nil)
        #expect(try await bench.files.contents(of: restored.appendingPathComponent("video.bin")) == content)
    }

    /// A backup whose manifest is in format 3 — as every release before chunks wrote it — still
    /// restores: the reader takes formats 2, 3 and 4.
    @Test func aFormatThreeBackupStillRestores() async throws {
        let bench = try await BackupBench.make()
        try Data("plain".utf8).write(to: bench.source.appendingPathComponent("a.txt"))
        try await bench.files.write(Data("protected".utf8), to: bench.source.appendingPathComponent("b.txt"), protection: .complete)
        let summary = try await BackupEngine(source: bench.source, repository: bench.repository, files: bench.files).run()
        let backup = bench.repository.url.appendingPathComponent("backups/\(summary.backup)")
        let entries = try await RestoreEngine(backup: backup).manifest(files: bench.files, password: nil).entries()

        // The same backup, its manifest written in format 3's schema and authenticated again.
        let old = try DatabaseQueue()
        try await old.write { db in
            try db.execute(sql: """
                CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE entry(path BLOB PRIMARY KEY, kind TEXT NOT NULL, mode INTEGER NOT NULL, mtime DOUBLE NOT NULL,
                                   size INTEGER NOT NULL, protectionClass INTEGER, sha256 TEXT, linkTarget BLOB,
                                   thisDeviceOnly BOOLEAN NOT NULL DEFAULT 0, sealed BOOLEAN NOT NULL DEFAULT 0, defaultClass INTEGER);
                INSERT INTO meta VALUES ('format', '3'), ('id', '\(summary.backup)');
                """)
            for e in entries {
                try db.execute(sql: "INSERT INTO entry VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", arguments: [
                    Data(LosslessPath.bytes(of: e.path)), e.kind.rawValue, e.mode, e.mtime, e.size, e.protectionClass,
                    e.sha256, e.linkTarget.map { Data(LosslessPath.bytes(of: $0)) }, e.thisDeviceOnly, e.sealed, e.defaultClass])
            }
        }
        let manifest = BackupManifest(queue: old, format: 3)
        let manifestURL = backup.appendingPathComponent(BackupManifest.fileName)
        try FileManager.default.removeItem(at: manifestURL)
        try await bench.files.write(try manifest.serialized(), to: manifestURL, protection: .completeUnlessOpen)
        let objectList = [UInt8](try Data(contentsOf: backup.appendingPathComponent(BackupRepository.objectListName)))
        let contents = BackupAuthentication.Contents(backupID: summary.backup, manifest: [UInt8](try Data(contentsOf: manifestURL)),
                                                     objectList: objectList, backupKeybag: nil)
        let record = BackupAuthentication(keybagID: bench.files.keybag.id, contents: contents,
                                          key: try await bench.files.keybag.backupAuthenticationKey())
        try Data(record.encoded).write(to: backup.appendingPathComponent(BackupAuthentication.fileName))

        #expect(try await RestoreEngine(backup: backup).manifest(files: bench.files, password: nil).format == 3)
        let restored = bench.base.appendingPathComponent("restored")
        let result = try await RestoreEngine(backup: backup).restore(to: restored, files: bench.files, password: nil)
        #expect(result.files == 2)
        #expect(try String(contentsOf: restored.appendingPathComponent("a.txt"), encoding: .utf8) == "plain")
        #expect(String(decoding: try await bench.files.contents(of: restored.appendingPathComponent("b.txt")), as: UTF8.self) == "protected")
    }

    /// A chunk list is parsed defensively: every defect is named, none traps.
    @Test func aDamagedChunkListIsNamedNeverTrusted() throws {
        let sha = [UInt8](repeating: 0xAB, count: 32)
        let good = BackupChunkList(packs: [String(repeating: "cd", count: 32)],
                                   chunks: [.init(pack: 0, offset: 0, length: 4096, sha256: sha), .init(pack: 0, offset: 4096, length: 10, sha256: sha)])
        let bytes = good.encoded()
        #expect(bytes.count == 20 + 32 + 2 * 48)
        // FORMAT.md §5.2's vector, as the document writes it.
        let vector = "89445042430d0a1a 0001 0000 00000001 00000002 " + String(repeating: "cd", count: 32)
            + " 00000000 00001000 0000000000000000 " + String(repeating: "ab", count: 32)
            + " 00000000 0000000a 0000000000001000 " + String(repeating: "ab", count: 32)
        #expect(bytes.hex == vector.replacingOccurrences(of: " ", with: ""))
        let format = try String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../docs/FORMAT.md").standardizedFileURL, encoding: .utf8)
        #expect(format.contains("    00000000 0000000a 0000000000001000\n    " + String(repeating: "ab", count: 32)))
        #expect(format.contains("    89445042430d0a1a 0001 0000 00000001 00000002\n    " + String(repeating: "cd", count: 32)))
        #expect(try BackupChunkList.parse(bytes, size: 4106) == good)
        func reason(_ bytes: [UInt8], size: Int64 = 4106) -> String? {
            do { _ = try BackupChunkList.parse(bytes, size: size); return nil } catch { return "\(error)" }
        }
        #expect(reason(bytes, size: 4107) == "its chunks are shorter than the file")
        #expect(reason(bytes, size: 4105) == "its chunks are longer than the file")
        #expect(reason(Array(bytes.dropLast())) == "its length does not match its counts")
        #expect(reason(Array(bytes.prefix(10))) == "it is cut short")
        var badPack = bytes
        badPack[20 + 32 + 3] = 1   // the first chunk names pack 1 of 1
        #expect(reason(badPack) == "a chunk names pack 1 of 1")
        var zeroLength = bytes
        zeroLength[20 + 32 + 4 ..< 20 + 32 + 8] = [0, 0, 0, 0]
        #expect(reason(zeroLength) == "a chunk of 0 bytes")
        var version = bytes
        version[9] = 2
        #expect(reason(version)?.contains("version 2") == true)
        #expect(reason([UInt8](repeating: 0, count: 40)) == "not a chunk list")
    }
}
