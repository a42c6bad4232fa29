import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The home button and the app switcher, for apps running under supervisors of this data root
/// (any process of this user: `dpctl app background` is this): each call reaches every running
/// instance of the app through its supervisor's control socket (FORMAT.md §12.3).
///
/// ```swift
/// let switcher = AppSwitcher(manager: manager)
/// try switcher.moveToBackground(AppIdentifier("com.example.queue"))   // the home button
/// try switcher.moveToForeground(AppIdentifier("com.example.queue"))
/// ```
public struct AppSwitcher: Sendable {
    public let manager: ContainerManager

    public init(manager: ContainerManager) { self.manager = manager }

    /// Sends the app to the background; returns each instance's state after.
    /// - Throws: ``LifecycleError/notRunning(_:)``, ``ContainerError/unknownApp(_:)``.
    @discardableResult
    public func moveToBackground(_ app: AppIdentifier) throws -> [ApplicationState] {
        try states(ask(.background, app))
    }

    /// Brings the app to the front (resuming it if suspended); refused while the device is locked.
    @discardableResult
    public func moveToForeground(_ app: AppIdentifier) throws -> [ApplicationState] {
        try states(ask(.foreground, app))
    }

    /// Each running instance of the app: its state, tasks and time left.
    public func status(_ app: AppIdentifier) throws -> [AppLifecycleStatus] {
        try ask(.status, app).map { answer in
            var body = try LifecycleProtocol.body(answer)
            let plist = try body.raw(body.remaining, "status")
            return try PropertyListDecoder().decode(AppLifecycleStatus.self, from: Data(plist))
        }
    }

    /// Stops every running instance: `willTerminate` and `SIGTERM` to each of its processes,
    /// then `SIGKILL` after `grace` seconds (0…3600; the supervisor's own, 5 s unless it was
    /// started with another, when `nil`) unless it ends first.
    public func terminate(_ app: AppIdentifier, grace: TimeInterval? = nil) throws {
        if let grace, !(grace.isFinite && grace >= 0 && grace <= LifecycleSettings.longestTerminationDeadline) {
            throw LifecycleError.refused(
                "a grace period must be between 0 and \(Int(LifecycleSettings.longestTerminationDeadline)) seconds")
        }
        for answer in try ask(.terminate, app, { w in if let grace { LifecycleProtocol.double(&w, grace) } }) {
            _ = try LifecycleProtocol.body(answer)
        }
    }

    private func ask(
        _ op: LifecycleProtocol.ControlOp, _ app: AppIdentifier, _ body: (inout ByteWriter) -> Void = { _ in }
    ) throws -> [[UInt8]] {
        let container = try manager.app(app)
        return try LifecycleControlSocket.send(
            LifecycleProtocol.request(op.rawValue, body), root: manager.layout.root, app: container)
    }

    private func states(_ answers: [[UInt8]]) throws -> [ApplicationState] {
        try answers.map { answer in
            var body = try LifecycleProtocol.body(answer)
            guard let state = ApplicationState(rawValue: try body.u8("state")) else {
                throw LifecycleError.protocolViolation("an unknown state")
            }
            return state
        }
    }
}
