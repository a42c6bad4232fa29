import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The installed apps and App Groups of a data root, read from their containers' metadata — no
/// keybag, no keys, so it works while the device is locked and even when the device secret
/// cannot be loaded (an audit reports why). ``ContainerManager`` finds containers through it.
///
/// ```swift
/// let catalog = ContainerCatalog(layout: DataRootLayout(root: root))
/// for app in catalog.apps() { print(app.identifier, app.defaultProtection) }
/// ```
public struct ContainerCatalog: Sendable {
    public let layout: DataRootLayout

    public init(layout: DataRootLayout) {
        self.layout = layout
    }

    /// Every installed app, by identifier.
    public func apps() -> [AppContainer] {
        containers(in: layout.applications).compactMap { url, metadata in
            metadata.kind == .application && (try? AppIdentifier(metadata.identifier)) != nil
                ? AppContainer(metadata: metadata, url: url) : nil
        }.sorted { $0.identifier < $1.identifier }
    }

    /// The installed app `identifier`.
    public func app(_ identifier: AppIdentifier) throws -> AppContainer {
        guard let app = apps().first(where: { $0.identifier == identifier }) else {
            throw ContainerError.unknownApp(identifier)
        }
        return app
    }

    /// The app installed in the container `uuid`, or `nil` (reads that container's metadata only).
    public func app(container uuid: UUID) -> AppContainer? {
        let path = layout.applicationContainer(uuid)
        guard let metadata = try? ContainerMetadata.read(container: path), metadata.kind == .application,
            metadata.uuid == uuid,
            (try? AppIdentifier(metadata.identifier)) != nil
        else { return nil }
        return AppContainer(metadata: metadata, url: URL(fileURLWithPath: path, isDirectory: true))
    }

    /// Every group container.
    public func groups() -> [GroupContainer] {
        containers(in: layout.appGroups).compactMap { url, metadata in
            metadata.kind == .appGroup && (try? AppGroupIdentifier(metadata.identifier)) != nil
                ? GroupContainer(metadata: metadata, url: url) : nil
        }.sorted { $0.identifier < $1.identifier }
    }

    /// The container of `identifier`.
    public func group(_ identifier: AppGroupIdentifier) throws -> GroupContainer {
        guard let group = groups().first(where: { $0.identifier == identifier }) else {
            throw ContainerError.unknownGroup(identifier)
        }
        return group
    }

    /// The installed apps that belong to `group`.
    public func members(of group: AppGroupIdentifier) -> [AppContainer] {
        apps().filter { $0.groups.contains(group) }
    }

    private func containers(in directory: String) -> [(URL, ContainerMetadata)] {
        guard let names = try? POSIXFile.directoryEntries(directory) else { return [] }
        return names.compactMap { name in
            guard UUID(uuidString: name)?.uuidString == name else { return nil }
            let path = directory + "/" + name
            guard let metadata = try? ContainerMetadata.read(container: path) else { return nil }
            return (URL(fileURLWithPath: path, isDirectory: true), metadata)
        }
    }
}
