/// Why a lifecycle request failed.
public enum LifecycleError: Error, Equatable, CustomStringConvertible {
    /// This process was not started by a supervisor with the lifecycle service.
    case supervisorUnavailable
    /// No running app of this identifier on this data root (nothing listens for it).
    case notRunning(String)
    /// The supervisor refused the request, saying why.
    case refused(String)
    /// The other end broke the protocol (a bug or a stranger on the socket).
    case protocolViolation(String)

    public var description: String {
        switch self {
        case .supervisorUnavailable: "this process was not started by an app supervisor that serves the lifecycle"
        case .notRunning(let app): "\(app) is not running"
        case .refused(let why): why
        case .protocolViolation(let what): "lifecycle protocol: \(what)"
        }
    }
}
