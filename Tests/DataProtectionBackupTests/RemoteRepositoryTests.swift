import DataProtection
@testable import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// A remote repository's locks, mirrors and rclone runs, on rclone's local backend
/// (`rclone::local:PATH`): whose lock counts as gone, an unreadable lock, a writer whose lock was
/// taken from it, mirrors of killed runs, and a Ctrl-C that reaches rclone.
@Suite(.serialized) struct RemoteRepositoryTests {
    struct Remote {
        var base: URL
        var served: URL
        var repository: RemoteRepository
        var keybag: Keybag
    }

    static func remote() async throws -> Remote {
        let bench = try await BackupBench.make()
        let served = bench.base.appendingPathComponent("served")
        try FileManager.default.createDirectory(at: served.appendingPathComponent("locks"), withIntermediateDirectories: true)
        let repository = try RemoteRepository(location: RemoteLocation("rclone::local:" + served.path), layout: bench.files.keybag.layout)
        return Remote(base: bench.base, served: served, repository: repository, keybag: bench.files.keybag)
    }

    static func plant(_ record: RemoteRepository.LockRecord, as name: String, in remote: Remote) throws {
        try RemoteRepository.encoder().encode(record).write(to: remote.served.appendingPathComponent("locks/" + name))
    }

    /// A process that has ended and been reaped: its pid names nobody (until the kernel reuses it).
    static func deadPID() throws -> Int32 {
        let child = try ToolProcess("/bin/true", [], input: 0, output: 1, error: 2)
        var status: Int32 = 0
        waitpid(child.pid, &status, 0)
        return child.pid
    }

