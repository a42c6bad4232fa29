import DataProtection
import DataProtectionBackup
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Installs, finds and removes apps and their containers in a data root — the part iOS's
/// installd and containermanagerd play.
///
/// ```swift
/// let manager = ContainerManager(files: ProtectedFileManager(keybag: keybag))
/// let notes = try await manager.install(AppIdentifier("com.example.notes"),
///                                       groups: [AppGroupIdentifier("group.com.example.notes")])
/// try manager.uninstall(notes.identifier)      // the group container goes with its last member
/// ```
///
/// Installs and uninstalls take `ROOT/Containers/.lock`, so two processes never interleave them;
/// a container appears under its final name only when complete (it is built under a staging
/// name and renamed), and a staging directory left by a killed install is removed by the next.
public struct ContainerManager: Sendable {
    /// Protected files of the device the containers belong to (directory defaults, re-protection).
    public let files: ProtectedFileManager
    public let layout: DataRootLayout

    public init(files: ProtectedFileManager) {
        self.files = files
        self.layout = files.keybag.layout
    }

    // MARK: - Finding

    /// The installed apps and groups, read from their metadata (no keys needed).
    public var catalog: ContainerCatalog { ContainerCatalog(layout: layout) }

    /// Every installed app, by identifier.
    public func apps() -> [AppContainer] { catalog.apps() }

    /// The installed app `identifier`.
    public func app(_ identifier: AppIdentifier) throws -> AppContainer { try catalog.app(identifier) }

    /// The app installed in the container `uuid`, or `nil` (reads that container's metadata only).
    public func app(container uuid: UUID) -> AppContainer? { catalog.app(container: uuid) }

    /// Every group container.
    public func groups() -> [GroupContainer] { catalog.groups() }

    /// The container of `identifier`.
    public func group(_ identifier: AppGroupIdentifier) throws -> GroupContainer { try catalog.group(identifier) }

    /// The installed apps that belong to `group`.
    public func members(of group: AppGroupIdentifier) -> [AppContainer] { catalog.members(of: group) }

    /// `containerURL(forSecurityApplicationGroupIdentifier:)` for `app`: the group's container,
    /// or `nil` when the app is not a member (iOS's answer; macOS would return a URL anyway).
    public func containerURL(forSecurityApplicationGroupIdentifier group: String, app: AppIdentifier) -> URL? {
        guard let id = try? AppGroupIdentifier(group), let container = try? self.app(app), container.groups.contains(id)
        else { return nil }
        return try? self.group(id).url
    }

    /// The preferences of an app (its identifier) or an App Group (`group.…`), for a tool outside
    /// the sandbox: `body` runs while neither the app nor any member of the group runs, so nothing
    /// it does can race the tool (`dpctl defaults`).
    public func withPreferences<T>(
        of domain: String, _ body: (ProtectedUserDefaults) async throws -> T
    ) async throws -> T {
        let url: URL
        let apps: [AppContainer]
        if domain.hasPrefix("group.") {
            let id = try AppGroupIdentifier(domain)
            url = try group(id).preferences.appendingPathComponent(domain + ".plist")
            apps = members(of: id)
        } else {
            let app = try app(try AppIdentifier(domain))
            url = app.preferences.appendingPathComponent(domain + ".plist")
            apps = [app]
        }
        return try await whileNotRunning(apps) {
            let defaults = ProtectedUserDefaults(url: url, files: files)
            try defaults.synchronizeOrThrow()
            return try await body(defaults)
        }
    }

    /// The containers (name is a UUID, metadata readable) in `directory`.
    // MARK: - Installing

