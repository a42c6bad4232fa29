import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionLifecycle
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

// What commands accept: the device options, passcodes, classes and durations as arguments, and
// the checks on what was given.

/// Options every command that touches a device accepts.
struct DeviceOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp("The data root (default: $DP_ROOT, else $XDG_DATA_HOME/dataprotection).", valueName: "dir"))
    var root: String?

    @Flag(name: .shortAndLong, help: "Log what the keybag does (lock, unlock, discarded keys) to standard error.")
    var verbose = false

    var resolvedRoot: String { get throws { try Self.resolve(root) } }

    /// The data root; inside an app (`dpctl app run`), where the default would be a device in
    /// the app's own container, a plain refusal unless a root is named.
    static func resolve(_ root: String?) throws -> String {
        let environment = ProcessInfo.processInfo.environment
        if root == nil, environment["DP_ROOT"] == nil, let app = environment["DATAPROTECTION_APP_ID"] {
            throw CLIError(
                "inside the app \(app) (dpctl app run) there is no device: the app's files are protected by the file system "
                    + "already, so plain tools (cat, cp, sqlite3) read and write them; run device commands outside the app"
            )
        }
        return try DataRoot.resolve(root)
    }

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
        let root = try resolvedRoot
        let keybag = try await Keybag.open(root: root)
        guard keybag.daemonSocket != nil else {
            throw CLIError(
                "no keybagd serves \(root): start one with `keybagd --root \(root)` (without it, each dpctl run is its own boot and --passcode-file unlocks just that run)"
            )
        }
        return keybag
    }

    /// Opens the device (before first unlock), and unlocks it when a passcode file is given.
    ///
    /// `standardInputCarriesData`: the command reads its data from standard input, so
    /// `--passcode-file -` is refused before any attempt (it would take the data for the
    /// The protected files of the device, unlocked with `unlock`'s passcode where one is given.
    func openFiles(_ unlock: UnlockOptions) async throws -> ProtectedFileManager {
        ProtectedFileManager(keybag: try await openDevice(passcodeFile: unlock.passcodeFile))
    }

    /// passcode and count a failed attempt toward erase-after-ten).
    func openDevice(passcodeFile: String?, standardInputCarriesData: Bool = false) async throws -> Keybag {
        bootstrapLogging()
        if standardInputCarriesData, passcodeFile == "-" {
            throw CLIError(
                "--passcode-file - cannot be used here: standard input carries this command's data; put the passcode in a file (nothing was attempted)"
            )
        }
        let keybag = try await Keybag.open(root: try resolvedRoot)
        if keybag.daemonSocket != nil { servedByKeybagd.store(true, ordering: .relaxed) }
        if let passcodeFile {
            try await unlockSayingSo(keybag, passcode: try readPasscode(passcodeFile))
        } else if let fromEnvironment = Self.passcodeFileFromEnvironment, await keybag.lockState != .unlocked {
            // As restic's RESTIC_PASSWORD_FILE: used when no --passcode-file is given and the device is not
            // unlocked already.
            guard fromEnvironment != "-" else {
                throw CLIError("\(Self.passcodeFileVariable) must name a file, not standard input")
            }
            if let socket = keybag.daemonSocket {
                // A passcode in the environment reaches every command a session runs: under keybagd
                // it would undo `dpctl lock` for every process, unseen. Only `dpctl unlock`, or a
                // passcode given to this command, unlocks the device.
                note(
                    "keybagd serves this root (\(socket)): $\(Self.passcodeFileVariable) does not unlock the device for every process; `dpctl unlock` does"
                )
            } else {
                try await keybag.unlock(passcode: try readPasscode(fromEnvironment))
            }
        }
        return keybag
    }

    /// The environment variable naming a passcode file for every command that takes --passcode-file.
    static let passcodeFileVariable = "DP_PASSCODE_FILE"
    static var passcodeFileFromEnvironment: String? {
        ProcessInfo.processInfo.environment[passcodeFileVariable].flatMap { $0.isEmpty ? nil : $0 }
    }
}

/// Reads a passcode from a file ("-" for standard input). One trailing line ending — `\n` or
/// `\r\n` — is dropped; the rest must be UTF-8 (FORMAT.md §1), never guessed at.
func readPasscode(_ path: String) throws -> String {
    var bytes: [UInt8]
    if path == "-" {
        bytes = [UInt8](FileHandle.standardInput.readDataToEndOfFile())
    } else {
        guard let contents = FileManager.default.contents(atPath: path) else {
            throw CLIError("cannot read the passcode file \(path)")
        }
        bytes = [UInt8](contents)
    }
    defer { for i in bytes.indices { bytes[i] = 0 } }
    // Bytes, not Characters: in Swift "\r\n" is one Character, so hasSuffix("\n") misses it.
    if bytes.last == 0x0A { bytes.removeLast() }
    if bytes.last == 0x0D { bytes.removeLast() }
    guard !bytes.isEmpty else { throw CLIError("the passcode file \(path) is empty") }
    guard let text = String(validating: bytes, as: UTF8.self) else {
        throw CLIError("the passcode file \(path) is not UTF-8 text (nothing was attempted)")
    }
    return text
}

