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

    /// "protection inactive" when no passcode is set, as iOS's Settings says.
    public var protectionActive: Bool { passcodeSet }
}
