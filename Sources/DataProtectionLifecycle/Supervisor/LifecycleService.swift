import DataProtection
import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// iOS's app lifecycle for the apps a supervisor runs (``AppSupervisor``'s service 2): their
/// states, events, background tasks and suspension (FORMAT.md §12).
///
/// ```swift
/// let lifecycle = LifecycleService(manager: manager)      // 30 s per trip to the background
/// let supervisor = AppSupervisor(manager: manager, services: [lifecycle, SharingService(manager: manager)])
/// let status = try await supervisor.run(AppIdentifier("com.example.queue"), command: ["/usr/bin/queue"])
/// ```
///
/// What moves an app: ``moveToBackground(_:)``/``moveToForeground(_:)`` (and ``AppSwitcher``
/// from other processes), the device locking and unlocking (the keybag's events: every app in
/// front goes to the background; the unlock brings back those that were in front), and
/// ``terminateAll()``. Timers run on `clock` — the keybag's unless another is given.
public final class LifecycleService: AppSupervisorService {
    public let manager: ContainerManager
    public let settings: LifecycleSettings
    public let clock: any KeybagClock
    /// Where `systemd-inhibit` runs (its `PATH` and `DBUS_SYSTEM_BUS_ADDRESS`).
    private let environment: [String: String]
    private let logger = Logger(label: "lifecycle")
    private let runs = Mutex<[UUID: (controller: LifecycleController, control: LifecycleControlSocket.ControlServer?)]>(
        [:])
    private let observing = Mutex(false)

    /// - Parameters:
    ///   - clock: the clock deadlines run on (default: the keybag's).
    ///   - environment: where `systemd-inhibit` finds the system bus for sleep inhibitors
    ///     (`DBUS_SYSTEM_BUS_ADDRESS`, `PATH`).
    public init(
        manager: ContainerManager, settings: LifecycleSettings = LifecycleSettings(), clock: (any KeybagClock)? = nil,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) {
        self.manager = manager
        self.settings = settings
        self.clock = clock ?? manager.files.keybag.clock
        self.environment = environment
    }

    public var serviceIdentifier: UInt8 { LifecycleProtocol.serviceIdentifier }

    public func appWillStart(_ run: RunningApp) async throws {
        let keybag = manager.files.keybag
        await observeLockOnce(keybag)
        let locked = await keybag.lockState != .unlocked
        let controller = LifecycleController(
            run: run, settings: settings, clock: clock, deviceLocked: locked,
            inhibitor: SleepInhibitor(environment: environment, logger: logger), logger: logger)
        let control = LifecycleControlSocket.serve(controller, root: manager.layout.root, logger: logger)
        runs.withLock { $0[run.id] = (controller, control) }
    }

    public func appDidLaunch(_ run: RunningApp) {
        controller(run)?.launched()
    }

    public func appDidEnd(_ run: RunningApp) {
        guard let entry = runs.withLock({ $0.removeValue(forKey: run.id) }) else { return }
        entry.control?.stop()
        entry.controller.ended()
    }

    public func serve(channel: FileDescriptor, run: RunningApp) {
        guard let controller = controller(run) else { return }
        LifecycleChannel.serve(channel.rawValue, controller: controller, logger: logger)
    }

    // MARK: - Moving apps

    /// The home button for every running instance of `app`; their states after.
    @discardableResult
    public func moveToBackground(_ app: AppIdentifier) -> [ApplicationState] {
        controllers(of: app).map { $0.moveToBackground() }
    }

    /// Brings every running instance of `app` to the front (refused while the device is locked).
    @discardableResult
    public func moveToForeground(_ app: AppIdentifier) throws -> [ApplicationState] {
        try controllers(of: app).map { try $0.moveToForeground() }
    }

    /// Stops every app this service runs: `willTerminate`, then each is killed after
    /// ``LifecycleSettings/terminationDeadline`` unless it ends first.
    public func terminateAll() {
        for controller in runs.withLock({ $0.values.map(\.controller) }) { controller.terminate() }
    }

    /// The state of each running instance of `app`.
    public func states(of app: AppIdentifier) -> [ApplicationState] {
        controllers(of: app).map(\.state)
    }

    /// Returns once the (first) running instance of `app` is in `state`.
    public func wait(until app: AppIdentifier, is state: ApplicationState) async {
        guard let controller = controllers(of: app).first else { return }
        await controller.wait(until: state)
    }

    /// Each running instance of `app`, as ``AppSwitcher/status(_:)`` reports it.
    public func status(of app: AppIdentifier) -> [AppLifecycleStatus] {
        controllers(of: app).map(AppLifecycleStatus.init)
    }

    // MARK: -

    private func controller(_ run: RunningApp) -> LifecycleController? {
        runs.withLock { $0[run.id]?.controller }
    }

    private func controllers(of app: AppIdentifier) -> [LifecycleController] {
        runs.withLock { $0.values.map(\.controller).filter { $0.run.app.identifier == app } }
    }

    /// The keybag's lock and unlock move every app this service runs (once per service).
    private func observeLockOnce(_ keybag: Keybag) async {
        guard
            observing.withLock({ observing -> Bool in
                defer { observing = true }; return !observing
            })
        else { return }
        let reference = WeakReference(self)
        _ = await keybag.addObserver { event in
            guard let self = reference.value else { return }
            let all = self.runs.withLock { $0.values.map(\.controller) }
            for controller in all {
                switch event {
                case .willBecomeUnavailable: controller.deviceDidLock()
                case .didBecomeAvailable: controller.deviceDidUnlock()
                }
            }
        }
    }
}

/// A reference that does not keep its object alive (the keybag's observer must not keep the
/// service, which holds the keybag).
/// `@unchecked Sendable`: a weak reference's loads and stores are atomic in Swift's runtime, and it is never
/// reassigned.
private final class WeakReference<Object: AnyObject & Sendable>: @unchecked Sendable {
    weak var value: Object?
    init(_ value: Object) { self.value = value }
}
