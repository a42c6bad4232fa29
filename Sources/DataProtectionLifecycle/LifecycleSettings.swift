import Foundation

/// The supervisor's timing rules for background apps, on its clock (virtual in tests).
///
/// ```swift
/// let service = LifecycleService(manager: manager, settings: LifecycleSettings(backgroundTimeBudget: 600))  // iOS 4's 10 minutes
/// ```
public struct LifecycleSettings: Sendable, Equatable {
    /// Time a background app may run its background tasks per trip to the background (iOS
    /// today: about 30 s; iOS 4–6: 10 minutes).
    public var backgroundTimeBudget: TimeInterval
    /// How long before the budget ends every running task's expiration handler is called.
    public var expirationWarning: TimeInterval
    /// How long a background app with no task keeps running before it is suspended.
    public var suspensionDelay: TimeInterval
    /// How long the app has after ``LifecycleEvent/willTerminate`` and `SIGTERM` before it is
    /// killed (`SIGKILL`); at most ``longestTerminationDeadline``.
    public var terminationDeadline: TimeInterval
    /// The longest grace period an app can be given before it is killed: an hour.
    public static let longestTerminationDeadline: TimeInterval = 3600

    public init(
        backgroundTimeBudget: TimeInterval = 30, expirationWarning: TimeInterval = 5,
        suspensionDelay: TimeInterval = 5, terminationDeadline: TimeInterval = 5
    ) {
        self.backgroundTimeBudget = max(0, backgroundTimeBudget)
        self.expirationWarning = max(0, min(expirationWarning, backgroundTimeBudget))
        self.suspensionDelay = max(0, suspensionDelay)
        self.terminationDeadline = min(max(0, terminationDeadline), Self.longestTerminationDeadline)
    }
}
