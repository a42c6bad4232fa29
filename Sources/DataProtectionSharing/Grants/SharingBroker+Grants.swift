import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// File-provider grants (crossing 3) and document-browser exposure (crossing 4): an item of a
/// providing app, granted to another app with enforced capabilities, for a time.
///
/// ```swift
/// let grant = try broker.grant("Documents/BBB.txt", from: AppIdentifier("com.example.files"),
///                              to: AppIdentifier("com.example.editor"), capabilities: [.reading],
///                              expiresAfter: 3600, by: .providingApp)
/// try broker.revoke(grant.id)
/// ```
extension SharingBroker {
    /// Who is granting: decides which items may be granted.
    public enum Grantor: Sendable {
        /// The user (`dpctl grant`): only what the provider exposes — its `Documents` when it was
        /// installed with the document browser (`--document-browser`), never `Documents/Inbox`.
        case user
        /// The providing app itself (a file provider): any item of its container but its Inbox
        /// and its metadata.
        case providingApp
    }

    /// Grants `recipient` `capabilities` on the item at `path` (relative to `provider`'s
    /// container; a directory grants what is below it too) and returns the record. `.writing`
    /// includes `.reading` (a protected file is updated through a read-write descriptor).
    ///
    /// - Parameters:
    ///   - expiresAfter: seconds on the keybag's clock; `nil`: until revoked.
    ///   - persistent: `true` keeps the grant across the recipient's launches (until revoked or
    ///     expired); `false` ends it when the recipient's current (or next) run ends.
    /// - Throws: ``SharingError`` for an item that may not be granted or does not exist,
    ///   ``ContainerError/unknownApp(_:)``.
    public func grant(
        _ path: String, from provider: AppIdentifier, to recipient: AppIdentifier, capabilities: GrantCapabilities,
        expiresAfter: TimeInterval? = nil, persistent: Bool = false, by grantor: Grantor = .user
    ) throws -> Grant {
        guard provider != recipient else { throw SharingError.sameApp(provider) }
        guard !capabilities.isEmpty else { throw SharingError.refused("a grant needs at least one capability") }
        let from = try manager.app(provider)
        let to = try manager.app(recipient)
        let relative = try grantablePath(path, in: from, by: grantor)
        try manager.layout.prepareSharing()
        let item = try openItem(relative, in: from, flags: O_RDONLY | O_NONBLOCK)
        defer { try? item.descriptor.close() }
        let st = try BeneathOpen.status(item.descriptor, path: item.path)
        if st.st_mode & S_IFMT != S_IFDIR { try BeneathOpen.requireSingleRegularFile(st, path: item.path) }
        // Writing a protected file in place reads its header and segments: writing includes reading.
        let capabilities = capabilities.contains(.writing) ? capabilities.union(.reading) : capabilities
        let now = clock.now()
        var grant = Grant(
            id: UUID(), provider: provider.rawValue, providerContainer: from.uuid, path: relative,
            device: UInt64(st.st_dev), inode: UInt64(st.st_ino), recipient: recipient.rawValue,
            recipientContainer: to.uuid,
            capabilities: capabilities, created: now, expires: expiresAfter.map { now.addingTimeInterval($0) },
            persistent: persistent)
        let identity = ItemIdentity(descriptor: item.descriptor, status: st)
        (grant.birthTime, grant.isDirectory) = (identity.birthTime, identity.isDirectory)
        grant.byUser = grantor == .user
        let store = GrantStore(layout: manager.layout)
        try store.requireRoom(forGrantsOf: from, at: now)
        try store.save(grant)
        return grant
    }

    /// Ends a grant: it starts no new access. Descriptors already handed out stay valid until the
    /// recipient closes them (permissions are checked at open, as Apple documents).
    public func revoke(_ id: UUID) throws {
        guard let grant = GrantStore(layout: manager.layout).grant(id) else { throw SharingError.noSuchGrant(id) }
        removeGrant(grant)
    }

    /// The grants given by or to `app` (all when `nil`), oldest first.
    public func grants(involving app: AppIdentifier? = nil) -> [Grant] {
        GrantStore(layout: manager.layout).all().filter {
            app == nil || $0.provider == app!.rawValue || $0.recipient == app!.rawValue
        }
    }

    /// Providers' containers, while their metadata file is the same file.
    private static let providers = RecordCache<AppContainer>()

    /// The clock grants expire on: the keybag's (a test's manual clock moves both).
    var clock: any KeybagClock { manager.files.keybag.clock }

