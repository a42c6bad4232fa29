import DataProtectionTestSupport
import Foundation
import Testing

/// Backups to repositories off the device (issue 34): through rclone to a WebDAV server and to an
/// SFTP server (OpenSSH's sshd and sftp-server), both real and on loopback. Only ciphertext and
/// authenticated records reach them; a cut connection leaves nothing that lists as complete, and
/// the next run sends what waited.
@Suite(.serialized) struct RemoteBackupTests {
    static let marker = "REMOTE-PLAINTEXT-MARKER-"

    /// A device and a tree: a plain text file, a big plain file, a big protected file (chunked).
    static func tree(_ cli: CLI) throws -> (passcode: String, source: String) {
        let passcode = cli.file("passcode")
        try Data("123456\n".utf8).write(to: URL(fileURLWithPath: passcode))
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source + "/docs", withIntermediateDirectories: true)
        try Data((marker + "notes").utf8).write(to: URL(fileURLWithPath: source + "/docs/notes.txt"))
        let big = Data(String(repeating: marker, count: 100_000).utf8)
        try big.write(to: URL(fileURLWithPath: source + "/big.txt"))
        let written = try cli.run(["write", source + "/journal.bin", "--class", "C", "--passcode-file", passcode], input: big)
        #expect(written.status == 0, "\(written.stderr)")
        return (passcode, source)
    }

    /// The environment that makes `dav:` an rclone remote for the WebDAV server on `port`.
    static func webDAVRemote(_ port: Int) -> [String: String] {
        ["RCLONE_CONFIG_DAV_TYPE": "webdav", "RCLONE_CONFIG_DAV_URL": "http://127.0.0.1:\(port)/"]
    }

    /// No file the server holds contains a byte string of the plaintext.
    static func holdsNoPlaintext(_ directory: String) -> Bool {
        let walker = FileManager.default.enumerator(atPath: directory)
        while let name = walker?.nextObject() as? String {
            if let bytes = FileManager.default.contents(atPath: directory + "/" + name), bytes.range(of: Data(marker.utf8)) != nil { return false }
        }
        return true
    }

    @Test func aBackupToAWebDAVServerRestoresAndACutConnectionIsResumed() throws {
        let cli = CLI.make()
        let (passcode, source) = try Self.tree(cli)
        let served = cli.file("served")
        try FileManager.default.createDirectory(atPath: served, withIntermediateDirectories: true)
        var server = try LoopbackServer.webDAV(serving: served)
        var env = Self.webDAVRemote(server.port)
        let repo = "rclone:dav:repo"

        let first = try cli.run(["backup", source, repo, "--json"], environment: env)
        #expect(first.status == 0, "\(first.stderr)")
        let listed = try cli.run(["backups", repo], environment: env)
        #expect(listed.status == 0 && listed.out.contains("complete") && !listed.out.contains("incomplete"), "\(listed.out)\(listed.stderr)")
        #expect(try cli.run(["verify", repo], environment: env).status == 0)
        let restored = try cli.run(["restore", repo, cli.file("out-1"), "--passcode-file", passcode], environment: env)
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: source + "/big.txt", andPath: cli.file("out-1/big.txt")))
        #expect(FileManager.default.contentsEqual(atPath: source + "/docs/notes.txt", andPath: cli.file("out-1/docs/notes.txt")))
        #expect(Self.holdsNoPlaintext(served))
        // No lock is left behind by a finished run.
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: served + "/repo/locks")) ?? []).isEmpty)

        // The connection is cut while a backup runs: it is held writing its log into a pipe
        // nobody reads (after taking the lock and listing the objects), the server is killed, the
        // pipe drained. The backup fails and says so; nothing new lists as complete.
        try Data("changed".utf8).write(to: URL(fileURLWithPath: source + "/docs/notes.txt"))
        for n in 0..<400 { try Data("\(n)".utf8).write(to: URL(fileURLWithPath: source + "/docs/\(n)-" + String(repeating: "x", count: 120))) }
        try Self.backUpWhileTheServerDies(cli, source: source, repo: repo, environment: env, server: server)

        // The server comes back (elsewhere): only the first backup lists, and it is complete.
        server = try LoopbackServer.webDAV(serving: served)
        env = Self.webDAVRemote(server.port)
        let between = try cli.run(["backups", repo, "--json"], environment: env)
        let entries = try #require(try JSONSerialization.jsonObject(with: between.stdout) as? [[String: Any]])
        #expect(entries.count == 1 && entries[0]["isComplete"] as? Bool == true, "\(between.out)")
        // The killed run's lock (its process is gone) does not hold the next one back; the
        // backup that waited on this device is sent, then the new one.
        let resumed = try cli.run(["backup", source, repo, "--log"], environment: env)
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(resumed.out.components(separatedBy: "Sent: backup").count == 3, "\(resumed.out)")
        let after = try cli.run(["backups", repo, "--json"], environment: env)
        let all = try #require(try JSONSerialization.jsonObject(with: after.stdout) as? [[String: Any]])
        #expect(all.count == 3 && all.allSatisfy { $0["isComplete"] as? Bool == true }, "\(after.out)")
        #expect((all.last?["path"] as? String)?.hasPrefix(repo + "/backups/") == true, "\(after.out)")
        #expect(try cli.run(["verify", repo], environment: env).status == 0)
        let latest = try cli.run(["restore", repo, cli.file("out-2"), "--passcode-file", passcode], environment: env)
        #expect(latest.status == 0, "\(latest.stderr)")
        #expect(try String(contentsOfFile: cli.file("out-2/docs/notes.txt"), encoding: .utf8) == "changed")
        #expect(Self.holdsNoPlaintext(served))

        // A backup whose authentication record never arrived (a process killed while sending)
        // lists as incomplete and is never restored.
        let newest = try #require(all.last?["id"] as? String)
        try FileManager.default.removeItem(atPath: served + "/repo/backups/\(newest)/authentication")
        let cut = try cli.run(["backups", repo], environment: env)
        #expect(cut.out.split(separator: "\n").contains { $0.hasPrefix(newest) && $0.contains("incomplete") }, "\(cut.out)")
        let named = try cli.run(["restore", repo + "/backups/" + newest, cli.file("out-3"), "--passcode-file", passcode], environment: env)
        #expect(named.status != 0 && named.stderr.contains("incomplete"), "\(named.stderr)")

        // A writer's fresh lock makes a backup busy (75), naming it.
        try FileManager.default.createDirectory(atPath: served + "/repo/locks", withIntermediateDirectories: true)
        let lock = #"{"host":"elsewhere","pid":4242,"purpose":"prune","refreshed":"\#(ISO8601DateFormatter().string(from: Date()))"}"#
        try Data(lock.utf8).write(to: URL(fileURLWithPath: served + "/repo/locks/other"))
        let busy = try cli.run(["backup", source, repo], environment: env)
        #expect(busy.status == 75 && busy.stderr.contains("prune by pid 4242 on elsewhere"), "\(busy.stderr)")

        // forget and prune, remotely: the oldest backup goes, then what no backup uses, and the
        // backup whose record never arrived; the one kept still verifies and restores.
        try FileManager.default.removeItem(atPath: served + "/repo/locks/other")
        let objectsBefore = FileManager.default.enumerator(atPath: served + "/repo/objects")?.allObjects.count ?? 0
        let forgot = try cli.run(["forget", repo, "--keep-last", "1", "--passcode-file", passcode, "--json"], environment: env)
        #expect(forgot.status == 0, "\(forgot.stderr)")
        let forgetReport = try #require(try JSONSerialization.jsonObject(with: forgot.stdout) as? [String: Any])
        #expect((forgetReport["removed"] as? [[String: Any]])?.compactMap { $0["id"] as? String } == [all[0]["id"] as? String].compactMap { $0 }, "\(forgot.out)")
        let pruned = try cli.run(["prune", repo, "--json"], environment: env)
        #expect(pruned.status == 0, "\(pruned.stderr)")
        let pruneReport = try #require(try JSONSerialization.jsonObject(with: pruned.stdout) as? [String: Any])
        #expect((pruneReport["objectsRemoved"] as? Int ?? 0) > 0 && (pruneReport["incompleteBackupsRemoved"] as? [String])?.count == 1, "\(pruned.out)")
        #expect((FileManager.default.enumerator(atPath: served + "/repo/objects")?.allObjects.count ?? 0) < objectsBefore)
        let remaining = try #require(try JSONSerialization.jsonObject(with: try cli.run(["backups", repo, "--json"], environment: env).stdout) as? [[String: Any]])
        #expect(remaining.count == 1 && remaining[0]["id"] as? String == all[1]["id"] as? String)
        #expect(try cli.run(["verify", repo], environment: env).status == 0)
        let kept = try cli.run(["restore", repo, cli.file("out-4"), "--passcode-file", passcode], environment: env)
        #expect(kept.status == 0 && (try? String(contentsOfFile: cli.file("out-4/docs/notes.txt"), encoding: .utf8)) == "changed", "\(kept.stderr)")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: served + "/repo/locks")) ?? []).isEmpty)
    }

    /// Runs a backup and kills the server while it runs: the backup is held writing its log into
    /// a pipe nobody reads (after taking the lock and listing the objects), the server is killed,
    /// the pipe drained. The backup must fail, saying so, with the backup staged on the device.
    static func backUpWhileTheServerDies(_ cli: CLI, source: String, repo: String, environment: [String: String],
                                         server: LoopbackServer) throws {
        let run = try cli.startBlockedOnOutput(["backup", source, repo, "--log"], environment: environment)
        #expect(run.isBlocked)
        server.kill()
        let (status, _, message) = run.finish()
        #expect(status == 1, "\(message)")
        #expect(message.contains(repo) && message.contains("sending the backup failed"), "\(message)")
    }

    @Test func aBackupThatWaitedIsNotSentWhenAnObjectItCountsOnWasPrunedMeanwhile() throws {
        let cli = CLI.make()
        let (passcode, source) = try Self.tree(cli)
        let served = cli.file("served")
        try FileManager.default.createDirectory(atPath: served, withIntermediateDirectories: true)
        var server = try LoopbackServer.webDAV(serving: served)
        let env = Self.webDAVRemote
        let repo = "rclone:dav:repo"
        #expect(try cli.run(["backup", source, repo], environment: env(server.port)).status == 0)
        for n in 0..<400 { try Data("\(n)".utf8).write(to: URL(fileURLWithPath: source + "/docs/\(n)-" + String(repeating: "x", count: 120))) }
        try Self.backUpWhileTheServerDies(cli, source: source, repo: repo, environment: env(server.port), server: server)

        // Meanwhile the objects the waiting backup found on the server, and so did not send,
        // are pruned (as another device's forget and prune would).
        var staged = Set<String>()
        let walker = FileManager.default.enumerator(atPath: cli.root + "/backup-remote")
        while let name = walker?.nextObject() as? String { staged.insert((name as NSString).lastPathComponent) }
        let objects = served + "/repo/objects"
        var pruned = 0
        for directory in try FileManager.default.contentsOfDirectory(atPath: objects) {
            for name in try FileManager.default.contentsOfDirectory(atPath: objects + "/" + directory) where !staged.contains(name) {
                try FileManager.default.removeItem(atPath: objects + "/" + directory + "/" + name)
                pruned += 1
            }
        }
        #expect(pruned > 0)

        // The waiting backup is not sent (its record would vouch for what is gone); the new one
        // stores what is missing again, and restores whole.
        server = try LoopbackServer.webDAV(serving: served)
        let resumed = try cli.run(["backup", source, repo, "--log"], environment: env(server.port))
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(resumed.out.contains("Not sent: backup") && resumed.out.components(separatedBy: "Sent: backup").count == 2, "\(resumed.out)")
        #expect(try cli.run(["verify", repo], environment: env(server.port)).status == 0)
        let restored = try cli.run(["restore", repo, cli.file("out"), "--passcode-file", passcode], environment: env(server.port))
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: source + "/big.txt", andPath: cli.file("out/big.txt")))
        #expect(FileManager.default.fileExists(atPath: cli.file("out/docs/399-" + String(repeating: "x", count: 120))))
    }

    @Test func aBackupToAnSFTPServerRestores() throws {
        let cli = CLI.make()
        let (passcode, source) = try Self.tree(cli)
        // sshd on loopback with its own host key, taking one key for root; sftp-server behind it.
        let sftp = try LoopbackServer.sftp(keysIn: cli.file("ssh"))
        let (server, port, env) = (sftp.server, sftp.server.port, sftp.environment)
        let served = cli.file("sftp-root")
        let repo = "sftp://root@127.0.0.1:\(port)\(served)/repo"

        let backup = try cli.run(["backup", source, repo], environment: env)
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(try cli.run(["verify", repo], environment: env).status == 0)
        let restored = try cli.run(["restore", repo, cli.file("out"), "--passcode-file", passcode], environment: env)
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(FileManager.default.contentsEqual(atPath: source + "/big.txt", andPath: cli.file("out/big.txt")))
        let journal = try cli.run(["cat", cli.file("out/journal.bin"), "--passcode-file", passcode])
        #expect(journal.stdout == FileManager.default.contents(atPath: source + "/big.txt"))
        #expect(Self.holdsNoPlaintext(served))

        // A server whose key is not the recorded one is refused: never trusted on first use.
        try Data("[127.0.0.1]:\(port) ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBAdBAdBAdBAdBAdBAdBAdBAdBAdBAdBAdBAdBAdBAdB\n".utf8)
            .write(to: URL(fileURLWithPath: sftp.knownHosts))
        let impostor = try cli.run(["backups", repo], environment: env)
        #expect(impostor.status != 0, "\(impostor.out)")
        server.kill()
    }
}
