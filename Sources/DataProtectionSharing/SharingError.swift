import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import Foundation

/// Errors of the sharing broker and of an app's requests to it. Each says what went wrong and,
/// where there is one, what to do.
public enum SharingError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The item is not inside the app's container or one of its groups' containers.
    case outsideContainer(path: String, app: AppIdentifier)
    /// No item at this path.
    case noSuchItem(path: String)
    /// The item is not something that can be shared (a directory, a link, a FIFO, a device, a
    /// file with other hard links): refused, never followed or read.
    case refusedItem(path: String, reason: String)
    /// An app asked to share with itself.
    case sameApp(AppIdentifier)
    /// The item's class key is not available now (the device is locked): nothing was copied.
    case protectedDataUnavailable(String)
    /// No grant with this identifier was made to this app (or it was revoked).
    case noSuchGrant(UUID)
    /// The grant has expired: it starts no new access.
    case grantExpired(UUID)
    /// The grant does not include this capability.
    case notGranted(UUID, String)
    /// Access to a granted item was not started (`startAccessingSecurityScopedResource()`).
    case accessNotStarted(UUID)
    /// The broker refused an app's request; its reason.
    case refused(String)
    /// This app's supervisor offers no sharing (an `AppSupervisor` built without ``SharingService``),
    /// or it is gone.
    case brokerUnavailable

    public var description: String {
        switch self {
        case .outsideContainer(let path, let app): "\(path) is not in \(app)'s container or its groups' containers"
        case .noSuchItem(let path): "\(path): no such file"
        case .refusedItem(let path, let reason): "\(path) \(reason): refused"
        case .sameApp(let app): "\(app) cannot share with itself"
        case .noSuchGrant(let id): "no grant \(id) (revoked, or never made to this app)"
        case .grantExpired(let id): "grant \(id) has expired"
        case .notGranted(let id, let what): "grant \(id) does not allow \(what)"
        case .accessNotStarted(let id): "access to grant \(id) was not started (startAccessingSecurityScopedResource())"
        case .protectedDataUnavailable(let why): why
        case .refused(let why): why
        case .brokerUnavailable: "this app's supervisor offers no sharing (or has ended)"
        }
    }
    public var errorDescription: String? { description }
}
