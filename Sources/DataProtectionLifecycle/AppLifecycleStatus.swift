import DataProtectionContainers
import Foundation

/// One running app as its supervisor reports it (`dpctl app state`; FORMAT.md §12.3).
public struct AppLifecycleStatus: Codable, Sendable, Equatable {
    public struct RunningTask: Codable, Sendable, Equatable {
        public var id: UInt32
        public var name: String
        /// When it began, on the supervisor's clock.
        public var started: Date

        enum CodingKeys: String, CodingKey { case id = "ID", name = "Name", started = "Started" }
    }

    public var identifier: String
    /// ``ApplicationState``'s description: `active`, `inactive`, `background`, `suspended`.
    public var state: String
    /// How the app is suspended: `cgroup freezer` or `SIGSTOP`.
    public var suspension: String
    /// Which resource limits the kernel holds the app to, and how (``RunningApp/limitsInForce``).
    public var limits: String?
    /// Whether the kernel shows the app's processes stopped (the cgroup `frozen`, or state `T`).
    public var stoppedByKernel: Bool
    /// The process the supervisor started.
    public var pid: Int32?
    public var tasks: [RunningTask]
    /// Background time left this trip, in seconds (absent in front).
    public var backgroundTimeRemaining: Double?

    enum CodingKeys: String, CodingKey {
        case identifier = "Identifier", state = "State", suspension = "Suspension", stoppedByKernel = "StoppedByKernel",
            pid = "PID", tasks = "Tasks"
        case backgroundTimeRemaining = "BackgroundTimeRemaining", limits = "Limits"
    }

    init(_ controller: LifecycleController) {
        identifier = controller.identifier
        state = controller.state.description
        suspension = controller.run.suspension.rawValue
        limits = controller.run.limitsInForce
        stoppedByKernel = controller.run.isStoppedByKernel
        pid = controller.run.pid
        tasks = controller.tasks.sorted { $0.key < $1.key }.map {
            RunningTask(id: $0.key, name: $0.value.name, started: $0.value.started)
        }
        backgroundTimeRemaining = controller.timeRemaining
    }

    func binaryPropertyList() throws -> [UInt8] {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .binary
        return Array(try encoder.encode(self))
    }
}
