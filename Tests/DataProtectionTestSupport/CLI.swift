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

    public func file(_ name: String) -> String { work.appendingPathComponent(name).path }

    public func writeFile(_ name: String, _ contents: String) -> String {
        let path = file(name)
        try! Data(contents.utf8).write(to: URL(fileURLWithPath: path))
        return path
    }
}