    /// Registers an app and creates its container at a new random UUID, with `Documents`,
    /// `Documents/Inbox`, `Library` (`Application Support`, `Caches`, `Preferences`) and `tmp`.
    ///
    /// - Parameters:
    ///   - defaultProtection: The `com.apple.developer.default-data-protection` entitlement: set
    ///     on the container's root, so every file the app creates inherits it.
    ///   - groups: The app's App Groups; a group's container is created with its first member,
    ///     at iOS's default class until someone sets the group's (``setDefaultProtection(_:ofGroup:)``).
    ///   - documentBrowser: `UISupportsDocumentBrowser`: other apps may browse `Documents`.
    ///   - usesProtectedFiles: The app reads its files through this library, so an audit may
    ///     protect a plain file of its container in place (``ContainerMetadata/usesProtectedFiles``).
    ///   - network: The network entitlement (``ContainerMetadata/network``): off by default.
    @discardableResult
    public func install(
        _ identifier: AppIdentifier, defaultProtection: ProtectionClass = .default,
        groups: [AppGroupIdentifier] = [], documentBrowser: Bool = false,
        usesProtectedFiles: Bool = false, network: Bool = false,
        tasksMax: Int? = nil, memoryMax: Int64? = nil
    ) async throws -> AppContainer {
        if let tasksMax, !AppResourceLimits.tasksRange.contains(tasksMax) {
            throw ContainerError.invalidLimit(
                "the tasks limit \(tasksMax) is outside \(AppResourceLimits.tasksRange.lowerBound)…\(AppResourceLimits.tasksRange.upperBound)"
            )
        }
        if let memoryMax, !AppResourceLimits.memoryRange.contains(memoryMax) {
            throw ContainerError.invalidLimit(
                "the memory limit \(AppResourceLimits.describe(bytes: memoryMax)) is outside \(AppResourceLimits.describe(bytes: AppResourceLimits.memoryRange.lowerBound))…\(AppResourceLimits.describe(bytes: AppResourceLimits.memoryRange.upperBound))"
            )
        }
        try layout.prepareContainers()
        return try await withInstallLock {
            guard (try? app(identifier)) == nil else { throw ContainerError.alreadyInstalled(identifier) }
            let uniqueGroups = Array(Set(groups)).sorted()
            for group in uniqueGroups where (try? self.group(group)) == nil {
                try await createGroupContainer(group)
            }
            let uuid = UUID()
            let final = layout.applicationContainer(uuid)
            let staging = layout.applications + "/.staging-" + uuid.uuidString
            try makeDirectory(staging)
            for directory in AppContainer.directories { try makeDirectory(staging + "/" + directory) }
            try await files.setProtection(defaultProtection, ofItemAt: URL(fileURLWithPath: staging))
            try markExcluded(AppContainer.excludedFromBackup, in: staging)
            try fileSystem {
                _ = try POSIXFile.call("symlink", staging + "/Documents/Inbox") {
                    symlink(AppContainer.inboxLinkTarget, $0)
                }
            }
            let metadata = ContainerMetadata(
                schemaVersion: ContainerMetadata.currentSchemaVersion, kind: .application,
                identifier: identifier.rawValue, uuid: uuid, defaultProtection: defaultProtection.iOSName,
                groups: uniqueGroups.map(\.rawValue), documentBrowser: documentBrowser, created: Date(),
                usesProtectedFiles: usesProtectedFiles ? true : nil, network: network ? true : nil,
                tasksMax: tasksMax, memoryMax: memoryMax)
            try metadata.write(container: staging)
            try fileSystem { _ = try POSIXFile.call("rename", staging, final) { rename($0, $1) } }
            try? POSIXFile.syncDirectory(layout.applications)
            return AppContainer(metadata: metadata, url: URL(fileURLWithPath: final, isDirectory: true))
        }
    }

