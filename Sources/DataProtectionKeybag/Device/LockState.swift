/// The device's lock state, as iOS has it.
public enum LockState: String, Sendable, Equatable, CustomStringConvertible {
    /// After every start until the passcode is entered once. Only class D is available
    /// (and class B can still create new files).
    case beforeFirstUnlock = "before-first-unlock"
    /// The passcode was entered: every class is available.
    case unlocked
    /// Locked after a first unlock. Class A and opening class-B files stay possible until the
    /// grace period ends; class C and D stay available.
    case locked

    public var description: String { rawValue }

    /// How messages say it: "the device is locked (before first unlock)".
    public var phrase: String {
        switch self {
        case .beforeFirstUnlock: "locked (before first unlock)"
        case .unlocked: "unlocked"
        case .locked: "locked"
        }
    }
}

/// What a subscriber hears about protected data, like UIKit's
/// `protectedDataWillBecomeUnavailableNotification` / `protectedDataDidBecomeAvailableNotification`.
public enum ProtectedDataEvent: String, Sendable, Equatable {
    /// Sent when the device locks, before the grace period ends and class-A keys are discarded.
    case willBecomeUnavailable = "will-become-unavailable"
    /// Sent when an unlock makes every class available again.
    case didBecomeAvailable = "did-become-available"
}
