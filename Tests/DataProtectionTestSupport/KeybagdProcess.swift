import DataProtection
import DataProtectionKeybag
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real keybagd for a test's root, on a manual clock, with its own runtime directory.
public final class KeybagdProcess: @unchecked Sendable {
    public let process = Process()
    public let socket: String
    public let runtime: String

    private let errorOutput = Pipe()

    public init(cli: CLI, extraEnvironment: [String: String] = [:], captureErrors: Bool = false, arguments: [String] = []) throws {
        runtime = cli.file("run")
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        process.executableURL = CLI.executable.deletingLastPathComponent().appendingPathComponent("keybagd")
        process.arguments = ["--root", cli.root, "--manual-clock"] + arguments
        var env = ProcessInfo.processInfo.environment
        env["XDG_RUNTIME_DIR"] = runtime
        env.merge(extraEnvironment) { $1 }
        process.environment = env
        let out = Pipe()
        process.standardOutput = out
        if captureErrors { process.standardError = errorOutput } else { process.standardError = FileHandle.nullDevice }
        try process.run()
        // The daemon prints one line once its socket accepts connections.
        let text = try readLine(out.fileHandleForReading)
        guard text.hasPrefix("ready ") else { throw KeybagError.daemon("keybagd did not start: \(text)") }
        socket = String(text.dropFirst(6))
    }

    public var environment: [String: String] { ["XDG_RUNTIME_DIR": runtime] }

    /// What the daemon wrote to standard error (after it ended; with `captureErrors`).
    public func errors() -> String {
        String(decoding: errorOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    /// Moves the daemon's clock (it started with --manual-clock).
    public func advance(_ seconds: TimeInterval, root: String) throws {
        guard let client = try KeybagdConnection.connect(root: root, socketPath: socket) else { throw KeybagError.daemon("not running") }
        try client.call(.advanceClock) { KeybagWire.double(&$0, seconds) }
    }

    /// SIGTERM: the daemon stops its D-Bus monitors and removes its socket.
    public func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    public func kill() {
        guard process.isRunning else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

