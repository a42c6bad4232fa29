import Foundation

/// The escalating delays after wrong passcodes, as on iOS.
///
/// | consecutive failures | next attempt allowed after |
/// |---|---|
/// | 1–4 | at once |
/// | 5 | 1 min |
/// | 6 | 5 min |
/// | 7–8 | 15 min |
/// | 9 and more | 1 h |
///
/// With "erase after 10 failures" on, the tenth consecutive failure crypto-erases the keybag.
public enum PasscodePolicy {
    /// The number of consecutive failures that erases the device when the policy is on.
    public static let eraseThreshold = 10

    /// The longest grace period a keybag accepts: one day.
    public static let maximumGracePeriod: TimeInterval = 86_400

    /// Checks a grace period (finite, 0 … ``maximumGracePeriod`` seconds) and returns it in
    /// milliseconds, as the keybag stores it.
    /// - Throws: ``KeybagError/invalidArgument(_:)`` for NaN, infinities, negatives and more than a day.
    public static func gracePeriodMillis(_ seconds: TimeInterval) throws -> UInt32 {
        guard seconds.isFinite, seconds >= 0, seconds <= maximumGracePeriod else {
            throw KeybagError.invalidArgument("grace period \(seconds) s: it must be a number of seconds from 0 to \(Int(maximumGracePeriod))")
        }
        return UInt32((seconds * 1000).rounded())
    }

    /// The delay that follows `failures` consecutive failures.
    public static func delay(afterFailures failures: Int) -> TimeInterval {
        switch failures {
        case ..<5: 0
        case 5: 60
        case 6: 300
        case 7, 8: 900
        default: 3600
        }
    }
}
