import SystemPackage

/// Something a layer above adds to what the supervisor serves its app (sharing, lifecycle): the
/// app opens a channel to it by its identifier (FORMAT.md §10.3, op 3) and the service answers
/// on that channel for as long as it likes. The supervisor, not the app, says which app it is.
///
/// ```swift
/// let supervisor = AppSupervisor(manager: manager, services: [SharingService(manager: manager)])
/// ```
public protocol AppSupervisorService: Sendable {
    /// The byte that names the service on the app's socket.
    var serviceIdentifier: UInt8 { get }
    /// Called before the app's program starts; a throw stops the launch.
    func appWillStart(_ app: AppContainer) throws
    /// Serves one channel the app opened, on a thread of its own, until the service is done
    /// with it or the app closes it; the supervisor closes `channel` afterwards.
    func serve(channel: FileDescriptor, app: AppContainer)
    /// Called once the app has ended (also after a failed launch).
    func appDidEnd(_ app: AppContainer)
}

extension AppSupervisorService {
    public func appWillStart(_ app: AppContainer) throws {}
    public func appDidEnd(_ app: AppContainer) {}
}
