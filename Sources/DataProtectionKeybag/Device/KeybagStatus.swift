import Foundation

/// What `dpctl status` shows.
public struct KeybagStatus: Sendable, Equatable {
    public var root: String
    public var keybagID: UUID
    public var lockState: LockState
    public var passcodeSet: Bool
    public var failedAttempts: Int
    /// Seconds until the next passcode attempt is allowed, or `nil` when one is allowed now.
    public var delayRemaining: TimeInterval?
    public var gracePeriod: TimeInterval
    /// While locked within the grace period: seconds until class-A keys are discarded.
    public var graceRemaining: TimeInterval?
    public var eraseAfterTenFailures: Bool
    public var kdf: PasscodeKDF
    /// Classes whose existing files can be opened now.
    public var available: [ProtectionClass]
    /// Where the device secret is kept.
    public var deviceSecret: DeviceSecretLocation = .file
    /// The TPM's dictionary-attack state, when the device secret is sealed by a TPM that answered.
    public var tpmLockout: TPMLockoutState? = nil
    /// Why the TPM could not be asked, when it could not.
    public var tpmProblem: String? = nil
    /// When a rollback of the keybag file was last detected (and undone), if ever.
    public var lastRollback: Date? = nil
    /// The shortest passcode a set or change accepts, in characters (``PasscodePolicy``).
    public var minimumPasscodeLength: Int = PasscodePolicy.defaultMinimumLength

    /// "protection inactive" when no passcode is set, as iOS's Settings says.
    public var protectionActive: Bool { passcodeSet }
}

/// Where a device keeps its secret.
public enum DeviceSecretLocation: Sendable, Equatable {
    /// In `ROOT/device.secret`: a copy of the data root can be attacked offline, and copying an
    /// older keybag back resets the failed-attempt count (only a running keybagd notices).
    case file
    /// Sealed by the TPM, bound to `pcrs` if any: passcodes are checked by the TPM, and failed
    /// attempts are counted where no file copy can reset them.
    case tpm(pcrs: TPMPCRSelection?)

    /// Where the device secret is and what this means for the user, in one sentence without a
    /// subject ("stored in a file: …"), to follow "device secret".
    public var consequence: String {
        switch self {
        case .file:
            "stored in a file: a copy of the data root can be attacked offline; the failed-attempt count can be rolled back"
        case .tpm(let pcrs):
            "sealed by the TPM\(pcrs.map { " (bound to PCR \($0))" } ?? ""): passcodes are checked and failures counted by the TPM; a copy of the data root is useless elsewhere"
        }
    }
}
