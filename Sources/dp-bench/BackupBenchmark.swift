import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import SystemPackage

struct BackupBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Backups of many files and big files vs restic.",
        usage: "dp-bench backup [<options>]",
        discussion: """
            The backup engine on a tree of many files: a first backup and an unchanged re-run, \
            beside tar and restic on the same tree (each the median of --runs runs, each run \
            into a new repository). With --sftp, the same into an SFTP server on loopback \
            (OpenSSH's sshd), beside restic's SFTP backend to the same server. Then a big \
            class-managed database and a big protected file, each with 1 % of its pages \
            rewritten: what the next backup adds, beside restic.
            """)

    @Option(help: "Number of files.") var files = 10_000
    @Option(help: "Total size in MiB.") var sizeMiB = 1024
    @Option(help: "Size of the big database and file in MiB (0: skip).") var bigMiB = 1024
    @Option(help: "Work directory (default: /dev/shm when present).") var dir: String?
    @Option(help: "Runs of each backup (the median is shown).") var runs = 3
    @Flag(help: "Also back up to an SFTP server on loopback (sshd), beside restic's SFTP backend.") var sftp = false

    func run() async throws {
        let workspace = try Workspace("backup", under: dir ?? Workspace.memoryBacked)
        defer { workspace.remove() }
        let base = workspace.base
        let tree = base.appendingPathComponent("tree")
        let perFile = (sizeMiB << 20) / files
        print("dp-bench backup: \(files) files × \(perFile) bytes = \(sizeMiB) MiB in \(base.path)")

        // A tree of 100 directories; a quarter of the files protected (class C), the rest plain.
        let keybag = try await workspace.keybag()
        let protectedFiles = ProtectedFileManager(keybag: keybag)
        var chunk = [UInt8](repeating: 0, count: perFile)
        for i in 0..<files {
            let folder = tree.appendingPathComponent(String(format: "d%03d", i % 100))
            if i < 100 { try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true) }
            try fillRandom(&chunk)
            let url = folder.appendingPathComponent("f\(i).bin")
            if i % 4 == 0 {
                try await protectedFiles.write(chunk, to: url, protection: .completeUntilFirstUserAuthentication)
            } else {
                try Data(chunk).write(to: url)
            }
        }
        let bytes = Double(regularFileBytes(under: tree))
        let mb = bytes / 1e6

        /// The median first backup and unchanged re-run of `runs` runs, each into a new repository.
        func medians(
            _ run: (Int) async throws -> (first: Double, again: Double)?
        ) async rethrows -> (first: Double, again: Double)? {
            var firsts: [Double] = [], agains: [Double] = []
            for index in 0..<max(runs, 1) {
                guard let times = try await run(index) else { return nil }
                firsts.append(times.first)
                agains.append(times.again)
            }
            return (percentile(firsts, 50), percentile(agains, 50))
        }
        let ours = try await medians { index in
            let repository = base.appendingPathComponent("repo-\(index)")
            defer { try? FileManager.default.removeItem(at: repository) }
            let engine = BackupEngine(
                source: tree, repository: BackupRepository(url: repository), files: protectedFiles)
            return (try await seconds { _ = try await engine.run() }, try await seconds { _ = try await engine.run() })
        }!
        let (ourFirst, ourAgain) = ours

        let tar = await medians { index in
            let snar = base.appendingPathComponent("tar-\(index).snar").path
            defer {
                for name in ["full.tar", "incr.tar"] {
                    try? FileManager.default.removeItem(at: base.appendingPathComponent(name))
                }
            }
            guard
                let first = runTool(
                    "tar",
                    [
                        "--listed-incremental=" + snar, "-cf", base.appendingPathComponent("full.tar").path, "-C",
                        tree.path, ".",
                    ])?.seconds,
                let again = runTool(
                    "tar",
                    [
                        "--listed-incremental=" + snar, "-cf", base.appendingPathComponent("incr.tar").path, "-C",
                        tree.path, ".",
                    ])?.seconds
            else { return nil }
            return (first, again)
        }
        let (tarFirst, tarAgain) = (tar?.first, tar?.again)

        setenv("RESTIC_PASSWORD", "bench", 1)
        setenv("RESTIC_CACHE_DIR", base.appendingPathComponent("restic-cache").path, 1)
        let restic = await medians { index in
            let repository = base.appendingPathComponent("restic-\(index)")
            defer { try? FileManager.default.removeItem(at: repository) }
            setenv("RESTIC_REPOSITORY", repository.path, 1)
            guard runTool("restic", ["init", "--quiet"]) != nil,
                let first = runTool("restic", ["backup", "--quiet", tree.path])?.seconds,
                let again = runTool("restic", ["backup", "--quiet", tree.path])?.seconds
            else { return nil }
            return (first, again)
        }
        if restic == nil { print("note: restic not found; `apt-get install restic` for the peer figure") }
        let (resticFirst, resticAgain) = (restic?.first, restic?.again)

        let overSFTP =
            sftp
            ? try await SFTPBackupFigures.measure(tree: tree, base: base, files: protectedFiles, runs: max(runs, 1))
            : nil

        // The big files, after the tree's repositories are gone (memory, on /dev/shm).
        try? FileManager.default.removeItem(at: tree)
        let big =
            bigMiB > 0 ? try await IncrementalBackupFigures.measure(in: base, mebibytes: bigMiB, keybag: keybag) : nil

        let n = Double(files)
        let rows = [
            Row(
                metric: "first backup", ours: n / ourFirst, peerName: "tar --listed-incremental (level 0)",
                peer: tarFirst.map { n / $0 }, unit: "files/s"),
            Row(
                metric: "first backup", ours: mb / ourFirst, peerName: "tar --listed-incremental (level 0)",
                peer: tarFirst.map { mb / $0 }, unit: "MB/s"),
            Row(
                metric: "first backup", ours: n / ourFirst, peerName: "restic backup", peer: resticFirst.map { n / $0 },
                unit: "files/s"),
            Row(
                metric: "first backup", ours: mb / ourFirst, peerName: "restic backup",
                peer: resticFirst.map { mb / $0 }, unit: "MB/s"),
            Row(
                metric: "unchanged re-run", ours: n / ourAgain, peerName: "tar --listed-incremental (level 1)",
                peer: tarAgain.map { n / $0 }, unit: "files/s"),
            Row(
                metric: "unchanged re-run", ours: n / ourAgain, peerName: "restic backup (2nd)",
                peer: resticAgain.map { n / $0 }, unit: "files/s"),
        ]
        print("")
        printTable(rows)
        print("")
        var sftpRows: [Row] = []
        if let overSFTP {
            sftpRows = [
                Row(
                    metric: "first backup over SFTP", ours: mb / overSFTP.ours.first, peerName: "restic backup (sftp:)",
                    peer: overSFTP.restic.map { mb / $0.first }, unit: "MB/s"),
                Row(
                    metric: "unchanged re-run over SFTP", ours: n / overSFTP.ours.again,
                    peerName: "restic backup (sftp:, 2nd)",
                    peer: overSFTP.restic.map { n / $0.again }, unit: "files/s"),
            ]
            printTable(sftpRows)
            print("")
        }
        if let big {
            let mb = { (bytes: Int64) in Double(bytes) / 1e6 }
            let bigRows = [
                Row(
                    metric: "1 % of pages rewritten, \(bigMiB) MiB database: added", ours: mb(big.oursDatabase),
                    peerName: "restic backup (next)", peer: big.resticDatabase.map(mb), unit: "MB",
                    higherIsBetter: false),
                Row(
                    metric: "1 % of pages rewritten, \(bigMiB) MiB protected file: added", ours: mb(big.oursFile),
                    peerName: "restic backup (next)", peer: big.resticFile.map(mb), unit: "MB", higherIsBetter: false),
                Row(
                    metric: "those two backups", ours: big.oursSeconds, peerName: "restic backup (next)",
                    peer: big.resticSeconds,
                    unit: "s", higherIsBetter: false),
            ]
            printTable(bigRows)
            print(
                String(
                    format:
                        "added, as a share of the file: database %.2f %% (restic %@), protected file %.2f %% (restic %@); target ≤ 5 %%",
                    100 * Double(big.oursDatabase) / Double(big.databaseBytes),
                    big.resticDatabase.map { String(format: "%.1f %%", 100 * Double($0) / Double(big.databaseBytes)) }
                        ?? "n/a",
                    100 * Double(big.oursFile) / Double(big.fileBytes),
                    big.resticFile.map { String(format: "%.1f %%", 100 * Double($0) / Double(big.fileBytes)) } ?? "n/a")
            )
            print("")
        }
        func pct(_ bytes: Int64?, _ of: Int64?) -> String {
            guard let bytes, let of, of > 0 else { return "na" }
            return String(format: "%.2f", 100 * Double(bytes) / Double(of))
        }
        func ratio(_ row: Row) -> String { row.ratio.map { String(format: "%.2f", $0) } ?? "na" }
        print(
            "summary: "
                + [
                    "files=\(files)", "mib=\(sizeMiB)",
                    "first_files_per_s=\(format(n / ourFirst))", "first_mbs=\(format(mb / ourFirst))",
                    "rerun_files_per_s=\(format(n / ourAgain))",
                    "tar_first_mbs=\(tarFirst.map { format(mb / $0) } ?? "na")",
                    "restic_first_mbs=\(resticFirst.map { format(mb / $0) } ?? "na")",
                    "first_vs_tar=\(ratio(rows[1]))", "first_vs_restic=\(ratio(rows[3]))",
                    "rerun_vs_tar=\(ratio(rows[4]))", "rerun_vs_restic=\(ratio(rows[5]))", "runs=\(runs)",
                    "sftp_first_vs_restic=\(sftpRows.first.map(ratio) ?? "na")",
                    "sftp_rerun_vs_restic=\(sftpRows.last.map(ratio) ?? "na")",
                    "db_added_pct=\(pct(big?.oursDatabase, big?.databaseBytes))",
                    "restic_db_added_pct=\(pct(big?.resticDatabase, big?.databaseBytes))",
                    "file_added_pct=\(pct(big?.oursFile, big?.fileBytes))",
                    "restic_file_added_pct=\(pct(big?.resticFile, big?.fileBytes))",
                ].joined(separator: " "))
    }
}
