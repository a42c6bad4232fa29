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

// How dpctl reports an error: one line, the library's words plus a hint naming the command that
// helps, and a named exit status.

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
    static var summary: String {
        "Exit status: " + allCases.map { "\($0.rawValue) \($0.meaning)" }.joined(separator: ", ") + "."
    }

    init(for error: any Error) {
        switch error {
        case ProtectedFileError.unavailable, KeybagError.classUnavailable, KeybagError.deviceLocked: self = .unavailable
        case ProtectedFileError.damaged, ProtectedFileError.foreignKeybag, ProtectedFileError.unsupportedVersion,
            KeybagError.corruptKeybag, KeybagError.newerKeybagFormat,
            DatabaseCipherError.damaged, BackupError.notAuthentic, BackupError.verificationFailed,
            BackupError.badBackup:
            self = .damaged
        case KeybagError.wrongPasscode, KeybagError.passcodeDelayed, KeybagError.tpmLockout,
            KeybagError.wrongBackupPassword,
            DatabaseCipherError.wrongKeyOrFormat,
            BackupError.wrongBackupPassword:
            self = .wrongPasscode
        case ContainerError.invalidIdentifier: self = .usage   // a malformed app or group identifier argument
        // an empty --root, a NUL in a name, a grace period out of range
        case KeybagError.invalidArgument, is NULInPathError: self = .usage
        case KeybagError.emptyPasscode, KeybagError.passcodeTooShort: self = .usage   // a new passcode the rule refuses
        case let error as CLIError: self = error.status
        case BackupError.repositoryBusy: self = .busy   // EX_TEMPFAIL: busy is not damage
        case BackupError.badRemote: self = .usage   // a remote location that does not parse
        case BackupError.interrupted, BackupError.restoreInterrupted, BackupError.remoteInterrupted,
            ProtectedFileError.interrupted:
            self = .interrupted   // 128 + SIGINT, as a shell reports it
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
        return
            "\(TPMBinding.tctiEnvironmentVariable) names the TPM, e.g. device:/dev/tpmrm0 (needs the tss group) or swtpm:path=SOCKET"
    default:
        guard status == .unavailable else { return nil }
        return servedByKeybagd.load(ordering: .relaxed)
            ? "keybagd serves this root: `dpctl unlock` unlocks it for every process"
            : "unlock for this run with --passcode-file FILE"
    }
}

/// Whether the device this run opened is served by keybagd (hints then point to `dpctl unlock`).
let servedByKeybagd = Atomic<Bool>(false)
