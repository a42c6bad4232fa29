import DataProtection
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The inodes the kernel holds, by node ID and by backing identity (device, inode); an entry
/// lives until the kernel forgets every lookup of it.
///
/// Each node holds a descriptor, so the table holds at most ``capacity`` nodes. Past
/// ``highWater``, the least recently found files nobody holds open are given back to the kernel
/// (``evictionCandidates()``). Shared among apps (``sharedByRequester``), every node also counts
/// in the share of the program that made it (`NodeTable+Shares.swift`).
final class NodeTable: Sendable {
    struct State {
        var nodes: [UInt64: (node: FileNode, lookups: UInt64)] = [:]
        var byIdentity: [InodeIdentity: UInt64] = [:]
        var next: UInt64 = 2
        /// Counts lookups: a node's ``FileNode/lastSeen`` tick says how recently it was used.
        var tick: UInt64 = 0
        /// Whether ``overflowing`` was signalled and no pass has run since.
        var evictionPending = false
        /// Counts what makes a file a candidate for eviction that the last pass could not
        /// choose: a file made since, one it asked for found again, one it passed over as open
        /// closed (``fileClosed()``). Nothing else: a refused request asks for a pass only when
        /// it can give something back, so refusals never keep the evictor busy for nothing.
        var fileChanges: UInt64 = 0
        /// ``fileChanges`` when the last pass chose its candidates.
        var fileChangesAtPass: UInt64 = 0
        /// Nodes promised to makes under way (``reserve()``), counted as if held.
        var reserved = 0
        /// The programs charged with nodes, by serial (``FileNode/owner``).
        var owners: [UInt64: Owner] = [:]
        /// The serial of each charged program's key (its PID namespace, or its app's key).
        var serials: [UInt64: UInt64] = [:]
        var nextSerial: UInt64 = 1
    }
    let state = Mutex(State())
    let root: FileNode
    /// A directory's own floor, read on its descriptor (``ProtectedFileSystem/floorOfDirectory``).
    private let floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)?
    /// Nodes the table holds at most: each is a descriptor, and descriptors must stay for open
    /// files, directory listings and the server's own needs. Beyond it a lookup gets `ENFILE`.
    let capacity: Int
    /// Beyond this many nodes, the least recently found ones that nothing holds open are given
    /// back (``evictionCandidates(sparing:)``), down to ``lowWater``: one program's flood of new
    /// files never leaves the others without descriptors. Shared, a quarter: a program alone may
    /// hold two thirds, and its flood of new files keeps going while the kernel forgets.
    var highWater: Int { sharedByRequester ? capacity / 4 : capacity / 2 }
    var lowWater: Int { sharedByRequester ? capacity * 3 / 16 : capacity * 3 / 8 }
    /// Signalled when the table passes ``highWater``.
    let overflowing = DispatchSemaphore(value: 0)
    /// Whether the table is shared out among the programs' PID namespaces (apps: one each), so
    /// that no app's nodes — directories, never given back (see
    /// ``ProtectedFileSystem/evictUnused(_:)``), and files it keeps open or pinned — leave the
    /// others without room (``NodeTable/charge(_:in:)``).
    let sharedByRequester: Bool
    /// Items found at the root under a name that starts with one of these (a share's snapshot,
    /// linked there for a moment to be opened) are read-only through the mount for as long as
    /// the kernel holds them: no write, truncation, mode, owner, time or attribute change (`EPERM`).
    let readOnlyPrefixes: [[UInt8]]
    /// The apps admitted to the mount: each one's nodes count in one share, whichever of its
    /// runs made them.
    let apps: ServedApps

    init(
        rootDescriptor: Int32, floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)? = nil, maxNodes: Int? = nil,
        sharedByRequester: Bool = false, readOnlyPrefixes: [[UInt8]] = [], apps: ServedApps = ServedApps()
    ) throws {
        var st = stat()
        guard fstat(rootDescriptor, &st) == 0 else {
            throw MountError.system("stat", Errno(rawValue: errno))
        }
        self.floorOfDirectory = floorOfDirectory
        self.sharedByRequester = sharedByRequester
        self.readOnlyPrefixes = readOnlyPrefixes
        self.apps = apps
        // A node holds a descriptor, and a second while open as a file: both within three
        // quarters of the limit, the rest left for the server's own short-lived ones.
        let descriptors = DescriptorLimit.raise() * 3 / 8
        capacity = max(64, min(descriptors, maxNodes ?? descriptors))
        let rootFloor = floorOfDirectory?(rootDescriptor)
        root = FileNode(
            id: UInt64(FUSE_ROOT_ID_VALUE), fd: rootDescriptor, status: st, parent: UInt64(FUSE_ROOT_ID_VALUE),
            floor: rootFloor, zone: rootFloor == nil ? nil : InodeIdentity(st))
        state.withLock {
            $0.nodes[root.id] = (root, 1)
            $0.byIdentity[root.identity] = root.id
        }
    }

    func node(_ id: UInt64) throws(Errno) -> FileNode {
        guard let node = state.withLock({ $0.nodes[id]?.node }) else { throw Errno(rawValue: ESTALE) }
        return node
    }

    /// Looks `name` up in `parent` (never following a link) and counts a lookup of its node.
    /// With the inode number a directory listing gave (`inodeHint`), a node the kernel holds for
    /// that inode is found with one `fstatat` (the name must still lead to it). A new node takes
    /// `reservation` if given (an item just made), else room in the requester's share.
    func lookup(
        _ name: [UInt8], in parent: FileNode, inodeHint: UInt64? = nil, reservation: Reservation? = nil
    ) throws(Errno) -> (FileNode, stat) {
        if let inodeHint, let known = existing(InodeIdentity(device: parent.identity.device, inode: inodeHint)) {
            var st = stat()
            if withName(name, { fstatat(parent.fd, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0,
                InodeIdentity(st) == known.identity,
                st.st_mode & S_IFMT == known.kind, count(known, parent: parent.id, name: name)
            {
                return (known, st)
            }
        }
        let fd = withName(name) { openat(parent.fd, $0, O_PATH | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw Errno(rawValue: errno == EMFILE ? ENFILE : errno) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { let code = errno; close(fd); throw Errno(rawValue: code) }
        return (try adopt(fd, st, parent: parent, name: name, reservation: reservation), st)
    }

    /// The node for a descriptor just opened (an existing node for the same inode keeps its own
    /// descriptor, and this one is closed), with one more lookup counted.
    ///
    /// A new node's floor is its parent's, raised by its own when it is a directory found (not
    /// just made) with one. It
    /// takes `reservation` if given; else, with no room (``capacity``, or the requester's share),
    /// `ENFILE` (the descriptor is closed).
    func adopt(
        _ fd: Int32, _ st: stat, parent: FileNode, name: [UInt8], reservation: Reservation? = nil
    ) throws(Errno) -> FileNode {
        let identity = InodeIdentity(st)
        if let known = reuse(identity, st, parent: parent.id, name: name) {
            close(fd)
            return known
        }
        var floor = parent.floor, zone = parent.zone
        // A directory made through the mount (a reservation) holds no metadata of its own: the
        // name is reserved there. Only one found can have a floor of its own.
        if reservation == nil, st.st_mode & S_IFMT == S_IFDIR, let own = floorOfDirectory?(fd) {
            floor = max(floor ?? own, own)
            zone = identity
        }
        let claimant = reservation == nil ? claimant() : nil
        let readOnly = parent === root && readOnlyPrefixes.contains { name.starts(with: $0) }
        let (node, adopted) = state.withLock { state -> (FileNode?, Bool) in
            if let known = Self.counted(identity, st, parent: parent.id, name: name, in: &state) {
                return (known, false)
            }
            let owner: UInt64
            if let reservation, reservation.take() {
                state.reserved -= 1
                owner = reservation.owner
            } else if let charged = charge(claimant, in: &state) {
                owner = charged
            } else {
                askForPassOnRefusal(in: &state)
                return (nil, false)
            }
            let node = FileNode(
                id: state.next, fd: fd, status: st, parent: parent.id, floor: floor, zone: zone, owner: owner,
                isReadOnly: readOnly)
            state.next += 1
            state.tick += 1
            node.lastSeen.withLock { $0 = (name, state.tick) }
            state.nodes[node.id] = (node, 1)
            state.byIdentity[identity] = node.id
            if !node.isDirectory { state.fileChanges &+= 1 }
            if state.nodes.count > highWater, !state.evictionPending {
                state.evictionPending = true
                overflowing.signal()
            }
            return (node, true)
        }
        if !adopted { close(fd) }
        guard let node else { throw Errno(rawValue: ENFILE) }
        return node
    }

    /// The node the kernel holds for `identity` (of the same kind), with one more lookup counted.
    private func reuse(_ identity: InodeIdentity, _ st: stat, parent: UInt64, name: [UInt8]) -> FileNode? {
        state.withLock { Self.counted(identity, st, parent: parent, name: name, in: &$0) }
    }

    private static func counted(
        _ identity: InodeIdentity, _ st: stat, parent: UInt64, name: [UInt8], in state: inout State
    ) -> FileNode? {
        guard let id = state.byIdentity[identity], var entry = state.nodes[id], entry.node.kind == st.st_mode & S_IFMT
        else { return nil }
        entry.lookups += 1
        state.nodes[id] = entry
        state.tick += 1
        if entry.node.evictionAsked.withLock({ $0 != nil }) { state.fileChanges &+= 1 }
        let tick = state.tick
        entry.node.parent.withLock { $0 = parent }
        entry.node.lastSeen.withLock { $0 = (name, tick) }
        return entry.node
    }

    /// An eviction pass is over: the next node beyond ``highWater`` signals again.
    func evictionDone() { state.withLock { $0.evictionPending = false } }

    /// `node` renamed: an eviction asks the kernel to forget its new name. Asked for under its
    /// old name (the kernel forgot nothing: the name had moved), it may be asked for again.
    func move(_ node: FileNode, to parent: UInt64, name: [UInt8]) {
        node.parent.withLock { $0 = parent }
        node.lastSeen.withLock { $0.name = name }
        guard
            node.evictionAsked.withLock({ asked in
                defer { asked = nil }; return asked != nil
            })
        else { return }
        state.withLock { $0.fileChanges &+= 1 }
    }

    /// A file a pass passed over as open closed its last handle: it may be given back now.
    func fileClosed() { state.withLock { $0.fileChanges &+= 1 } }

    /// A request refused for want of room asks for a pass if none is under way and a file became
    /// a candidate the last one could not choose (``State/fileChanges``).
    /// Else a table left full by a pass that ran while its newest files were open would stay
    /// full: passes are otherwise asked for only by new nodes, and every later make is refused.
    /// The request never waits for the pass: the kernel holds the parent directory's lock until
    /// it is answered, and asking it to forget a name there takes that lock.
    func askForPassOnRefusal(in state: inout State) {
        guard !state.evictionPending, state.fileChanges != state.fileChangesAtPass, state.nodes.count > lowWater else {
            return
        }
        state.evictionPending = true
        overflowing.signal()
    }

    /// The least recently found nodes beyond ``lowWater``, oldest first, with the parent and name
    /// to ask the kernel to forget: never the root, a directory, a file open or a name `spared`,
    /// nor one asked before and not found since (the kernel keeps what a program pins: asking
    /// again would only take the place of others it would give back).
    func evictionCandidates(sparing spared: ([UInt8]) -> Bool) -> [(node: FileNode, parent: UInt64, name: [UInt8])] {
        let all = state.withLock { state -> [FileNode] in
            state.fileChangesAtPass = state.fileChanges
            return state.nodes.count > lowWater ? state.nodes.values.map(\.node) : []
        }
        guard all.count > lowWater else { return [] }
        // Directories are never given back (see ProtectedFileSystem.evictUnused): the others,
        // oldest first, however many directories are older.
        let seen = all.filter { $0.id != root.id && !$0.isDirectory }.compactMap {
            node -> (FileNode, (name: [UInt8], tick: UInt64))? in
            let seen = node.lastSeen.withLock { $0 }
            guard !seen.name.isEmpty, !spared(seen.name), node.evictionAsked.withLock({ $0 != seen.tick }),
                node.open.withLock({ file in
                    if file.handles > 0 { file.passedOverWhileOpen = true }
                    return file.handles == 0
                })
            else { return nil }
            return (node, seen)
        }.sorted { $0.1.tick < $1.1.tick }
        return seen.prefix(all.count - lowWater).map { candidate in
            candidate.0.evictionAsked.withLock { $0 = candidate.1.tick }
            return (candidate.0, candidate.0.parent.withLock { $0 }, candidate.1.name)
        }
    }

    /// Counts one more lookup of `node`, if the kernel still holds it.
    private func count(_ node: FileNode, parent: UInt64, name: [UInt8]) -> Bool {
        state.withLock { state in
            guard var entry = state.nodes[node.id], entry.node === node else { return false }
            entry.lookups += 1
            state.nodes[node.id] = entry
            state.tick += 1
            if node.evictionAsked.withLock({ $0 != nil }) { state.fileChanges &+= 1 }
            let tick = state.tick
            node.parent.withLock { $0 = parent }
            node.lastSeen.withLock { $0 = (name, tick) }
            return true
        }
    }

    /// The kernel forgets `count` lookups of `id`; at none left the node goes, and leaves its
    /// owner's share (its descriptor is closed after the table is unlocked: a `close` never
    /// holds up other requests).
    func forget(_ id: UInt64, count: UInt64) {
        guard id != root.id else { return }
        let gone: FileNode? = state.withLock { state in
            guard var entry = state.nodes[id] else { return nil }
            entry.lookups = entry.lookups > count ? entry.lookups - count : 0
            if entry.lookups == 0 {
                state.nodes[id] = nil
                if state.byIdentity[entry.node.identity] == id { state.byIdentity[entry.node.identity] = nil }
                Self.uncharge(entry.node.owner, in: &state)
                return entry.node
            }
            state.nodes[id] = entry
            return nil
        }
        withExtendedLifetime(gone) {}
    }

    /// The node of a backing inode, if the kernel holds one.
    func existing(_ identity: InodeIdentity) -> FileNode? {
        state.withLock { state in state.byIdentity[identity].flatMap { state.nodes[$0]?.node } }
    }

    /// Every node (for a lock: the class-A files whose pages must go).
    var all: [FileNode] { state.withLock { $0.nodes.values.map(\.node) } }
}
