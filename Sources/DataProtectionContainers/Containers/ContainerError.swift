import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// Errors of apps, containers, preferences and the sandbox. Each says what went wrong and,
/// where there is one, what to do.
public enum ContainerError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// An app or group identifier that does not follow its rule.
    case invalidIdentifier(String, rule: String)
    /// No app with this identifier is installed.
    case unknownApp(AppIdentifier)
    /// No group container exists for this group (no installed app names it).
    case unknownGroup(AppGroupIdentifier)
    /// The app is installed already (uninstall it first: reinstalling gives a new container).
    case alreadyInstalled(AppIdentifier)
    /// The app is running (a supervisor holds it); stop it first.
    case appRunning(AppIdentifier)
    /// The app does not belong to this group.
    case notAMember(AppIdentifier, AppGroupIdentifier)
    /// A container's metadata is missing, unreadable or not what this version writes.
    case damagedMetadata(path: String, reason: String)
    /// An item an app controls is not what it must be (a link, a FIFO where a file belongs):
    /// refused, never followed or read.
    case refusedItem(path: String, reason: String)
    /// The sandbox cannot be built on this machine; nothing was run.
    case sandboxUnavailable(String)
    /// The sandbox was set up but the app could not be started in it.
    case launchFailed(String)
    /// A resource limit outside what an app may be given.
    case invalidLimit(String)
    /// A preferences value that property lists cannot hold.
    case unsupportedPreferenceValue(key: String, type: String)
    /// This process is not an app run by a supervisor.
    case notRunningAsApp
    /// A file-system call failed.
    case fileSystem(FileSystemError)

    public var description: String {
        switch self {
        case .invalidIdentifier(let text, let rule): "\"\(text)\" is not a valid identifier: expected \(rule)"
        case .unknownApp(let id): "no app \(id) is installed"
        case .unknownGroup(let id): "no container exists for \(id): no installed app belongs to it"
        case .alreadyInstalled(let id):
            "\(id) is installed already (uninstall it first; a reinstall gets a new container)"
        case .appRunning(let id): "\(id) is running: stop it first (its supervisor holds its container)"
        case .notAMember(let app, let group): "\(app) is not a member of \(group)"
        case .damagedMetadata(let path, let reason): "\(path): container metadata \(reason)"
        case .refusedItem(let path, let reason): "\(path) \(reason): refused"
        case .sandboxUnavailable(let why): "the sandbox is not available here: \(why)"
        case .launchFailed(let why): "the app could not be started: \(why)"
        case .invalidLimit(let why): why
        case .unsupportedPreferenceValue(let key, let type):
            "preference \"\(key)\": a \(type) cannot be stored in a property list"
        case .notRunningAsApp: "this process is not running as an app (start it with its supervisor, as `app run` does)"
        case .fileSystem(let error): error.description
        }
    }
    public var errorDescription: String? { description }
}