    private func createGroupContainer(_ group: AppGroupIdentifier) async throws {
        let uuid = UUID()
        let staging = layout.appGroups + "/.staging-" + uuid.uuidString
        try makeDirectory(staging)
        for directory in GroupContainer.directories { try makeDirectory(staging + "/" + directory) }
        try markExcluded(GroupContainer.excludedFromBackup, in: staging)
        let metadata = ContainerMetadata(
            schemaVersion: ContainerMetadata.currentSchemaVersion, kind: .appGroup,
            identifier: group.rawValue, uuid: uuid, defaultProtection: nil,
            groups: [], documentBrowser: false, created: Date())
        try metadata.write(container: staging)
        try fileSystem { _ = try POSIXFile.call("rename", staging, layout.groupContainer(uuid)) { rename($0, $1) } }
    }

    /// Marks `Library/Caches` and `tmp` with the backup layer's own mark (the attribute that
    /// borg reads and a `CACHEDIR.TAG` that tar, restic and borg honour).
    private func markExcluded(_ relativePaths: [String], in container: String) throws {
        for relative in relativePaths {
            do {
                try BackupExclusionAttribute.set(excluded: true, for: URL(fileURLWithPath: container + "/" + relative))
            } catch let error as BackupExclusionError {
                if case .fileSystem(let failure) = error { throw ContainerError.fileSystem(failure) }
                throw ContainerError.launchFailed(error.description)
            }
        }
    }

    // MARK: - Uninstalling

    /// Removes the app's container (its Inbox with it). A group container goes with its last member;
    /// what the app wrote into a group that others still use stays theirs.
    /// Fails with ``ContainerError/appRunning(_:)`` while a supervisor runs the app.
    public func uninstall(_ identifier: AppIdentifier) async throws {
        try layout.prepareContainers()
        try await withInstallLock {
            let app = try app(identifier)
            guard let running = try RunningAppLock.tryExclusive(layout, app.uuid) else {
                throw ContainerError.appRunning(identifier)
            }
            defer { running.release() }
            // Whatever a supervisor killed outright left behind goes with it (a cgroup whose
            // supervisor still runs is another root's: a copied root keeps its apps' UUIDs).
            AppCgroup.reapOrphans(ofApp: app.uuid)
            // Renamed first: from here on no lookup finds the app, even if the removal is cut short.
            let doomed = layout.applications + "/.removing-" + app.uuid.uuidString
            try fileSystem { _ = try POSIXFile.call("rename", app.url.path, doomed) { rename($0, $1) } }
            try removeTree(doomed)
            try? FileManager.default.removeItem(atPath: RunningAppLock.path(layout, app.uuid))
            for group in app.groups where members(of: group).isEmpty {
                guard let container = try? self.group(group) else { continue }
                let doomedGroup = layout.appGroups + "/.removing-" + container.uuid.uuidString
                try fileSystem { _ = try POSIXFile.call("rename", container.url.path, doomedGroup) { rename($0, $1) } }
                try removeTree(doomedGroup)
            }
        }
    }

    // MARK: - Helpers

    /// Runs `body` holding `ROOT/Containers/.lock`; first removes what an interrupted install or
    /// uninstall left (staging and removal directories).
    func withInstallLock<T>(_ body: () async throws -> T) async throws -> T {
        let fd = try fileSystem {
            try POSIXFile.open(layout.containersLock, .readWrite, options: [.create], permissions: [.ownerReadWrite])
        }
        defer { try? fd.close() }
        while flock(fd.rawValue, LOCK_EX) != 0 {
            guard errno == EINTR else {
                throw ContainerError.fileSystem(
                    FileSystemError("flock", path: layout.containersLock, errno: Errno(rawValue: errno)))
            }
        }
        for directory in [layout.applications, layout.appGroups] {
            for name in (try? POSIXFile.directoryEntries(directory)) ?? []
            where name.hasPrefix(".staging-") || name.hasPrefix(".removing-") {
                try? removeTree(directory + "/" + name)
            }
        }
        return try await body()
    }
}

/// Turns the keybag layer's file-system errors into ``ContainerError/fileSystem(_:)``.
func fileSystem<T>(_ body: () throws -> T) throws -> T {
    do { return try body() } catch let error as FileSystemError { throw ContainerError.fileSystem(error) }
}
