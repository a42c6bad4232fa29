/// Names a background task, as `UIBackgroundTaskIdentifier` does; ``invalid`` when none was
/// started (the app's time in the background is spent).
public struct BackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// `UIBackgroundTaskIdentifier.invalid`.
    public static let invalid = BackgroundTaskIdentifier(rawValue: 0)

    public var description: String { self == .invalid ? "invalid" : String(rawValue) }
}
