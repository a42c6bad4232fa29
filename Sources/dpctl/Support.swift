import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionSQLite
import DataProtectionLifecycle
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

/// Options every command that touches a device accepts.
struct DeviceOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The data root (default: $DP_ROOT, else $XDG_DATA_HOME/dataprotection).", valueName: "dir"))
    var root: String?

    @Flag(name: .shortAndLong, help: "Log what the keybag does (lock, unlock, discarded keys) to standard error.")
    var verbose = false

    var resolvedRoot: String { get throws { try Self.resolve(root) } }

    /// The data root; inside an app (`dpctl app run`), where the default would be a device in
    /// the app's own container, a plain refusal unless a root is named.
    static func resolve(_ root: String?) throws -> String {
        let environment = ProcessInfo.processInfo.environment
        if root == nil, environment["DP_ROOT"] == nil, let app = environment["DATAPROTECTION_APP_ID"] {
            throw CLIError("inside the app \(app) (dpctl app run) there is no device: the app's files are protected by the file system "
                           + "already, so plain tools (cat, cp, sqlite3) read and write them; run device commands outside the app")
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
            throw CLIError("no keybagd serves \(root): start one with `keybagd --root \(root)` (without it, each dpctl run is its own boot and --passcode-file unlocks just that run)")
        }
        return keybag
    }

    /// Opens the device (before first unlock), and unlocks it when a passcode file is given.
    ///
    /// `standardInputCarriesData`: the command reads its data from standard input, so
    /// `--passcode-file -` is refused before any attempt (it would take the data for the
    /// passcode and count a failed attempt toward erase-after-ten).
    func openDevice(passcodeFile: String?, standardInputCarriesData: Bool = false) async throws -> Keybag {
        bootstrapLogging()
        if standardInputCarriesData, passcodeFile == "-" {
            throw CLIError("--passcode-file - cannot be used here: standard input carries this command's data; put the passcode in a file (nothing was attempted)")
        }
        let keybag = try await Keybag.open(root: try resolvedRoot)
        if keybag.daemonSocket != nil { servedByKeybagd.store(true, ordering: .relaxed) }
        if let passcodeFile {
            try await unlockSayingSo(keybag, passcode: try readPasscode(passcodeFile))
        } else if let fromEnvironment = Self.passcodeFileFromEnvironment, await keybag.lockState != .unlocked {
            // As restic's RESTIC_PASSWORD_FILE: used when no --passcode-file is given and the device is not unlocked already.
            guard fromEnvironment != "-" else { throw CLIError("\(Self.passcodeFileVariable) must name a file, not standard input") }
            if let socket = keybag.daemonSocket {
                // A passcode in the environment reaches every command a session runs: under keybagd
                // it would undo `dpctl lock` for every process, unseen. Only `dpctl unlock`, or a
                // passcode given to this command, unlocks the device.
                note("keybagd serves this root (\(socket)): $\(Self.passcodeFileVariable) does not unlock the device for every process; `dpctl unlock` does")
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
        throw CLIError("only one secret can come from standard input (-); put the other in a file (nothing was attempted)")
    }
}

/// A plain message for the user.
struct CLIError: Error, CustomStringConvertible {
    let description: String
    /// The exit status it gives (1 unless said).
    let status: ExitStatus
    init(_ description: String, status: ExitStatus = .failure) {
        self.description = description
        self.status = status
    }
}

extension ProtectionClass: ExpressibleByArgument {
    public init?(argument: String) { self.init(name: argument) }
    /// What every class option and argument says about its spellings.
    static let spellings = "complete (A), complete-unless-open (B), until-first-unlock (C, the default), none (D), "
        + "or as iOS writes them (completeUnlessOpen, completeUntilFirstUserAuthentication, NSFileProtectionComplete…), in any case"
    /// Shell completion offers every spelling (the short names, iOS's names, the letters); the
    /// help says them in words (``spellings``), not as a list of eleven values, nor the raw numbers.
    public static var allValueStrings: [String] { [] }
    public static var defaultCompletionKind: CompletionKind { .list(completionValues) }
    static var completionValues: [String] {
        var seen = Set<String>()
        return (allCases.map(\.shortName) + allCases.map(\.iOSName) + allCases.map(\.letter)).filter { seen.insert($0).inserted }
    }
}

/// A number of seconds given on the command line: finite, from 0 to `PasscodePolicy`'s maximum.
/// Parsed with `.unconditional` so `-5` reaches this check instead of reading as an option.
struct Seconds: ExpressibleByArgument, CustomStringConvertible {
    var value: Double

    init(_ value: Double) { self.value = value }

    init?(argument: String) {
        guard let value = Double(argument), value.isFinite, value >= 0, value <= PasscodePolicy.maximumGracePeriod else { return nil }
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
    @Option(name: .long, help: ArgumentHelp(
        "Unlock the device first with the passcode in this file ('-': standard input; default: $DP_PASSCODE_FILE).",
        discussion: "Without keybagd this unlocks for this run only; when keybagd serves the root it unlocks the device for every process, and says so. $DP_PASSCODE_FILE never unlocks a device that keybagd serves: `dpctl unlock` does.",
        valueName: "file"))
    var passcodeFile: String?
}

/// dpctl's exit statuses, named once for the code and the help text.
enum ExitStatus: Int32, CaseIterable {
    case success = 0
    case failure = 1
    case unavailable = 3
    case damaged = 4
    case wrongPasscode = 5
    case findings = 6
    case usage = 64
    case busy = 75
    case interrupted = 130

    var meaning: String {
        switch self {
        case .success: "success"
        case .failure: "error"
        case .unavailable: "protected data unavailable (locked)"
        case .damaged: "damaged, foreign or forged file or backup"
        case .wrongPasscode: "wrong passcode or password, or passcode delay"
        case .findings: "audit findings at or above --min-severity"
        case .usage: "usage error (bad option or argument)"
        case .busy: "busy (another process is using it: try again later)"
        case .interrupted: "interrupted (Ctrl-C): running it again finishes it"
        }
    }

    /// `Exit status: 0 success, 1 error, …` for help texts.
    static var summary: String { "Exit status: " + allCases.map { "\($0.rawValue) \($0.meaning)" }.joined(separator: ", ") + "." }

    init(for error: any Error) {
        switch error {
        case ProtectedFileError.unavailable, KeybagError.classUnavailable, KeybagError.deviceLocked: self = .unavailable
        case ProtectedFileError.damaged, ProtectedFileError.foreignKeybag, ProtectedFileError.unsupportedVersion, KeybagError.corruptKeybag, KeybagError.newerKeybagFormat,
             DatabaseCipherError.damaged, BackupError.notAuthentic, BackupError.verificationFailed, BackupError.badBackup: self = .damaged
        case KeybagError.wrongPasscode, KeybagError.passcodeDelayed, KeybagError.tpmLockout, KeybagError.wrongBackupPassword,
             DatabaseCipherError.wrongKeyOrFormat,
             BackupError.wrongBackupPassword:
            self = .wrongPasscode
        case ContainerError.invalidIdentifier: self = .usage   // a malformed app or group identifier argument
        case KeybagError.invalidArgument: self = .usage   // an empty --root, a NUL in a name, a grace period out of range
        case KeybagError.emptyPasscode, KeybagError.passcodeTooShort: self = .usage   // a new passcode the rule refuses
        case let error as CLIError: self = error.status
        case BackupError.repositoryBusy: self = .busy   // EX_TEMPFAIL: busy is not damage
        case BackupError.badRemote: self = .usage   // a remote location that does not parse
        case BackupError.interrupted, BackupError.restoreInterrupted, BackupError.remoteInterrupted, ProtectedFileError.interrupted: self = .interrupted   // 128 + SIGINT, as a shell reports it
        default: self = .failure
        }
    }
}

/// The one place errors are reported: one line on standard error — the library's words, then
/// the command that helps, where there is one — and the exit status for its kind.
func report(_ error: any Error) -> ExitStatus {
    let status = ExitStatus(for: error)
    // One line, names shown as `\xE9` where their bytes are not UTF-8.
    var line = LosslessPath.display(DisplayedPaths.apply(describe(error)).replacingOccurrences(of: "\n", with: " "))
    if let hint = commandHint(for: error, status: status) { line += " (\(hint))" }
    FileHandle.standardError.write(Data("dpctl: \(line)\n".utf8))
    return status
}

/// An error in words: ours describe themselves; Foundation's (`CocoaError`, `NSError`) as
/// `PATH: reason`, from the POSIX error under them where there is one, not as a dump of their
/// user info.
func describe(_ error: any Error) -> String {
    guard error is CocoaError || type(of: error) is NSError.Type else { return String(describing: error) }
    let ns = error as NSError
    let path = (ns.userInfo[NSFilePathErrorKey] as? String) ?? (ns.userInfo[NSURLErrorKey] as? URL)?.path
    var reason = ns.localizedDescription
    if let underlying = ns.userInfo[NSUnderlyingErrorKey] as? any Error {
        let posix = underlying as NSError
        if posix.domain == NSPOSIXErrorDomain { reason = String(cString: strerror(Int32(posix.code))) }
    }
    return path.map { "\($0): \(reason)" } ?? reason
}

/// What to type next, for errors whose library message says what to do in library terms.
func commandHint(for error: any Error, status: ExitStatus) -> String? {
    switch error {
    case KeybagError.notInitialized(let root): return "run `dpctl --root \(root) init`"
    case KeybagError.alreadyInitialized: return "`dpctl erase` starts over"
    case KeybagError.noPasscodeSet: return "`dpctl set-passcode`"
    case KeybagError.passcodeAlreadySet: return "`dpctl change-passcode`"
    case ProtectedFileError.notProtected: return "`dpctl protect PATH`"
    case BackupError.badBackup, BackupError.verificationFailed: return "`dpctl verify BACKUP` checks every object"
    case LifecycleError.notRunning(let app): return "start it with `dpctl app run \(app) -- COMMAND`"
    case KeybagError.tpmLockout: return "the TPM's owner can run `tpm2_dictionarylockout --clear-lockout`"
    case KeybagError.tpm(let why) where why.contains("no TPM answers"):
        return "\(TPMBinding.tctiEnvironmentVariable) names the TPM, e.g. device:/dev/tpmrm0 (needs the tss group) or swtpm:path=SOCKET"
    default:
        guard status == .unavailable else { return nil }
        return servedByKeybagd.load(ordering: .relaxed)
            ? "keybagd serves this root: `dpctl unlock` unlocks it for every process"
            : "unlock for this run with --passcode-file FILE"
    }
}

/// Whether the device this run opened is served by keybagd (hints then point to `dpctl unlock`).
let servedByKeybagd = Atomic<Bool>(false)

/// Writes to standard output without buffering surprises.
func printOut(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// JSON for people and scripts alike: keys in a stable (sorted) order, `/` unescaped, dates in
/// ISO 8601. Names are the real names (a newline is `\n`, a backslash `\\`); a byte that is
/// not UTF-8 is `\udcHH`, as borg writes it (Python: `os.fsencode(name)` gives the bytes).
func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    encoder.dateEncodingStrategy = .iso8601
    printOut(LosslessPath.surrogateEscaped(String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)))
}

/// An empty path names no file (the kernel says ENOENT); Foundation would read it as the
/// current directory, making `dpctl backup src ""` a repository of the working directory.
func requirePaths(_ paths: String?...) throws { try requirePaths(paths.compactMap { $0 }) }

func requirePaths(_ paths: [String]) throws {
    if paths.contains(where: \.isEmpty) { throw ValidationError("an empty path names no file") }
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

/// `text` in double quotes with `"`, `\`, newline, CR and tab escaped by a backslash, and every
/// other scalar `isControl` names written as `control` spells it (JSON's `\u0001`, a property
/// list's `\U0001`).
func quotedEscaping(_ text: String, isControl: (Unicode.Scalar) -> Bool, control: (Unicode.Scalar) -> String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where isControl(scalar): out += control(scalar)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

/// One line on standard error (progress and notes that are not the command's output).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
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

/// One line on standard error that is not an error: something done or not done that the user
/// must know of.
func note(_ text: String) {
    FileHandle.standardError.write(Data("dpctl: \(LosslessPath.display(text))\n".utf8))
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

/// Runs `body` in a task that Ctrl-C (SIGINT) and SIGTERM cancel instead of killing the process,
/// so that a long operation can stop where it is safe and say how far it got (the library throws
/// its own "interrupted" error). The signals' default handling is back once `body` ends.
func runInterruptibly<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let task = Task { try await body() }
    let sources = [SIGINT, SIGTERM].map { number -> DispatchSourceSignal in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { task.cancel() }
        source.resume()
        return source
    }
    defer {
        for source in sources { source.cancel() }
        for number in [SIGINT, SIGTERM] { signal(number, SIG_DFL) }
    }
    return try await task.value
}
