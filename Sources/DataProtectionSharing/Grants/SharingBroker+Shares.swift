import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Shares (crossing 2, iOS's Share and Action extensions): the recipient reads the sender's item
/// for the length of the share — read-only, through descriptors — from a **snapshot** taken when
/// the share is made (the default: the sender's later writes stay private), or `live` when the
/// sender says so. The share ends when the recipient ends it or its run ends.
extension SharingBroker {
    /// Shares the file at `path` in `sender`'s container (or a group's) with `recipient` and
    /// queues the news for it (an `IncomingItem.shared` event). Returns the share's grant.
    ///
    /// A snapshot is a byte-for-byte copy of the file as it is now, kept by the broker outside
    /// every container: a protected file stays encrypted under its own key (no key is needed, so
    /// even a class-A file can be shared while locked; the recipient reads it once unlocked).
    public func share(
        _ path: String, from sender: AppIdentifier, with recipient: AppIdentifier, live: Bool = false
    ) throws -> Grant {
        guard sender != recipient else { throw SharingError.sameApp(sender) }
        let from = try manager.app(sender)
        let to = try manager.app(recipient)
        try manager.layout.prepareSharing()
        let (base, relative) = try locate(path, in: from)
        guard base == from.url.path else {
            throw SharingError.refused("\(path): only files of \(sender)'s own container can be shared")
        }
        let item = try openItem(relative, in: from, flags: O_RDONLY | O_NONBLOCK)
        defer { try? item.descriptor.close() }
        let st = try BeneathOpen.status(item.descriptor, path: item.path)
        try BeneathOpen.requireSingleRegularFile(st, path: item.path)
        // shares and their snapshots too
        try GrantStore(layout: manager.layout).requireRoom(forGrantsOf: from, at: clock.now())
        let queue = DeliveryQueue(layout: manager.layout, app: to.uuid)
        try queue.requireRoom(from: sender, to: recipient)
        let id = UUID()
        var snapshot: String?
        if !live {
            try requireSnapshotRoom(for: from, adding: Int64(st.st_size))
            snapshot = id.uuidString
            let directory = try BeneathOpen.directory(manager.layout.snapshots)
            defer { try? directory.close() }
            try ProtectedFileManager.requireSpace(for: Int64(st.st_size), in: directory, path: manager.layout.snapshots)
            try copySnapshot(
                item.descriptor, size: Int64(st.st_size), to: manager.layout.snapshots + "/" + id.uuidString)
        }
        var grant = Grant(
            id: id, provider: sender.rawValue, providerContainer: from.uuid, path: relative, device: UInt64(st.st_dev),
            inode: UInt64(st.st_ino), recipient: recipient.rawValue, recipientContainer: to.uuid,
            capabilities: [.reading],
            created: clock.now(), expires: nil, persistent: false, snapshot: snapshot, isShare: true)
        let identity = ItemIdentity(descriptor: item.descriptor, status: st)
        (grant.birthTime, grant.isDirectory) = (identity.birthTime, identity.isDirectory)
        do {
            try GrantStore(layout: manager.layout).save(grant)
            try queue.enqueue(Delivery(kind: .share, name: id.uuidString, sender: sender.rawValue, date: Date()))
        } catch {
            removeGrant(grant)
            throw error
        }
        return grant
    }

    /// Ends a share (or any grant) made to `app`: nothing more can be opened through it.
    func endShare(_ id: UUID, for app: AppContainer) throws {
        guard let grant = GrantStore(layout: manager.layout).grant(id), grant.recipientContainer == app.uuid else {
            throw SharingError.noSuchGrant(id)
        }
        removeGrant(grant)
    }

    /// Refuses a snapshot of `size` bytes when `provider`'s shares would then hold more than
    /// ``snapshotBytesPerApp`` in snapshots.
    private func requireSnapshotRoom(for provider: AppContainer, adding size: Int64) throws {
        let store = GrantStore(layout: manager.layout)
        var held: Int64 = 0
        for grant in store.grants(involving: provider.uuid) where grant.providerContainer == provider.uuid {
            guard let snapshot = grant.snapshot,
                let st = POSIXFile.linkStatus(manager.layout.snapshots + "/" + snapshot)
            else { continue }
            held += Int64(st.st_size)
        }
        guard held + size <= snapshotBytesPerApp else {
            throw SharingError.refused(
                "\(provider.identifier)'s shares hold \(held) bytes of snapshots; \(size) more would pass \(snapshotBytesPerApp): end some shares first"
            )
        }
    }

    /// Removes a grant and its snapshot.
    func removeGrant(_ grant: Grant) {
        GrantStore(layout: manager.layout).remove(grant.id)
        if let snapshot = grant.snapshot {
            _ = try? POSIXFile.call("unlink", manager.layout.snapshots + "/" + snapshot) { unlink($0) }
            unlink(servedCopyPath(snapshot))
        }
    }

    /// Opens a share's snapshot, read-only.
    func openSnapshot(_ name: String) throws -> FileDescriptor {
        let path = manager.layout.snapshots + "/" + name
        let directory = try BeneathOpen.directory(manager.layout.snapshots)
        defer { try? directory.close() }
        return try BeneathOpen.open(name, beneath: directory, flags: O_RDONLY, path: path)
    }

    /// A snapshot opened through the protected file system, for a recipient there (which reads
    /// plaintext and holds no key): linked for a moment into the directory the file system serves
    /// (`.dataprotection-snapshot-<random>` beside the containers, in no sandbox), opened
    /// read-only through the mount, the name removed. When the two are on different file systems,
    /// one ciphertext copy of the snapshot is kept there instead until the share ends (a copy per
    /// open would let a recipient fill the disk by opening again and again). The file system decrypts each read and
    /// enforces the snapshot's class at
    /// every one, as for the recipient's own files (class A after lock + grace: `EACCES`); nothing
    /// decrypted is held anywhere but the page cache it drops at a lock.
    func openServedSnapshot(_ name: String, servedPath: @Sendable (String) -> String) throws -> FileDescriptor {
        let snapshot = try openSnapshot(name)
        defer { try? snapshot.close() }
        let path = manager.layout.snapshots + "/" + name
        var backing = manager.layout.containers + "/" + DataRootLayout.servedSnapshotPrefix + UUID().uuidString
        var linked = true
        if linkat(AT_FDCWD, path, AT_FDCWD, backing, 0) != 0 {   // never following a link
            guard errno == EXDEV || errno == EPERM || errno == EMLINK else {
                throw FileSystemError("link", path: backing, errno: Errno(rawValue: errno))
            }
            // Not the same file system (or no hard links there): the share's one copy.
            backing = try servedCopy(of: snapshot, name: name, path: path, temporary: backing)
            linked = false
        }
        let served = servedPath(backing)
        defer { if linked, unlink(served) != 0 { unlink(backing) } }
        let fd = open(served, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw FileSystemError("open", path: served, errno: Errno(rawValue: errno)) }
        return FileDescriptor(rawValue: fd)
    }

    /// Where a snapshot's copy beside the containers is kept (``openServedSnapshot(_:servedPath:)``).
    func servedCopyPath(_ name: String) -> String {
        manager.layout.containers + "/" + DataRootLayout.servedSnapshotPrefix + "copy-" + name
    }

    /// The snapshot's copy beside the containers: made once (at `temporary`, then renamed
    /// without replacing one an open at the same time made first).
    private func servedCopy(of snapshot: FileDescriptor, name: String, path: String, temporary: String) throws -> String
    {
        let copy = servedCopyPath(name)
        if let st = POSIXFile.linkStatus(copy), st.st_mode & S_IFMT == S_IFREG { return copy }
        try copySnapshot(snapshot, size: try POSIXFile.size(snapshot, path: path), to: temporary)
        do throws(Errno) {
            try SystemCall.renameat2(AT_FDCWD, temporary, AT_FDCWD, copy, flags: RENAME_NOREPLACE)
        } catch {
            unlink(temporary)
            guard error == .fileExists else { throw FileSystemError("rename", path: copy, errno: error) }
        }
        return copy
    }

    /// Copies `size` bytes of `source` into a new file `path` (0400), flushed.
    private func copySnapshot(_ source: FileDescriptor, size: Int64, to path: String) throws {
        let target = try POSIXFile.open(
            path, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .init(rawValue: 0o400))
        do {
            // At most the size the file had when shared; it must not change meanwhile.
            let copied = try POSIXFile.copyRange(from: source, to: target, offset: 0, count: size, path: path)
            guard copied == size, try POSIXFile.size(source, path: path) == size else {
                throw SharingError.refusedItem(path: path, reason: "changed size while it was being shared")
            }
            try POSIXFile.sync(target, path: path)
            try target.close()
        } catch {
            try? target.close()
            _ = try? POSIXFile.call("unlink", path) { unlink($0) }
            throw error
        }
    }
}
