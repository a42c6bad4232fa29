import SystemPackage

/// Something a layer above adds to what the supervisor serves its app (sharing, lifecycle): the
/// app opens a channel to it by its identifier (FORMAT.md §10.3, op 3) and the service answers
/// on that channel for as long as it likes. The supervisor, not the app, says which app it is.
///
/// ```swift
/// let supervisor = AppSupervisor(manager: manager, services: [SharingService(manager: manager)])
/// ```
///
/// Each hook names the run (``RunningApp``): one supervisor may run several apps, and the same
/// app more than once.
public protocol AppSupervisorService: Sendable {
    /// The byte that names the service on the app's socket.
    var serviceIdentifier: UInt8 { get }
    /// Called before the app's program starts; a throw stops the launch.
    func appWillStart(_ run: RunningApp) async throws
    /// Called once the app's program runs (in its sandbox, when it has one): ``RunningApp/pid``
    /// is set and the app may be suspended from now on.
    func appDidLaunch(_ run: RunningApp)
    /// Serves one channel the app opened, on a thread of its own, until the service is done
    /// with it or the app closes it; the supervisor closes `channel` afterwards.
    func serve(channel: FileDescriptor, run: RunningApp)
    /// Called once the app has ended (also after a failed launch).
    func appDidEnd(_ run: RunningApp)
}

extension AppSupervisorService {
    public func appWillStart(_ run: RunningApp) async throws {}
    public func appDidLaunch(_ run: RunningApp) {}
    public func appDidEnd(_ run: RunningApp) {}
}
