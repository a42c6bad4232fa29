import DataProtection
import DataProtectionKeybag
import Foundation

/// An installed app's data container, and the places iOS code asks for in it.
///
/// ```swift
/// let notes = try manager.app(AppIdentifier("com.example.notes"))
/// notes.url             // ROOT/Containers/Data/Application/<UUID>  (NSHomeDirectory() inside)
/// notes.documents       // …/Documents
/// notes.caches          // …/Library/Caches (not backed up)
/// ```
public struct AppContainer: Sendable, Equatable {
    /// What the container's metadata says.
    public let metadata: ContainerMetadata
    /// The container's root.
    public let url: URL

    public init(metadata: ContainerMetadata, url: URL) {
        self.metadata = metadata
        self.url = url
    }

    public var identifier: AppIdentifier { (try? AppIdentifier(metadata.identifier))! }
    public var uuid: UUID { metadata.uuid }
    /// The class new files inherit from the container's root: the default class set on the
    /// root (by install, by ``ContainerManager/setDefaultProtection(_:ofApp:reprotect:progress:)``
    /// or by the app itself), else iOS's default.
    public var defaultProtection: ProtectionClass { rootDefault(url) ?? .default }
    /// The entitlement the app was installed (or last changed) with: the floor of every new file
    /// of its container, whatever attribute the app sets on its directories.
    public var entitledProtection: ProtectionClass { metadata.protectionClass ?? .default }
    /// The app's groups.
    public var groups: [AppGroupIdentifier] { metadata.groups.compactMap { try? AppGroupIdentifier($0) } }
    /// Whether `Documents` is exposed through the document browser.
    public var supportsDocumentBrowser: Bool { metadata.documentBrowser }

    public var documents: URL { url.appendingPathComponent("Documents", isDirectory: true) }
    /// `Documents/Inbox`: files other apps asked this app to open, which the app may read and
    /// delete but not write. A link to ``inboxStorage``.
    public var inbox: URL { documents.appendingPathComponent("Inbox", isDirectory: true) }
    /// The real directory behind `Documents/Inbox`, at the container's root: not below
    /// `Documents`, whose write access would reach it (Landlock's rights add up along a path;
    /// FORMAT.md §10.2).
    public var inboxStorage: URL { url.appendingPathComponent(Self.inboxStorageName, isDirectory: true) }
    package static let inboxStorageName = ".Inbox"
    /// What `Documents/Inbox` links to (relative: the link stays inside the container).
    static let inboxLinkTarget = "../.Inbox"

    public var library: URL { url.appendingPathComponent("Library", isDirectory: true) }
    public var applicationSupport: URL { library.appendingPathComponent("Application Support", isDirectory: true) }
    public var caches: URL { library.appendingPathComponent("Caches", isDirectory: true) }
    public var preferences: URL { library.appendingPathComponent("Preferences", isDirectory: true) }
    public var temporaryDirectory: URL { url.appendingPathComponent("tmp", isDirectory: true) }

    /// The directories every app container has, relative to its root, in creation order.
    static let directories = [
        "Documents", "Library", "Library/Application Support", "Library/Caches", "Library/Preferences", "tmp",
        inboxStorageName,
    ]
    /// The directories the app may write in (its container's root it may only read, as on iOS).
    static let writableDirectories = ["Documents", "Library", "tmp"]
    /// The directories left out of backups (iOS: `Library/Caches` and `tmp`), relative to the root.
    public static let excludedFromBackup = ["Library/Caches", "tmp"]
}

/// An App Group's shared container.
public struct GroupContainer: Sendable, Equatable {
    public let metadata: ContainerMetadata
    public let url: URL

    public init(metadata: ContainerMetadata, url: URL) {
        self.metadata = metadata
        self.url = url
    }

    public var identifier: AppGroupIdentifier { (try? AppGroupIdentifier(metadata.identifier))! }
    public var uuid: UUID { metadata.uuid }
    /// The class new files inherit: the one set on the group's root (by a member app, or
    /// ``ContainerManager/setDefaultProtection(_:ofGroup:reprotect:progress:)``), else iOS's
    /// default (class C) — the apps' own defaults do not reach shared containers (as on iOS).
    ///
    /// Never weaker than the class the user set
    /// (``ContainerManager/setDefaultProtection(_:ofGroup:reprotect:progress:)``,
    /// kept in the metadata, which apps cannot write): a member that lowers the root's attribute
    /// lowers nothing.
    public var defaultProtection: ProtectionClass {
        max(rootDefault(url) ?? .default, metadata.protectionClass ?? .noProtection)
    }
    /// Whether anyone set the group's class.
    public var isProtectionSet: Bool { rootDefault(url) != nil || metadata.protectionClass != nil }

    public var library: URL { url.appendingPathComponent("Library", isDirectory: true) }
    public var caches: URL { library.appendingPathComponent("Caches", isDirectory: true) }
    public var preferences: URL { library.appendingPathComponent("Preferences", isDirectory: true) }

    static let directories = ["Library", "Library/Caches", "Library/Preferences"]
    /// The directories left out of backups, relative to the root.
    public static let excludedFromBackup = ["Library/Caches"]
}

/// The default class set on a container's root directory, if any.
func rootDefault(_ url: URL) -> ProtectionClass? {
    if case .directory(let cls)? = try? ItemInspector.protection(ofItemAt: url) { return cls }
    return nil
}
