import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// What an admitted app may do outside its territories (``ServedApps``): no more than the
/// descriptor it was handed allows.
extension ProtectedFileSystem {
    /// Throws `code` when the request comes from an admitted app and `node` is outside its
    /// territories.
    ///
    /// A request whose process ended while it was under way (its namespace can no longer be
    /// read) is refused while any app is admitted: an app must not get past this check by
    /// ending the thread that asks.
    func requireTerritory(_ node: FileNode, else code: Int32 = EPERM) throws(Errno) {
        if isOutsideRequestersTerritories(node) { throw Errno(rawValue: code) }
    }

    /// Whether the request comes from an admitted app (or a process that can no longer be told)
    /// and `node` is outside its territories.
    private func isOutsideRequestersTerritories(_ node: FileNode) -> Bool {
        switch apps.requesting {
        case .unconfined: false
        case .unknown: true
        case .app(let app): !isWithin(node, app.territories)
        }
    }

    /// Whether `node` is one of `territories` or below one. Territories are directories with a
    /// floor of their own (containers' roots): a node under one has it as its ``FileNode/zone``,
    /// fixed when the node was made (names never cross from one container to another through
    /// the mount: each is a mount of its own in a sandbox) — one step, however deep the node.
    /// A node under no floor (outside every container: a share's snapshot, the directories
    /// above the containers) is outside, unless a territory above it is found by the parents
    /// the kernel found it in. A chain longer than the table is a loop, and outside.
    func isWithin(_ node: FileNode, _ territories: Set<InodeIdentity>) -> Bool {
        if let zone = node.zone { return territories.contains(zone) }
        var current = node
        for _ in 0...nodes.capacity {
            if territories.contains(current.identity) { return true }
            if current.id == nodes.root.id { return false }
            guard let parent = try? nodes.node(current.parent.withLock({ $0 })) else { return false }
            current = parent
        }
        return false
    }

    /// A SETATTR outside the requester's territories may only change the size and touch the
    /// times to now, through a handle open for writing (what `ftruncate` sends on a writable
    /// grant's descriptor): never a mode, an owner or explicit times.
    func requireTerritory(_ node: FileNode, change: AttributeChange) throws(Errno) {
        guard isOutsideRequestersTerritories(node) else { return }
        guard change.isSizeOrTouchOnly, let handle = change.handle, let (held, writable) = try? handles.file(handle),
            held === node, writable
        else { throw Errno(rawValue: EPERM) }
    }
}
