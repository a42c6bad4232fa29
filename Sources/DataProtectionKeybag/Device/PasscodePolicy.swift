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
///
/// A new passcode (at set-up, set or change) must have at least the device's minimum length:
/// 6 characters unless changed, 4 at least, as iOS asks by default. The current passcode is not
/// checked against a policy raised later: it still unlocks.
public enum PasscodePolicy {
    /// The minimum passcode length of a device whose policy was never changed (iOS's default).
    public static let defaultMinimumLength = 6
    /// The minimum lengths a policy may set.
    public static let minimumLengthRange = 4...64

    /// Checks a minimum length a policy is asked to set.
    /// - Throws: ``KeybagError/invalidArgument(_:)`` outside ``minimumLengthRange``.
    public static func validMinimumLength(_ length: Int) throws -> Int {
        guard minimumLengthRange.contains(length) else {
            throw KeybagError.invalidArgument(
                "minimum passcode length \(length): it must be from \(minimumLengthRange.lowerBound) to \(minimumLengthRange.upperBound) characters"
            )
        }
        return length
    }

    /// Checks a new passcode against a minimum length, counted in characters (Unicode scalars of
    /// its UTF-8 bytes, counted in place: no copy of the passcode is made).
    /// - Throws: ``KeybagError/emptyPasscode``, ``KeybagError/passcodeTooShort(minimumLength:)``.
    static func check(_ passcode: SecretBytes, minimumLength: Int) throws {
        if passcode.isEmpty { throw KeybagError.emptyPasscode }
        if passcode.withUnsafeBytes(characterCount) < minimumLength {
            throw KeybagError.passcodeTooShort(minimumLength: minimumLength)
        }
    }

    /// The characters a passcode's UTF-8 bytes hold, as the policy counts them (Unicode scalars:
    /// every byte that does not continue a sequence), read in place.
    public static func characterCount(_ utf8: some Sequence<UInt8>) -> Int {
        utf8.reduce(0) { $0 + ($1 & 0xC0 == 0x80 ? 0 : 1) }
    }

    /// The number of consecutive failures that erases the device when the policy is on.
    public static let eraseThreshold = 10

    /// The longest grace period a keybag accepts: one day.
    public static let maximumGracePeriod: TimeInterval = 86_400

    /// Checks a grace period (finite, 0 … ``maximumGracePeriod`` seconds) and returns it in
    /// milliseconds, as the keybag stores it.
    /// - Throws: ``KeybagError/invalidArgument(_:)`` for NaN, infinities, negatives and more than a day.
    public static func gracePeriodMillis(_ seconds: TimeInterval) throws -> UInt32 {
        guard seconds.isFinite, seconds >= 0, seconds <= maximumGracePeriod else {
            throw KeybagError.invalidArgument(
                "grace period \(seconds) s: it must be a number of seconds from 0 to \(Int(maximumGracePeriod))")
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