    /// `path` as a grantable path relative to the provider's container: plain components only
    /// (no `.`, `..` or empty ones, which could walk into the Inbox), never the Inbox or the
    /// metadata, and for the user only below an exposed `Documents`.
    /// Whether `relative` (a plain path in a container) is or lies in what is never shared: the
    /// Inbox (`.Inbox`, `Documents/Inbox`) and the container's metadata. Checked for a grant's
    /// path and for every subpath a recipient names below a granted directory.
    static func isNeverShared(_ relative: String) -> Bool {
        let components = LosslessPath.components(of: relative, omittingEmpty: false)
        guard let first = components.first.map(LosslessPath.key) else { return false }
        let keys = components.map(LosslessPath.key)
        return first == LosslessPath.key(AppContainer.inboxStorageName)
            || keys.starts(with: [LosslessPath.key("Documents"), LosslessPath.key("Inbox")])
            || first == LosslessPath.key(DataRootLayout.containerMetadataFileName)
    }

    func grantablePath(_ path: String, in app: AppContainer, by grantor: Grantor) throws -> String {
        let (base, relative) = try locate(path, in: app)
        guard base == app.url.path else {
            throw SharingError.refused("\(path): only items of \(app.identifier)'s own container can be granted")
        }
        let components = LosslessPath.components(of: relative, omittingEmpty: false)
        guard !relative.isEmpty, !components.contains(where: { $0.isEmpty || LosslessPath.isDotOrDotDot($0) }) else {
            throw SharingError.refused("\(path): name the item with a plain path below the container (no ., .. or //)")
        }
        if Self.isNeverShared(relative) {
            throw SharingError.refused("\(path): the Inbox and the container's metadata are never shared")
        }
        if grantor == .user {
            guard app.supportsDocumentBrowser else {
                throw SharingError.refused(
                    "\(app.identifier) does not expose its Documents (it was installed without the document browser); only the app itself can grant its items"
                )
            }
            guard components[0] == "Documents" else {
                throw SharingError.refused("\(path): only \(app.identifier)'s Documents is exposed, nothing outside it")
            }
        }
        return relative
    }

    // MARK: - Access (what a recipient's supervisor does)

    /// The grant `id` if it lets `app` (its container) start access now.
    func activeGrant(_ id: UUID, for app: AppContainer) throws -> Grant {
        try activeGrantAndProvider(id, for: app).grant
    }

    /// The grant `id` if it lets `app` start access now, and its provider (still installed).
    func activeGrantAndProvider(_ id: UUID, for app: AppContainer) throws -> (grant: Grant, provider: AppContainer) {
        guard let grant = GrantStore(layout: manager.layout).grant(id), grant.recipientContainer == app.uuid else {
            throw SharingError.noSuchGrant(id)
        }
        if grant.isExpired(at: clock.now()) { throw SharingError.grantExpired(id) }
        let provider = try provider(of: grant)
        // The user granted through the document browser: it holds while the provider exposes its Documents.
        if grant.byUser == true, !provider.supportsDocumentBrowser {
            throw SharingError.refused(
                "\(provider.identifier) no longer exposes its Documents (its document browser was turned off): grant \(id) starts no access"
            )
        }
        return (grant, provider)
    }

    /// The providing app of `grant`, still in the container it granted from.
    func provider(of grant: Grant) throws -> AppContainer {
        let metadata =
            manager.layout.applicationContainer(grant.providerContainer) + "/"
            + DataRootLayout.containerMetadataFileName
        guard
            let provider = Self.providers.value(
                at: metadata, decode: { manager.app(container: grant.providerContainer) }),
            provider.identifier.rawValue == grant.provider
        else {
            throw SharingError.refused("the app that granted \(grant.id) is no longer installed")
        }
        return provider
    }

    /// A descriptor of the granted item (or of `subpath` below a granted directory): read-only
    /// without `.writing` — the kernel, not the recipient, then refuses writes.
    func openGranted(_ id: UUID, subpath: String, writable: Bool, for app: AppContainer) throws -> FileDescriptor {
        var session = GrantAccessSession()
        defer { session.close() }
        return try openGranted(id, subpath: subpath, writable: writable, for: app, session: &session)
    }