    @Test func aLockIsGoneOnlyWhenItsProcessIsGoneFromThisMachineAndBoot() async throws {
        let remote = try await Self.remote()
        let host = ProcessInfo.processInfo.hostName
        let dead = try Self.deadPID()
        let live = try ToolProcess("/bin/sleep", ["60"], input: 0, output: 1, error: 2)
        defer {
            kill(live.pid, SIGKILL)
            var status: Int32 = 0
            waitpid(live.pid, &status, 0)
        }
        let machine = try #require(RemoteRepository.LockRecord.thisMachine)
        let boot = try #require(RemoteRepository.LockRecord.thisBoot)
        let started = try #require(RemoteRepository.LockRecord.startTime(of: live.pid))
        let namespace = try #require(RemoteRepository.LockRecord.thisPIDNamespace)
        func record(pid: Int32, machine: String?, boot: String?, started: UInt64?, namespace: String? = namespace) -> RemoteRepository.LockRecord {
            .init(host: host, pid: pid, purpose: "backup", refreshed: Date(), machine: machine, boot: boot, started: started, pidNamespace: namespace)
        }

        // Another machine with this host name, and a record without machine: alive for all we know.
        for (name, other) in [("other-machine", record(pid: dead, machine: String(repeating: "0", count: 32), boot: boot, started: nil)),
                              ("other-boot", record(pid: dead, machine: machine, boot: String(repeating: "0", count: 32), started: nil)),
                              ("no-machine", record(pid: dead, machine: nil, boot: nil, started: nil)),
                              // A container of this machine: same machine and boot IDs, its own pids.
                              ("other-namespace", record(pid: dead, machine: machine, boot: boot, started: nil, namespace: "pid:[1]")),
                              ("live", record(pid: live.pid, machine: machine, boot: boot, started: started))] {
            try Self.plant(other, as: name, in: remote)
            await #expect(throws: BackupError.self, "\(name)") { _ = try await remote.repository.acquireLock(for: "backup") }
            #expect(FileManager.default.fileExists(atPath: remote.served.appendingPathComponent("locks/" + name).path), "\(name)")
            try FileManager.default.removeItem(at: remote.served.appendingPathComponent("locks/" + name))
        }
        // This machine and boot: a pid that is gone, or that now names a process started at another time.
        for (name, gone) in [("dead", record(pid: dead, machine: machine, boot: boot, started: nil)),
                             ("reused", record(pid: live.pid, machine: machine, boot: boot, started: started + 1))] {
            try Self.plant(gone, as: name, in: remote)
            let lock = try await remote.repository.acquireLock(for: "backup")
            #expect(!FileManager.default.fileExists(atPath: remote.served.appendingPathComponent("locks/" + name).path), "\(name)")
            await remote.repository.releaseLock(lock)
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: remote.served.appendingPathComponent("locks").path).isEmpty)
    }

    @Test func aLockNamesItsMachineAndBootByAppSpecificHashesAsFormatSays() throws {
        let base = temporaryDirectory()
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        let machineID = base.appendingPathComponent("machine-id"), bootID = base.appendingPathComponent("boot_id")
        try Data("3d1219c7c4c5404aaa1f6d2a48adfda4\n".utf8).write(to: machineID)
        try Data("60f8d252-ce5e-4c13-83f9-6174a5dbcf51\n".utf8).write(to: bootID)
        #expect(RemoteRepository.LockRecord.appSpecific(machineID.path) == "1a5cf9aead841daf0ce2fa3b09405fcf")
        #expect(RemoteRepository.LockRecord.appSpecific(bootID.path) == "e0ef255e581db4860cc15e507016dd13")
        try Data("not an id".utf8).write(to: bootID)
        #expect(RemoteRepository.LockRecord.appSpecific(bootID.path) == nil)
        let record = RemoteRepository.LockRecord.now(purpose: "prune")
        let json = try #require(String(data: try RemoteRepository.encoder().encode(record), encoding: .utf8))
        #expect(!json.contains(try String(contentsOfFile: "/etc/machine-id", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
    }

    @Test func anUnreadableLockIsBusyUntilItsFileIsOld() async throws {
        let remote = try await Self.remote()
        let garbage = remote.served.appendingPathComponent("locks/garbage")
        try Data("{ not a lock".utf8).write(to: garbage)
        do {
            _ = try await remote.repository.acquireLock(for: "prune")
            Issue.record("an unreadable lock was taken as no lock")
        } catch BackupError.repositoryBusy(_, let holder) {
            #expect(holder?.contains("unreadable lock garbage") == true, "\(holder ?? "")")
        }
        // Written 31 minutes ago: as stale as a record that old.
        let old = Date().addingTimeInterval(-31 * 60)
        try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: garbage.path)
        let lock = try await remote.repository.acquireLock(for: "prune")
        #expect(!FileManager.default.fileExists(atPath: garbage.path))
        await remote.repository.releaseLock(lock)
    }

    @Test func aWriterWhoseLockWasRemovedSendsNoAuthenticationRecord() async throws {
        let remote = try await Self.remote()
        let source = remote.base.appendingPathComponent("source")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        try Data("hello".utf8).write(to: source.appendingPathComponent("a.txt"))
        let files = ProtectedFileManager(keybag: remote.keybag)
        // A backup made into the staging area, as a run that could not send it leaves it.
        let summary = try await BackupEngine(source: source, repository: remote.repository.staging, files: files).run()
        let lock = try await remote.repository.acquireLock(for: "backup")
        // Another process judged the lock stale and removed it.
        try FileManager.default.removeItem(at: remote.served.appendingPathComponent("locks/" + lock.name))
        var present = Set<String>()
        do {
            // Read back however recently it was seen (another process with a clock 25 minutes off).
            try await remote.repository.sendStaged(lock: lock, present: &present, log: { _ in }, lockConfirmedWithin: .zero)
            Issue.record("a writer without its lock sent a backup")
        } catch BackupError.remoteFailed(_, let reason) {
            #expect(reason.contains("removed by another process"), "\(reason)")
        }
        // Once lost, it stays lost: however recently it was seen, nothing more is sent.
        await #expect(throws: BackupError.self) { try await remote.repository.check(lock) }
        await remote.repository.releaseLock(lock)
        let record = remote.served.appendingPathComponent("backups/\(summary.backup)/\(BackupAuthentication.fileName)")
        #expect(!FileManager.default.fileExists(atPath: record.path))
        // Still staged: the next run with a lock of its own sends it.
        #expect(remote.repository.staging.finishedBackups().map(\.lastPathComponent) == [summary.backup])
        try await remote.repository.withLock(for: "backup") { lock in
            var present = try await remote.repository.remoteObjectNames()
            try await remote.repository.sendStaged(lock: lock, present: &present, log: { _ in })
        }
        #expect(FileManager.default.fileExists(atPath: record.path))
        #expect(try await remote.repository.fetchForReading().listBackups().map(\.isComplete) == [true])
    }

    @Test func aRefreshThatFindsItsLockGoneOrAnotherWriterStayingMarksItLost() async throws {
        let remote = try await Self.remote()
        let lock = try await remote.repository.acquireLock(for: "backup")
        #expect(await lock.refreshOnce(remote.repository) == .refreshed)
        // Another writer's fresh lock: one that backs off is gone by the next refresh …
        let other = RemoteRepository.LockRecord(host: "elsewhere", pid: 1, purpose: "prune", refreshed: Date())
        try Self.plant(other, as: "passing", in: remote)
        #expect(await lock.refreshOnce(remote.repository) == .refreshed)
        #expect(lock.hasSuspects)
        try FileManager.default.removeItem(at: remote.served.appendingPathComponent("locks/passing"))
        #expect(await lock.refreshOnce(remote.repository) == .refreshed)
        // … one still there holds the repository (it removed ours just before our rewrite).
        try Self.plant(other, as: "staying", in: remote)
        #expect(await lock.refreshOnce(remote.repository) == .refreshed)
        guard case .lost? = Optional(await lock.refreshOnce(remote.repository)) else {
            Issue.record("a writer that stayed was not seen")
            return
        }
        try FileManager.default.removeItem(at: remote.served.appendingPathComponent("locks/staying"))
        await remote.repository.releaseLock(lock)
        // Its file removed: lost at once.
        let second = try await remote.repository.acquireLock(for: "backup")
        try FileManager.default.removeItem(at: remote.served.appendingPathComponent("locks/" + second.name))
        guard case .lost? = Optional(await second.refreshOnce(remote.repository)) else {
            Issue.record("a refresh recreated a removed lock")
            return
        }
        #expect(!FileManager.default.fileExists(atPath: remote.served.appendingPathComponent("locks/" + second.name).path))
        await remote.repository.releaseLock(second)
    }

    @Test func aChunkListTheRemoteLostIsSentAgainAndARunsBackupIsNeverSilentlyDropped() async throws {
        let remote = try await Self.remote()
        let source = remote.base.appendingPathComponent("source")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        let files = ProtectedFileManager(keybag: remote.keybag)
        // A protected file of 2 MiB: stored in chunks, its chunk list kept in the staging area.
        try await files.write(Array(randomData(2 << 20)), to: source.appendingPathComponent("big.bin"), protection: .completeUntilFirstUserAuthentication)
        let engine = BackupEngine(source: source, repository: remote.repository.staging, files: files)
        _ = try await remote.repository.backUp(with: engine)
        // The remote emptied (recreated, or another device's forget and prune).
        try FileManager.default.removeItem(at: remote.served)
        try FileManager.default.createDirectory(at: remote.served, withIntermediateDirectories: true)
        let second = try await remote.repository.backUp(with: engine)
        let mirror = try await remote.repository.fetchForReading()
        #expect(mirror.listBackups().map(\.id) == [second.backup])
        #expect(mirror.listBackups().allSatisfy { $0.isComplete })
        let listed = try BackupRepository.objectList(of: mirror.backupURL(id: second.backup))
        for name in listed {
            #expect(FileManager.default.fileExists(atPath: remote.served.appendingPathComponent("objects/\(name.prefix(2))/\(name)").path), "\(name) missing")
        }
    }

    @Test func eachRunReadsThroughAMirrorOfItsOwnAndAKilledRunsMirrorIsSwept() async throws {
        let base = temporaryDirectory()
        let parent = base.appendingPathComponent("mirrors")
        var first: MirrorDirectory? = try MirrorDirectory(in: parent)
        let firstURL = try #require(first?.url)
        // A killed run's mirror: its lock file is there, nobody holds it.
        let abandoned = parent.appendingPathComponent("killed")
        try FileManager.default.createDirectory(at: abandoned.appendingPathComponent("objects"), withIntermediateDirectories: true)
        FileManager.default.createFile(atPath: abandoned.appendingPathComponent(".lock").path, contents: nil)
        let second = try MirrorDirectory(in: parent)
        #expect(second.url != firstURL)
        #expect(!FileManager.default.fileExists(atPath: abandoned.path))
        #expect(FileManager.default.fileExists(atPath: firstURL.path), "a live run's mirror was swept")
        first = nil
        #expect(!FileManager.default.fileExists(atPath: firstURL.path))
        _ = first
    }

    @Test func aToolStartsWithSIGINTAtItsDefaultAndACancelledTaskStopsIt() async throws {
        // dpctl ignores SIGINT while it stops cleanly; the tool must still die of Ctrl-C. (A
        // signal that never arrives fails the test when `sleep` ends by itself, a minute later.)
        signal(SIGINT, SIG_IGN)
        let child = try ToolProcess("/bin/sleep", ["60"], input: 0, output: 1, error: 2)
        signal(SIGINT, SIG_DFL)
        kill(child.pid, SIGINT)
        let ending = try await child.wait()
        #expect(ending.signalled && ending.status == 128 + SIGINT)

        let task = Task { try await ToolProcess("/bin/sleep", ["60"], input: 0, output: 1, error: 2).wait() }
        task.cancel()
        await #expect(throws: CancellationError.self) { _ = try await task.value }
    }

    @Test func whatRcloneSaysIsShownWithoutTheConnectionStringOrAPassword() async throws {
        #expect(RemoteLocation.redacting(#":sftp,host=h,pass=hunter2,user=u:path and key_file_pass="a,""b":x"#)
                == #":sftp,host=h,pass=***,user=u:path and key_file_pass=***:x"#)
        #expect(RemoteLocation.redacting("monkey=banana") == "monkey=banana")
        #expect(RemoteLocation.redacting("rclone::webdav,url='https://u:pw@h/':p") == "rclone::webdav,url='https://u:***@h/':p")
        // A location refused as written is named without its password.
        do {
            _ = try RemoteLocation("sftp://me:hunter2@example.org/backups", environment: [:])
            Issue.record("a user name with a password in it was taken")
        } catch {
            #expect(!String(describing: error).contains("hunter2"), "\(error)")
        }
        let base = temporaryDirectory()
        let keybag = try await Keybag.create(root: base.appendingPathComponent("device").path, passcode: nil, kdf: .insecureFastForTesting)
        // Nothing listens on port 1 of loopback: rclone fails, naming its target.
        let location = try RemoteLocation("rclone::sftp,host=127.0.0.1,port=1,user=u,pass=hunter2:repo")
        #expect(!location.description.contains("hunter2"))
        let remote = try RemoteRepository(location: location, layout: keybag.layout)
        do {
            _ = try await remote.fetchForReading()
            Issue.record("a server that is not there was read")
        } catch {
            let message = String(describing: error)
            #expect(!message.contains("hunter2"), "\(message)")
            #expect(message.contains("reading the repository's backups failed"), "\(message)")
        }
    }

    @Test func theStagingAreaIsTheSameWhicheverKeyReachesTheServer() throws {
        let home = temporaryDirectory()
        try FileManager.default.createDirectory(at: home.appendingPathComponent(".ssh"), withIntermediateDirectories: true)
        for name in ["known_hosts", "id_ed25519"] { FileManager.default.createFile(atPath: home.appendingPathComponent(".ssh/" + name).path, contents: Data()) }
        let withKeyFile = try RemoteLocation("sftp:me@example.org:backups", environment: ["HOME": home.path])
        let withAgent = try RemoteLocation("sftp:me@example.org:backups", environment: ["HOME": home.path, "SSH_AUTH_SOCK": "/run/agent"])
        #expect(withKeyFile.rcloneTarget != withAgent.rcloneTarget)
        #expect(withKeyFile.identity == withAgent.identity)
        #expect(try RemoteLocation("sftp://me@example.org/backups", environment: ["HOME": home.path]).identity
                == RemoteLocation("sftp:me@example.org:/backups", environment: ["HOME": home.path]).identity)
        #expect(try RemoteLocation("sftp:me@example.org:/backups", environment: ["HOME": home.path]).identity != withKeyFile.identity)
    }
}
