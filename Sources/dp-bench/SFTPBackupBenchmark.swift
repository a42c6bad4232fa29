import DataProtection
import DataProtectionBackup
import DataProtectionTestSupport
import Foundation

/// The SFTP half of `dp-bench backup --sftp`: the same tree backed up into an SFTP server on
/// loopback (OpenSSH's sshd and sftp-server, a host key of its own), by us through rclone's SFTP
/// client and by restic's SFTP backend (OpenSSH's `ssh`), each run into a new repository; a
/// first backup and an unchanged re-run, the median of `runs`.
struct SFTPBackupFigures {
    var ours: (first: Double, again: Double)
    var restic: (first: Double, again: Double)?

    static func measure(tree: URL, base: URL, files: ProtectedFileManager, runs: Int) async throws -> SFTPBackupFigures
    {
        let server = try LoopbackServer.sftp(keysIn: base.appendingPathComponent("ssh").path)
        defer { server.server.kill() }
        let served = base.appendingPathComponent("sftp-served")
        try FileManager.default.createDirectory(at: served, withIntermediateDirectories: true)
        for (name, value) in server.environment { setenv(name, value, 1) }

        var ourFirsts: [Double] = [], ourAgains: [Double] = []
        for index in 0..<runs {
            let location = try RemoteLocation("sftp://root@127.0.0.1:\(server.server.port)\(served.path)/ours-\(index)")
            let remote = try RemoteRepository(location: location, layout: files.keybag.layout)
            let engine = BackupEngine(source: tree, repository: remote.staging, files: files)
            ourFirsts.append(try await seconds { _ = try await remote.backUp(with: engine) })
            ourAgains.append(try await seconds { _ = try await remote.backUp(with: engine) })
            try? FileManager.default.removeItem(at: served.appendingPathComponent("ours-\(index)"))
        }

        var resticFirsts: [Double] = [], resticAgains: [Double] = []
        let command = ["-o", "sftp.command=" + server.sshCommand]
        for index in 0..<runs {
            setenv("RESTIC_REPOSITORY", "sftp:root@127.0.0.1:\(served.path)/restic-\(index)", 1)
            guard runTool("restic", ["init", "--quiet"] + command) != nil,
                let first = runTool("restic", ["backup", "--quiet"] + command + [tree.path])?.seconds,
                let again = runTool("restic", ["backup", "--quiet"] + command + [tree.path])?.seconds
            else { break }
            resticFirsts.append(first)
            resticAgains.append(again)
            try? FileManager.default.removeItem(at: served.appendingPathComponent("restic-\(index)"))
        }
        return SFTPBackupFigures(
            ours: (percentile(ourFirsts, 50), percentile(ourAgains, 50)),
            restic: resticFirsts.count == runs ? (percentile(resticFirsts, 50), percentile(resticAgains, 50)) : nil)
    }
}
