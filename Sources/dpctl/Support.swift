import ArgumentParser
import DataProtection
import DataProtectionSQLite
import Foundation
import Logging

/// Options every command that touches a device accepts.
struct DeviceOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The data root (default: $DP_ROOT, else $XDG_DATA_HOME/dataprotection).", valueName: "dir"))
    var root: String?

    @Flag(name: .long, help: "Log what the keybag does (lock, unlock, discarded keys) to standard error.")
    var verbose = false

    var resolvedRoot: String { DataRoot.resolve(root) }

    func bootstrapLogging() { Self.bootstrapLogging(verbose: verbose) }

    static func bootstrapLogging(verbose: Bool) {
        let level: Logger.Level = verbose ? .info : .warning
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }

    /// The keybag of the keybagd serving the root; a clear error when none does.
    func openDaemonKeybag() async throws -> Keybag {
        bootstrapLogging()
        let keybag = try await Keybag.open(root: resolvedRoot)
        guard keybag.daemonSocket != nil else {
            throw CLIError("no keybagd serves \(resolvedRoot): start one with `keybagd --root \(resolvedRoot)` (without it, each dpctl run is its own boot and --passcode-file unlocks just that run)")
        }
        return keybag
    }

    /// Opens the device (before first unlock), and unlocks it when a passcode file is given.
    func openDevice(passcodeFile: String?) async throws -> Keybag {
        bootstrapLogging()
        let keybag = try await Keybag.open(root: resolvedRoot)
        if let passcodeFile { try await keybag.unlock(passcode: try readPasscode(passcodeFile)) }
        return keybag
    }
}

/// Reads a passcode from a file ("-" for standard input); one trailing newline is dropped.
func readPasscode(_ path: String) throws -> String {
    let data: Data
    if path == "-" {
        data = FileHandle.standardInput.readDataToEndOfFile()
    } else {
        guard let contents = FileManager.default.contents(atPath: path) else {
            throw CLIError("cannot read the passcode file \(path)")
        }
        data = contents
    }
    var text = String(decoding: data, as: UTF8.self)
    if text.hasSuffix("\n") { text.removeLast() }
    if text.hasSuffix("\r") { text.removeLast() }
    guard !text.isEmpty else { throw CLIError("the passcode file \(path) is empty") }
    return text
}

/// A plain message for the user.
struct CLIError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension ProtectionClass: ExpressibleByArgument {
    public init?(argument: String) { self.init(name: argument) }
    public static var allValueStrings: [String] { allCases.map(\.cliName) }
}

/// Runs a command body; any error becomes one line on standard error and an exit status.
func reportingErrors(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let error as ExitCode {
        throw error
    } catch let error as CleanExit {
        throw error
    } catch {
        var line = String(describing: error).replacingOccurrences(of: "\n", with: " ")
        if exitStatus(for: error) == 3 { line += " (unlock for this run with --passcode-file FILE)" }
        FileHandle.standardError.write(Data("dpctl: \(line)\n".utf8))
        throw ExitCode(exitStatus(for: error))
    }
}

func exitStatus(for error: any Error) -> Int32 {
    switch error {
    case ProtectedFileError.unavailable, KeybagError.classUnavailable, KeybagError.deviceLocked: 3
    case ProtectedFileError.damaged, ProtectedFileError.foreignKeybag, ProtectedFileError.unsupportedVersion, KeybagError.corruptKeybag: 4
    case KeybagError.wrongPasscode, KeybagError.passcodeDelayed, DatabaseCipherError.wrongKeyOrFormat: 5
    case DatabaseCipherError.damaged: 4
    default: 1
    }
}

/// Writes to standard output without buffering surprises.
func printOut(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// Left-aligned text table.
func table(_ rows: [[String]], rightAligned: Set<Int> = []) -> String {
    guard let first = rows.first else { return "" }
    var widths = [Int](repeating: 0, count: first.count)
    for row in rows { for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) } }
    return rows.map { row in
        row.enumerated().map { i, cell in
            let pad = String(repeating: " ", count: widths[i] - cell.count)
            return rightAligned.contains(i) ? pad + cell : (i == row.count - 1 ? cell : cell + pad)
        }.joined(separator: "  ")
    }.joined(separator: "\n")
}
