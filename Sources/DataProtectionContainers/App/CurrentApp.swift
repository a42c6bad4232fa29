import DataProtection
import DataProtectionKeybag
import Foundation
import SystemPackage

/// The app this process runs as — its identity, its places and its keys — when a supervisor
/// started it (`dpctl app run`, or ``AppSupervisor``). The app side of `DataProtectionContainers`.
///
/// ```swift
/// guard let app = CurrentApp.shared else { fatalError("run me with dpctl app run") }
/// let notes = app.documents.appendingPathComponent("notes.txt")
/// try await app.files.write(Data("hello".utf8), to: notes)     // the container's class
/// let shared = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.notes")
/// let defaults = ProtectedUserDefaults(suiteName: "group.com.example.notes")
/// ```
///
/// Keys come from the supervisor over the inherited socket (FORMAT.md §10.3): file keys of the
/// app's own files and the device's lock state, never unlock, lock, erase or passcode changes.
public final class CurrentApp: Sendable {
    public let identifier: AppIdentifier
    /// The container (`NSHomeDirectory()`).
    public let url: URL
    /// The group containers of the app's App Groups.
    public let groupContainers: [AppGroupIdentifier: URL]
    /// Whether the app runs in the sandbox (`false` only under `--no-sandbox`).
    public let isSandboxed: Bool
    /// Whether the protected file system serves the app's containers: every program's files are
    /// protected there, and ``files`` reads and writes through it, with no key.
    public let isServedByFileSystem: Bool
    /// The device's keys, as the supervisor serves them to this app.
    public let keybag: Keybag
    /// The socket to the supervisor (for the layers above: ``openServiceChannel(_:)``).
    let connection: SupervisorConnection?

    /// The app, or `nil` when this process was not started by a supervisor.
    public static let shared: CurrentApp? = try? connect()

    /// Connects to the supervisor named by the environment (`DATAPROTECTION_SUPERVISOR_FD`).
    /// - Throws: ``ContainerError/notRunningAsApp`` when there is none.
    public static func connect(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> CurrentApp
    {
        guard let text = environment[SupervisorProtocol.descriptorVariable], let fd = Int32(text), fd >= 0 else {
            throw ContainerError.notRunningAsApp
        }
        let connection = SupervisorConnection(fd: fd)
        let description: AppDescription
        do { description = try connection.describe() } catch { throw ContainerError.notRunningAsApp }
        let keybag = try Keybag.open(description: "the app's supervisor") { connection.openKeybagChannel() }
        var groups: [AppGroupIdentifier: URL] = [:]
        for (id, path) in description.groups {
            if let group = try? AppGroupIdentifier(id) { groups[group] = URL(fileURLWithPath: path, isDirectory: true) }
        }
        return CurrentApp(
            identifier: try AppIdentifier(description.identifier),
            url: URL(fileURLWithPath: description.container, isDirectory: true),
            groupContainers: groups, isSandboxed: description.sandboxed,
            isServedByFileSystem: description.servedByFileSystem,
            keybag: keybag, connection: connection)
    }

    init(
        identifier: AppIdentifier, url: URL, groupContainers: [AppGroupIdentifier: URL], isSandboxed: Bool,
        isServedByFileSystem: Bool = false, keybag: Keybag, connection: SupervisorConnection? = nil
    ) {
        self.isServedByFileSystem = isServedByFileSystem
        self.connection = connection
        self.identifier = identifier
        self.url = url
        self.groupContainers = groupContainers
        self.isSandboxed = isSandboxed
        self.keybag = keybag
        // Each container's root and the class its metadata names, read once, at launch (as iOS
        // applies an entitlement): a raise the user makes meanwhile reaches files through the
        // directory attribute anyway.
        classFloors = ([url] + Array(groupContainers.values)).compactMap { container in
            let root = container.standardizedFileURL.path
            guard let cls = (try? ContainerMetadata.read(container: root))?.protectionClass else { return nil }
            return (root, cls)
        }
    }

    /// The container roots and the classes their metadata names (see ``files``).
    private let classFloors: [(root: String, floor: ProtectionClass)]

    /// A new channel to the supervisor's service `identifier` (``AppSupervisorService``), or
    /// `nil` when the supervisor has no such service or is gone.
    package func openServiceChannel(_ identifier: UInt8) -> FileDescriptor? {
        connection?.openServiceChannel(identifier).map(FileDescriptor.init(rawValue:))
    }

    /// Protected files with this app's keys. A new file of the container, or of a group's, is
    /// never weaker than the class the user chose for it (the container's metadata, which the
    /// app cannot write), whatever directory attribute an app set.
    public var files: ProtectedFileManager {
        var files = ProtectedFileManager(keybag: keybag)
        files.servedByFileSystem = isServedByFileSystem
        let floors = classFloors
        files.inheritedClassFloor = { path in
            floors.first { path == $0.root || path.hasPrefix($0.root + "/") }?.floor
        }
        return files
    }

    public var documents: URL { url.appendingPathComponent("Documents", isDirectory: true) }
    public var inbox: URL { documents.appendingPathComponent("Inbox", isDirectory: true) }
    public var library: URL { url.appendingPathComponent("Library", isDirectory: true) }
    public var applicationSupport: URL { library.appendingPathComponent("Application Support", isDirectory: true) }
    public var caches: URL { library.appendingPathComponent("Caches", isDirectory: true) }
    public var preferences: URL { library.appendingPathComponent("Preferences", isDirectory: true) }
    public var temporaryDirectory: URL { url.appendingPathComponent("tmp", isDirectory: true) }

    /// The group's container, or `nil` when the app is not a member (iOS's behaviour).
    public func containerURL(forSecurityApplicationGroupIdentifier groupIdentifier: String) -> URL? {
        guard let id = try? AppGroupIdentifier(groupIdentifier) else { return nil }
        return groupContainers[id]
    }
}

extension FileManager {
    /// The shared container of an App Group the current app belongs to; `nil` for any other
    /// group, or when this process is not an app (``CurrentApp``). iOS's behaviour, not macOS's.
    public func containerURL(forSecurityApplicationGroupIdentifier groupIdentifier: String) -> URL? {
        CurrentApp.shared?.containerURL(forSecurityApplicationGroupIdentifier: groupIdentifier)
    }
}
