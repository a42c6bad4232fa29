import Foundation

/// What an app hears as it moves between states — `UIApplicationDelegate`'s calls, in iOS's
/// order:
///
/// - to the background (the home button, a lock): ``willResignActive``, ``didEnterBackground``;
/// - back in front: ``willEnterForeground``, ``didBecomeActive``;
/// - the supervisor stopping: ``willResignActive`` (if active), then ``willTerminate``.
public enum LifecycleEvent: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case willResignActive = 1
    case didEnterBackground = 2
    case willEnterForeground = 3
    case didBecomeActive = 4
    case willTerminate = 5

    public var description: String {
        switch self {
        case .willResignActive: "willResignActive"
        case .didEnterBackground: "didEnterBackground"
        case .willEnterForeground: "willEnterForeground"
        case .didBecomeActive: "didBecomeActive"
        case .willTerminate: "willTerminate"
        }
    }

    /// The state the app is in once it has heard this event.
    public var resultingState: ApplicationState {
        switch self {
        case .willResignActive, .willEnterForeground: .inactive
        case .didEnterBackground: .background
        case .didBecomeActive: .active
        case .willTerminate: .background
        }
    }

    /// UIKit's notification name for the event (`UIApplication.didEnterBackgroundNotification`
    /// is `"UIApplicationDidEnterBackgroundNotification"`): the app side posts each event to
    /// `NotificationCenter.default` under it, so observers written for iOS keep working.
    public var notificationName: Notification.Name {
        switch self {
        case .willResignActive: Notification.Name("UIApplicationWillResignActiveNotification")
        case .didEnterBackground: Notification.Name("UIApplicationDidEnterBackgroundNotification")
        case .willEnterForeground: Notification.Name("UIApplicationWillEnterForegroundNotification")
        case .didBecomeActive: Notification.Name("UIApplicationDidBecomeActiveNotification")
        case .willTerminate: Notification.Name("UIApplicationWillTerminateNotification")
        }
    }
}
