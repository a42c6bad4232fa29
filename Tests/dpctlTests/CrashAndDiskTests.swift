import DataProtectionTestSupport
import Foundation
import Testing

/// A child process killed mid-write, a full disk, a read-only directory: the old content
/// survives, there is no half-written file, and the error is one line.
@Suite(.serialized) struct CrashAndDiskTests {
    static let isRoot = getuid() == 0

    static var canMount: Bool {
        guard isRoot else { return false }
        let dir = NSTemporaryDirectory() + "dp-mount-probe-" + UUID().uuidString
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        guard shell("mount -t tmpfs -o size=1M tmpfs '\(dir)'") == 0 else { return false }
        _ = shell("umount '\(dir)'")
        return true
    }

    @discardableResult
    static func shell(_ command: String) -> Int32 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", command]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try? p.run()
        p.waitUntilExit()
        return p.terminationStatus
    }

    func siblings(_ cli: CLI) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: cli.work.path).sorted()
    }

    @Test func aWriterKilledMidWriteLeavesTheOldContent() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let target = cli.file("doc")
        let old = Data(repeating: 0x41, count: 200_000)
        #expect(try cli.run(["write", target, "--class", "complete"], input: old).status == 0)
        let before = try siblings(cli)

        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", cli.root, "write", target, "--class", "complete"]
        let stdin = Pipe()
        process.standardInput = stdin
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Feed 8 MiB and keep the pipe open: the writer is mid-file, blocked on more input.
        signal(SIGPIPE, SIG_IGN)
        let chunk = Data(repeating: 0x42, count: 1 << 20)
        for _ in 0..<8 { try stdin.fileHandleForWriting.write(contentsOf: chunk) }
        // Wait (on the child's progress, not on a timer) until it has consumed our input.
        let giveUp = ContinuousClock.now + .seconds(120)
        while !pipeIsDrained(stdin), ContinuousClock.now < giveUp {
            sched_yield()
        }
        #expect(pipeIsDrained(stdin))
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        #expect(process.terminationReason == .uncaughtSignal)

        #expect(try cli.run(["cat", target]).stdout == old, "the old content survives")
        #expect(try siblings(cli) == before, "no half-written file is left behind")
    }

    /// Whether the child has read everything we wrote into its standard input.
    func pipeIsDrained(_ pipe: Pipe) -> Bool {
        var pending: Int32 = 0
        _ = ioctl(pipe.fileHandleForWriting.fileDescriptor, UInt(FIONREAD), &pending)
        return pending == 0
    }

    @Test func aFileSizeLimitFailsCleanlyAndLosesNothing() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let target = cli.file("doc")
        let old = Data(repeating: 0x41, count: 10_000)
        #expect(try cli.run(["write", target], input: old).status == 0)
        let before = try siblings(cli)
        // ulimit -f counts 1024-byte blocks: 200 KiB, then 1 MiB of input.
        let result = try cli.run(["write", target], input: Data(repeating: 0x42, count: 1 << 20), shellPrefix: "ulimit -f 200")
        #expect(result.status == 1)
        #expect(result.stderr.contains("too large"), "\(result.stderr)")
        #expect(result.stderr.split(separator: "\n").count == 1)
        #expect(try cli.run(["cat", target]).stdout == old)
        #expect(try siblings(cli) == before)
    }

    @Test(.enabled(if: canMount, "needs root and mount(8) to make a small tmpfs"))
    func aFullDiskFailsCleanlyAndLosesNothing() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let disk = cli.work.appendingPathComponent("small-disk")
        try FileManager.default.createDirectory(at: disk, withIntermediateDirectories: true)
        #expect(Self.shell("mount -t tmpfs -o size=512k tmpfs '\(disk.path)'") == 0)
        defer { Self.shell("umount '\(disk.path)'") }
        let target = disk.appendingPathComponent("doc").path
        let old = Data(repeating: 0x41, count: 100_000)
        #expect(try cli.run(["write", target, "--class", "none"], input: old).status == 0)
        let result = try cli.run(["write", target, "--class", "none"], input: Data(repeating: 0x42, count: 600_000))
        #expect(result.status == 1)
        #expect(result.stderr.contains("No space left"), "\(result.stderr)")
        #expect(try cli.run(["cat", target]).stdout == old)
        #expect(try FileManager.default.contentsOfDirectory(atPath: disk.path) == ["doc"])
    }

    @Test(.enabled(if: canMount, "needs root and mount(8) for a read-only file system"))
    func aReadOnlyDirectoryFailsCleanly() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let dir = cli.work.appendingPathComponent("ro")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        #expect(Self.shell("mount -t tmpfs -o size=1m tmpfs '\(dir.path)'") == 0)
        defer { Self.shell("umount '\(dir.path)'") }
        let target = dir.appendingPathComponent("doc").path
        #expect(try cli.run(["write", target, "--class", "none"], input: Data("old".utf8)).status == 0)
        #expect(Self.shell("mount -o remount,ro '\(dir.path)'") == 0)
        let result = try cli.run(["write", target, "--class", "none"], input: Data("new".utf8))
        #expect(result.status == 1)
        #expect(result.stderr.contains("Read-only"), "\(result.stderr)")
        #expect(try cli.run(["protect", target, "--class", "complete"]).status == 1)
        #expect(try cli.run(["cat", target]).out == "old")
    }

    @Test(.enabled(if: !isRoot, "root ignores directory permissions"))
    func aDirectoryWithoutWritePermissionFailsCleanly() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let dir = cli.work.appendingPathComponent("ro")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let target = dir.appendingPathComponent("doc").path
        #expect(try cli.run(["write", target, "--class", "none"], input: Data("old".utf8)).status == 0)
        chmod(dir.path, 0o555)
        defer { chmod(dir.path, 0o755) }
        let result = try cli.run(["write", target, "--class", "none"], input: Data("new".utf8))
        #expect(result.status == 1)
        #expect(result.stderr.contains("Permission denied"))
        #expect(try cli.run(["cat", target]).out == "old")
    }
}
