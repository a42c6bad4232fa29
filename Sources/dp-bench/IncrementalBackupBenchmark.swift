import DataProtection
import DataProtectionBackup
import DataProtectionSQLite
import DataProtectionTestSupport
import Foundation
import GRDB

/// The incremental half of `dp-bench backup`: a big class-managed database and a big protected
/// file, each with 1 % of its pages or segments rewritten, backed up again — what the second
/// backup adds to the repository, beside what restic adds for the same change in the same run.
struct IncrementalBackupFigures {
    var databaseBytes: Int64
    var oursDatabase: Int64
    var resticDatabase: Int64?
    var fileBytes: Int64
    var oursFile: Int64
    var resticFile: Int64?
    var oursSeconds: Double
    var resticSeconds: Double?

    static func measure(in base: URL, mebibytes: Int, keybag: Keybag) async throws -> IncrementalBackupFigures {
        let source = base.appendingPathComponent("big")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        let files = ProtectedFileManager(keybag: keybag)

        // A class-C database of about `mebibytes` MiB: one 3,000-byte row per 4 KiB page.
        let databaseURL = source.appendingPathComponent("mail.db")
        let rows = (mebibytes << 20) / 4096
        let database = try await ProtectedDatabase.open(
            at: databaseURL, keybag: keybag, protection: .completeUntilFirstUserAuthentication, mode: .queue)
        try await database.write { db in
            try db.execute(sql: "CREATE TABLE message(id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
            let insert = try db.makeStatement(sql: "INSERT INTO message(id, body) VALUES (?, randomblob(3000))")
            for id in 1...rows { try insert.execute(arguments: [id]) }
        }
        try await database.close()
        // A protected file of the same size, made for random access (4 KiB pages).
        let fileURL = source.appendingPathComponent("journal.bin")
        let handle = try await files.createFile(
            at: fileURL, protection: .completeUntilFirstUserAuthentication, access: .randomAccess)
        var block = [UInt8](repeating: 0, count: 1 << 20)
        for i in 0..<mebibytes {
            try fillRandom(&block)
            try await handle.write(block, at: Int64(i) << 20)
        }
        try await handle.close()

        var engine = BackupEngine(
            source: source, repository: BackupRepository(url: base.appendingPathComponent("repo-big")), files: files)
        engine.encryptedDatabases = { url in
            await DatabasePageCheck(forDatabaseAt: url, keybag: keybag).map {
                EncryptedPageCheck(pageSize: $0.pageSize, authenticates: $0.authenticates)
            }
        }
        let resticRepository = base.appendingPathComponent("restic-big")
        setenv("RESTIC_REPOSITORY", resticRepository.path, 1)
        let hasRestic = runTool("restic", ["init", "--quiet"]) != nil
        _ = try await engine.run()
        if hasRestic { _ = runTool("restic", ["backup", "--quiet", source.path]) }

        var figures = IncrementalBackupFigures(
            databaseBytes: size(databaseURL), oursDatabase: 0, resticDatabase: nil,
            fileBytes: size(fileURL), oursFile: 0, resticFile: nil, oursSeconds: 0, resticSeconds: nil)
        /// What one more backup adds to each repository (all of it: packs, lists, manifest, records), and its time.
        func backUpAgain() async throws -> (ours: Int64, restic: Int64?) {
            let oursBefore = regularFileBytes(under: engine.repository.url)
            figures.oursSeconds += try await seconds { _ = try await engine.run() }
            let ours = regularFileBytes(under: engine.repository.url) - oursBefore
            guard hasRestic else { return (ours, nil) }
            let resticBefore = regularFileBytes(under: resticRepository)
            let time = await seconds { _ = runTool("restic", ["backup", "--quiet", source.path]) }
            figures.resticSeconds = (figures.resticSeconds ?? 0) + time
            return (ours, regularFileBytes(under: resticRepository) - resticBefore)
        }

        // 1 % of the rows rewritten (so 1 % of the pages); then 1 % of the file's pages.
        let database2 = try await ProtectedDatabase.open(at: databaseURL, keybag: keybag, mode: .queue)
        let changedRows = Set((0..<rows / 100).map { _ in Int.random(in: 1...rows) })
        try await database2.write { db in
            for id in changedRows {
                try db.execute(sql: "UPDATE message SET body = randomblob(3000) WHERE id = ?", arguments: [id])
            }
        }
        try await database2.close()
        (figures.oursDatabase, figures.resticDatabase) = try await backUpAgain()

        let pages = (mebibytes << 20) / 4068
        let update = try await files.openHandle(forUpdating: fileURL)
        var patch = [UInt8](repeating: 0, count: 100)
        for page in Set((0..<pages / 100).map { _ in Int.random(in: 1..<pages) }) {
            try fillRandom(&patch)
            try await update.write(patch, at: Int64(page) * 4068)
        }
        try await update.close()
        (figures.oursFile, figures.resticFile) = try await backUpAgain()
        return figures
    }

    static func size(_ url: URL) -> Int64 {
        Int64((try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int) ?? 0)
    }
}