/// Refuses two secrets read from one standard input (`--passcode-file - --new-passcode-file -`).
func requireOneStandardInput(_ files: String?...) throws {
    guard files.filter({ $0 == "-" }).count <= 1 else {
        throw CLIError(
            "only one secret can come from standard input (-); put the other in a file (nothing was attempted)")
    }
}

extension ProtectionClass: ExpressibleByArgument {
    public init?(argument: String) { self.init(name: argument) }
    /// What every class option and argument says about its spellings.
    static let spellings =
        "complete (A), complete-unless-open (B), until-first-unlock (C, the default), none (D), "
        + "or as iOS writes them (completeUnlessOpen, completeUntilFirstUserAuthentication, NSFileProtectionComplete…), in any case"
    /// Shell completion offers every spelling (the short names, iOS's names, the letters); the
    /// help says them in words (``spellings``), not as a list of eleven values, nor the raw numbers.
    public static var allValueStrings: [String] { [] }
    public static var defaultCompletionKind: CompletionKind { .list(completionValues) }
    static var completionValues: [String] {
        var seen = Set<String>()
        return (allCases.map(\.shortName) + allCases.map(\.iOSName) + allCases.map(\.letter)).filter {
            seen.insert($0).inserted
        }
    }
}

/// A number of seconds given on the command line: finite, from 0 to `PasscodePolicy`'s maximum.
/// Parsed with `.unconditional` so `-5` reaches this check instead of reading as an option.
struct Seconds: ExpressibleByArgument, CustomStringConvertible {
    var value: Double

    init(_ value: Double) { self.value = value }

    init?(argument: String) {
        guard let value = Double(argument), value.isFinite, value >= 0, value <= PasscodePolicy.maximumGracePeriod
        else { return nil }
        self.value = value
    }

    var description: String { value == value.rounded() ? String(Int(value)) : String(value) }
    static var defaultCompletionKind: CompletionKind { .default }
}

/// `-q`: for scripts and cron, the commands that report progress and a summary stay silent.
struct QuietOption: ParsableArguments {
    @Flag(name: .shortAndLong, help: "No progress bar and no summary: only warnings, errors and the exit status.")
    var quiet = false
}

/// The passcode option every command that may need the device unlocked takes.
struct UnlockOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "Unlock the device first with the passcode in this file ('-': standard input; default: $DP_PASSCODE_FILE).",
            discussion:
                "Without keybagd this unlocks for this run only; when keybagd serves the root it unlocks the device for every process, and says so. $DP_PASSCODE_FILE never unlocks a device that keybagd serves: `dpctl unlock` does.",
            valueName: "file"))
    var passcodeFile: String?
}

/// An empty path names no file (the kernel says ENOENT); Foundation would read it as the
/// current directory, making `dpctl backup src ""` a repository of the working directory.
func requirePaths(_ paths: String?...) throws { try requirePaths(paths.compactMap { $0 }) }

func requirePaths(_ paths: [String]) throws {
    if paths.contains(where: \.isEmpty) { throw ValidationError("an empty path names no file") }
}

/// At least one path, none empty: the check of a command whose `<paths> ...` argument may not be
/// left out.
func requireSomePaths(_ paths: [String]) throws {
    try requirePaths(paths)
    if paths.isEmpty { throw ValidationError("Missing expected argument '<paths> ...'") }
}

/// Arguments that are text, not file names (SQL, preference keys and values), must be UTF-8:
/// other bytes are refused as standard input's are, never stored as look-alike characters.
func requireText(_ arguments: String?..., what: String) throws {
    try requireText(arguments.compactMap { $0 }, what: what)
}

func requireText(_ arguments: [String], what: String) throws {
    if arguments.contains(where: { !LosslessPath.isUTF8($0) }) {
        throw ValidationError("\(what) must be UTF-8 text: an argument holds bytes that are not (nothing was run)")
    }
}

/// Unlocks with a passcode given to a command (a file, or typed at the prompt). Under keybagd that
/// unlocks the device for every process, which the command then says on standard error.
func unlockSayingSo(_ keybag: Keybag, passcode: String) async throws {
    let wasUnlocked = await keybag.lockState == .unlocked
    try await keybag.unlock(passcode: passcode)
    if let socket = keybag.daemonSocket, !wasUnlocked {
        note("unlocked the device for every process (keybagd serves this root: \(socket)); `dpctl lock` locks it")
    }
}
