import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Runs the built `dpctl` as a child process, as a user would.
public struct CLI: Sendable {
    public let root: String
    public let work: URL

    public init(root: String, work: URL) {
        self.root = root
        self.work = work
    }

    public static var executable: URL {
        // The test bundle and the executables are built side by side.
        var dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("dpctl").path), dir.path != "/" {
            dir = dir.deletingLastPathComponent()
        }
        return dir.appendingPathComponent("dpctl")
    }

    public static func make() -> CLI {
        let work = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dpctl-tests-" + UUID().uuidString)
        try! FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        return CLI(root: work.appendingPathComponent("root").path, work: work)
    }

    public struct Result: Sendable {
        public var status: Int32
        public var stdout: Data
        public var stderr: String
        public var out: String { String(decoding: stdout, as: UTF8.self) }
        public init(status: Int32, stdout: Data, stderr: String) {
            self.status = status
            self.stdout = stdout
            self.stderr = stderr
        }
    }

    /// A `dpctl` run whose outputs nobody has read yet (``startBlockedOnOutput(_:environment:)``).
    public struct StalledRun {
        public let process: Process
        let stdout: Pipe
        let stderr: Pipe
        /// Whether it was seen blocked writing a pipe (not ended first, nor after 120 s).
        public let isBlocked: Bool

        /// Reads both outputs to their end and waits for it to end.
        public func finish() -> (status: Int32, out: String, err: String) {
            let errors = PipeReader(stderr.fileHandleForReading)
            let out = String(decoding: stdout.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            return (process.terminationStatus, out, String(decoding: errors.result(), as: UTF8.self))
        }
    }

    /// Starts `dpctl --root ROOT args…` with both outputs on pipes nobody reads, and returns once
    /// one of its threads waits writing one (a peer that stops reading), it ended, or 120 s passed.
    public func startBlockedOnOutput(_ args: [String], environment: [String: String] = [:]) throws -> StalledRun {
        let process = Process()
        process.executableURL = Self.executable
        process.arguments = ["--root", root] + args
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let stdout = Pipe(), stderr = Pipe()
        process.standardOutput = stdout
        process.standardError = stderr
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let pid = process.processIdentifier
        let deadline = ContinuousClock.now + .seconds(120)
        while !isBlockedWritingAPipe(pid), process.isRunning, ContinuousClock.now < deadline { usleep(2_000) }
        return StalledRun(process: process, stdout: stdout, stderr: stderr, isBlocked: isBlockedWritingAPipe(pid))
    }

    /// Runs `dpctl --root ROOT args…` with `input` on standard input.
    @discardableResult
    public func run(_ args: [String], input: Data = Data(), environment: [String: String] = [:], shellPrefix: String? = nil,
             asUser user: String? = nil) throws -> Result {
        let process = Process()
        if let user {
            // Another user, with the same environment (setpriv keeps it).
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(user)", "--regid=nogroup", "--clear-groups", Self.executable.path, "--root", root] + args
        } else if let shellPrefix {
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            let quoted = ([Self.executable.path, "--root", root] + args).map { "'\($0)'" }.joined(separator: " ")
            process.arguments = ["-c", "\(shellPrefix); exec \(quoted)"]
        } else {
            process.executableURL = Self.executable
            process.arguments = ["--root", root] + args
        }
        if Self.testsHaveATerminal {
            // dpctl asks for a passcode on the controlling terminal: run it in a session of its
            // own, without one, as in CI (a test run from a terminal must not stop at a prompt).
            process.arguments = ["-w", process.executableURL!.path] + (process.arguments ?? [])
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setsid")
        }
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { $1 }
        process.environment = env
        let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        try process.run()
        signal(SIGPIPE, SIG_IGN)
        let writer = Thread { try? stdin.fileHandleForWriting.write(contentsOf: input); try? stdin.fileHandleForWriting.close() }
        writer.start()
        let errData = PipeReader(stderr.fileHandleForReading)
        let outData = stdout.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: outData, stderr: String(decoding: errData.result(), as: UTF8.self))
    }

    static let testsHaveATerminal: Bool = {
        let fd = open("/dev/tty", O_RDWR | O_NOCTTY)
        if fd >= 0 { close(fd) }
        return fd >= 0
    }()

    /// Runs `dpctl --root ROOT args…` on a terminal of its own (a pseudo-terminal, made by
    /// Python's `pty`), typing `answer` at its `Passcode:` prompt. Returns the exit status and
    /// everything the terminal showed (standard output and error together).
    public func runOnTerminal(_ args: [String], answer: String, environment: [String: String] = [:]) throws -> (status: Int32, screen: String) {
        let script = """
            import os, pty, select, sys
            answer, argv = sys.argv[1].encode(), sys.argv[2:]
            pid, fd = pty.fork()
            if pid == 0:
                os.execv(argv[0], argv)
            screen, sent = b"", False
            while True:
                ready, _, _ = select.select([fd], [], [], 60)
                if not ready:
                    break
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                screen += chunk
                if not sent and b"Passcode:" in screen:
                    os.write(fd, answer + b"\\n")
                    sent = True
            _, status = os.waitpid(pid, 0)
            sys.stdout.buffer.write(screen)
            sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)
            """
        let result = try ChildProcess.run("python3", ["-c", script, answer, Self.executable.path, "--root", root] + args, environment: environment)
        return (result.status, result.out)
    }

    public func file(_ name: String) -> String { work.appendingPathComponent(name).path }

    public func writeFile(_ name: String, _ contents: String) -> String {
        let path = file(name)
        try! Data(contents.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }
}

