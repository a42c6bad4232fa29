/// Where an app stands, as `UIApplication.State` says it — plus ``suspended``, which iOS apps
/// never see (they are not running) and the supervisor reports.
public enum ApplicationState: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// In front, receiving events.
    case active = 0
    /// In front but not receiving events: between ``LifecycleEvent/willResignActive`` and
    /// ``LifecycleEvent/didEnterBackground``, or ``LifecycleEvent/willEnterForeground`` and
    /// ``LifecycleEvent/didBecomeActive``.
    case inactive = 1
    /// Running behind: its background tasks run until they end or its budget does.
    case background = 2
    /// Stopped: no CPU at all (the cgroup freezer, or `SIGSTOP`) until it comes to the front.
    case suspended = 3

    public var description: String {
        switch self {
        case .active: "active"
        case .inactive: "inactive"
        case .background: "background"
        case .suspended: "suspended"
        }
    }
}
