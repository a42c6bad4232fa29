import Foundation

/// Errors of the keybag layer. Every case says what happened and, where there is one, what to do.
public enum KeybagError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The data root holds no keybag yet.
    case notInitialized(root: String)
    /// `init` was asked for a root that already holds a keybag.
    case alreadyInitialized(root: String)
    /// The keybag file is not a keybag, is truncated, has an unknown version, or its MAC does
    /// not verify (it was modified, or belongs to another device secret).
    case corruptKeybag(String)
    /// The device secret file is missing, has the wrong size or unsafe permissions.
    case badDeviceSecret(String)
    /// The passcode was wrong. `failedAttempts` counts consecutive failures.
    case wrongPasscode(failedAttempts: Int)
    /// Too many failures: the next attempt is allowed after `retryAfter` seconds.
    case passcodeDelayed(retryAfter: TimeInterval, failedAttempts: Int)
    /// The operation needs a passcode, but none is set.
    case noPasscodeSet
    /// The operation needs no passcode to be set, but one is.
    case passcodeAlreadySet
    /// A passcode must not be empty.
    case emptyPasscode
    /// The operation needs the device to be unlocked.
    case deviceLocked(LockState)
    /// The class's key is not available in the current lock state.
    case classUnavailable(ProtectionClass, LockState)
    /// A wrapped file key did not unwrap: it was damaged or does not belong to this keybag.
    case keyUnwrapFailed(ProtectionClass)
    /// The wrapped key was made by another keybag (another device or an erased one).
    case foreignKeybag(expected: UUID, found: UUID)
    /// The keybag was crypto-erased; every protected file of this root is unrecoverable.
    case erased
    /// A Foundation `FileProtectionType` this library does not implement.
    case unsupportedProtectionType(String)
    /// The file key is bound to the device that wrote it ("this device only"): a backup
    /// keybag cannot give it to another device.
    case thisDeviceOnly
    /// The file system refused an operation (path and errno text).
    case io(path: String, reason: String)
    /// The keybagd daemon serving this root stopped answering, or refused this process.
    case daemon(String)
    /// A value given to the keybag is out of its range (a grace period of NaN, −1 or 10^300).
    case invalidArgument(String)
    /// An operation this caller may not use: an app (through its supervisor) asked to unlock,
    /// lock, erase, change the passcode or policy, or for a backup key.
    case notPermitted(String)
    /// The TPM that seals this device's secret failed, is unreachable, or refused (its PCRs changed …).
    case tpm(String)
    /// The TPM is in dictionary-attack lockout: it refuses passcode attempts until failures
    /// expire (one every `recoveryInterval` seconds) or its owner resets the lockout.
    case tpmLockout(failedTries: Int, recoveryInterval: Int)
    /// The backup password does not open the backup keybag (or the backup keybag was modified).
    case wrongBackupPassword
    /// The keybag claims a format version newer than this build reads (a claim: the field is
    /// read before the MAC, which a newer format may compute otherwise): a newer DataProtection
    /// wrote it, or it was modified. Nothing was changed.
    case newerKeybagFormat(version: UInt16, readable: [UInt16])
    /// A new passcode is shorter than the device's passcode policy allows (characters).
    case passcodeTooShort(minimumLength: Int)

    public var description: String {
        switch self {
        case .notInitialized(let root):
            "no keybag in \(root): set up a device there first"
        case .alreadyInitialized(let root):
            "\(root) already holds a keybag; erase it first to start over"
        case .corruptKeybag(let why):
            "keybag rejected: \(why)"
        case .newerKeybagFormat(let version, let readable):
            "the keybag claims format version \(version), newer than this DataProtection (\(DataProtectionVersion.string)) reads "
                + "(versions \(Self.list(readable.map(String.init)))): if a newer version wrote it, run that one; "
                + "if none did, the keybag was modified (nothing was changed)"
        case .badDeviceSecret(let why):
            "device secret unusable: \(why)"
        case .wrongPasscode(let n):
            "wrong passcode (\(n) consecutive failure\(n == 1 ? "" : "s"))" + Self.consequence(ofFailures: n)
        case .passcodeDelayed(let seconds, let n):
            "too many wrong passcodes (\(n)): try again in \(Self.format(seconds))"
        case .noPasscodeSet:
            "no passcode is set (protection is inactive); set one first"
        case .passcodeAlreadySet:
            "a passcode is already set; change it instead"
        case .emptyPasscode:
            "the passcode must not be empty"
        case .passcodeTooShort(let minimum):
            "the passcode is too short: this device's policy asks for at least \(minimum) characters"
        case .deviceLocked(let state):
            "the device is \(state.phrase): unlock it with the passcode first"
        case .classUnavailable(let cls, let state):
            "protected data of class \(cls) is unavailable while the device is \(state.phrase)"
        case .keyUnwrapFailed(let cls):
            "the file key (class \(cls.letter)) does not unwrap: the file is damaged or belongs to another keybag"
        case .foreignKeybag(let expected, let found):
            "the file was protected by keybag \(found), not by this device's keybag \(expected)"
        case .erased:
            "the keybag was erased: protected data of this root is unrecoverable"
        case .unsupportedProtectionType(let raw):
            "unsupported file protection type \(raw)"
        case .thisDeviceOnly:
            "the file is protected for the device that wrote it only: it cannot be restored on another device"
        case .io(let path, let reason):
            "\(path): \(reason)"
        case .daemon(let why):
            // "keybagd serves …" says who already.
            why.hasPrefix("keybagd") ? why : "keybagd: \(why)"
        case .invalidArgument(let why):
            "invalid value: \(why)"
        case .notPermitted(let what):
            "not permitted: \(what)"
        case .wrongBackupPassword:
            "wrong backup password (or the backup keybag was modified)"
        case .tpm(let why):
            "TPM: \(why)"
        case .tpmLockout(let failures, let interval):
            "the TPM is in dictionary-attack lockout after \(failures) failed authorization\(failures == 1 ? "" : "s"): "
                + "it accepts no passcode until a failure expires (one every \(Self.format(TimeInterval(interval))))"
                + " or the TPM's owner resets the lockout with its lockout authorization"
        }
    }

    /// What the failure just counted brings: the delay that now starts.
    static func consequence(ofFailures n: Int) -> String {
        let delay = PasscodePolicy.delay(afterFailures: n)
        guard delay > 0 else { return "" }
        return ": a delay now starts, the next attempt is possible in \(format(delay))"
    }

    /// "1", "1 and 2", "1, 2 and 3".
    static func list(_ items: [String]) -> String {
        guard let last = items.last else { return "" }
        return items.count == 1 ? last : items.dropLast().joined(separator: ", ") + " and " + last
    }

    static func format(_ seconds: TimeInterval) -> String {
        let s = Int(seconds.rounded(.up))
        if s >= 3600 { return "\(s / 3600) h \(s % 3600 / 60) min" }
        if s >= 60 { return "\(s / 60) min \(s % 60) s" }
        return "\(s) s"
    }
}

extension KeybagError: LocalizedError {
    public var errorDescription: String? { description }
}
