import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation

extension ContainerManager {
    /// Files a re-protection leaves alone: the metadata, and the tags backup tools read as text.
    static let notReprotected: Set<String> = [DataRootLayout.containerMetadataFileName, "CACHEDIR.TAG"]

    /// ``notReprotected`` and the empty lock files preferences take beside their plists
    /// (`Library/Preferences/.ID.plist.lock`): coordination, not data — converting one would
    /// swap the inode other processes lock.
    static func notReprotected(in container: URL) -> Set<String> {
        let preferences = container.appendingPathComponent("Library/Preferences").path
        let locks = ((try? POSIXFile.directoryEntries(preferences)) ?? []).filter(PreferencesStore.isLockFileName)
        return notReprotected.union(locks)
    }

    /// Changes an app's default class (its entitlement). As on iOS, new files get it and existing
    /// files keep theirs; pass `reprotect: true` to re-protect every existing file as well
    /// (``ReprotectionReport`` says what changed and what could not; `progress` is called per item).
    /// Re-protection follows no link and refuses while the app runs (``ContainerError/appRunning(_:)``).
    @discardableResult
    public func setDefaultProtection(
        _ cls: ProtectionClass, ofApp identifier: AppIdentifier, reprotect: Bool = false,
        progress: (@Sendable (ReprotectionProgress) -> Void)? = nil
    ) async throws -> ReprotectionReport? {
        let app = try app(identifier)
        // Every class a re-protection needs is checked before the default changes.
        if reprotect {
            try await files.checkClassesAvailable(
                forReprotectingItemsAt: [app.url], to: cls, skipping: Self.notReprotected(in: app.url))
        }
        var metadata = app.metadata
        metadata.defaultProtection = cls.iOSName
        try await files.setProtection(cls, ofItemAt: app.url)
        try metadata.write(container: app.url.path)
        guard reprotect else { return nil }
        // Not while the app runs: nothing it does can then race the walk.
        return try await whileNotRunning([app]) {
            try await files.reprotectItems(
                at: app.url, to: cls, settingDirectoryDefaults: false,
                skipping: Self.notReprotected(in: app.url), progress: progress)
        }
    }

    /// Turns an app's document browser (`UISupportsDocumentBrowser`: the user may grant other
    /// apps items of its `Documents`) on or off, keeping its container. Off, grants the user made
    /// through it start no new access (descriptors already handed out stay valid, as for a revoked grant).
    public func setSupportsDocumentBrowser(_ supports: Bool, ofApp identifier: AppIdentifier) throws {
        let app = try app(identifier)
        var metadata = app.metadata
        guard metadata.documentBrowser != supports else { return }
        metadata.documentBrowser = supports
        try metadata.write(container: app.url.path)
    }

    /// Sets an App Group container's class (as on iOS: the app's entitlement does not reach shared
    /// containers; until this is called they are at iOS's default, class C). New files get it;
    /// `reprotect: true` re-protects the existing ones too.
    @discardableResult
    public func setDefaultProtection(
        _ cls: ProtectionClass, ofGroup identifier: AppGroupIdentifier, reprotect: Bool = false,
        progress: (@Sendable (ReprotectionProgress) -> Void)? = nil
    ) async throws -> ReprotectionReport? {
        let group = try group(identifier)
        if reprotect {
            try await files.checkClassesAvailable(
                forReprotectingItemsAt: [group.url], to: cls, skipping: Self.notReprotected(in: group.url))
        }
        try await files.setProtection(cls, ofItemAt: group.url)
        // Also where no member can write: the floor of every new file of the group (FORMAT §10.1).
        var metadata = group.metadata
        metadata.defaultProtection = cls.iOSName
        try metadata.write(container: group.url.path)
        guard reprotect else { return nil }
        // Not while a member runs: nothing one does can then race the walk.
        return try await whileNotRunning(members(of: identifier)) {
            try await files.reprotectItems(
                at: group.url, to: cls, settingDirectoryDefaults: false,
                skipping: Self.notReprotected(in: group.url), progress: progress)
        }
    }
}