    /// ``openGranted(_:subpath:writable:for:)`` within a channel's session: a start sent with
    /// this open was checked already, and the provider's container directory stays open.
    func openGranted(
        _ id: UUID, subpath: String, writable: Bool, for app: AppContainer,
        session: inout GrantAccessSession, servedPath: (@Sendable (String) -> String)? = nil
    ) throws -> FileDescriptor {
        let (grant, provider) = try session.takePipelinedCheck(for: id) ?? activeGrantAndProvider(id, for: app)
        let needed: GrantCapabilities = writable ? [.writing] : [.reading]
        guard grant.capabilities.isSuperset(of: needed) else {
            throw SharingError.notGranted(id, writable ? "write" : "read")
        }
        let below = LosslessPath.components(of: subpath, omittingEmpty: false)
        guard subpath.isEmpty || !below.contains(where: { $0.isEmpty || LosslessPath.isDotOrDotDot($0) }) else {
            throw SharingError.refused("\(subpath): name items below the grant with a plain path")
        }
        if !subpath.isEmpty, Self.isNeverShared(grant.path + "/" + subpath) {
            throw SharingError.refused("\(subpath): the Inbox is never shared, not even below a granted directory")
        }
        if let snapshot = grant.snapshot {
            guard subpath.isEmpty, !writable else { throw SharingError.notGranted(id, "write") }
            guard let servedPath else { return try openSnapshot(snapshot) }
            return try openServedSnapshot(snapshot, servedPath: servedPath)
        }
        let relative = subpath.isEmpty ? grant.path : grant.path + "/" + subpath
        let (base, inside) = try locate(relative, in: provider)
        let full = base + "/" + inside
        // A recipient on the protected file system gets a descriptor opened there (plaintext).
        let item = try BeneathOpen.open(
            inside, beneath: try session.directory(servedPath?(base) ?? base),
            flags: (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK, path: full)
        do {
            try BeneathOpen.requireSingleRegularFile(try BeneathOpen.status(item, path: full), path: full)
            return item
        } catch {
            try? item.close()
            throw error
        }
    }

    /// The grant `id` as a bookmark resolves it for `app`: the item at the grant's path, or —
    /// when nothing is there any more — the same file (device and inode) found elsewhere in the
    /// provider's container, in which case the grant follows it and the bookmark is stale (the
    /// app should make a new one). An item replaced at its path (a safe save) is the item.
    func resolveGrant(_ id: UUID, for app: AppContainer) throws -> (Grant, stale: Bool) {
        let (grant, provider) = try activeGrantAndProvider(id, for: app)
        if grant.snapshot != nil { return (grant, false) }
        if let item = try? openItem(grant.path, in: provider, flags: O_RDONLY | O_NONBLOCK) {
            try? item.descriptor.close()
            return (grant, false)
        }
        // Found again only within the same top directory (an item granted from an exposed
        // Documents is not followed out of it).
        let top = LosslessPath.components(of: grant.path).first ?? ""
        guard let moved = findItem(of: grant, in: provider),
            LosslessPath.key(LosslessPath.components(of: moved).first ?? "") == LosslessPath.key(top)
        else {
            throw SharingError.refused(
                "the item of grant \(id) (\(grant.path)) is gone from \(grant.provider)'s container")
        }
        let updated = grant.moved(to: moved)
        try GrantStore(layout: manager.layout).save(updated)
        return (updated, true)
    }

    /// The path (relative to the container) of the grant's item: the same device and inode, and
    /// the same birth time and kind (``ItemIdentity``) — a new item that got the freed inode
    /// number is not it. Never looking through links or into the Inbox.
    private func findItem(of grant: Grant, in provider: AppContainer) -> String? {
        let (device, inode) = (grant.device, grant.inode)
        let root = provider.url.path
        guard let walker = FileManager.default.enumerator(atPath: root) else { return nil }
        while let relative = walker.nextObject() as? String {
            if relative == AppContainer.inboxStorageName || relative.hasPrefix(AppContainer.inboxStorageName + "/") {
                walker.skipDescendants(); continue
            }
            guard let st = POSIXFile.linkStatus(root + "/" + relative) else { continue }
            if UInt64(st.st_dev) == device, UInt64(st.st_ino) == inode, st.st_mode & S_IFMT != S_IFLNK {
                guard ItemIdentity(path: root + "/" + relative)?.isRecorded(by: grant) == true else { return nil }
                return (try? grantablePath(relative, in: provider, by: .providingApp)) ?? nil
            }
        }
        return nil
    }

    /// Removes the transient grants `app` received (its run has ended).
    func endTransientGrants(of app: AppContainer) {
        let store = GrantStore(layout: manager.layout)
        for grant in store.grants(involving: app.uuid) where !grant.persistent && grant.recipientContainer == app.uuid {
            removeGrant(grant)
        }
    }

    /// Removes every grant `app` gave or received (it is being uninstalled).
    func removeGrants(of app: AppContainer) {
        let store = GrantStore(layout: manager.layout)
        for grant in store.all() where grant.providerContainer == app.uuid || grant.recipientContainer == app.uuid {
            removeGrant(grant)
        }
        store.removeIndex(of: app.uuid)
    }
}
