import CFUSEKernel
import DataProtection
import DataProtectionKeybag
import Foundation
import Logging
import Synchronization
import SystemPackage
#if canImport(Glibc)
import Glibc
#endif

/// An inode the kernel knows by a node ID: held by an `O_PATH` descriptor of the backing item
/// (never a path: every operation is an `*at` call on a parent's descriptor with one name, and
/// never follows a link), shared by every name of a hard-linked file.
final class FileNode: Sendable {
    let id: UInt64
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing item.
    let fd: Int32
    let identity: InodeIdentity
    var inode: UInt64 { identity.inode }
    /// `S_IFMT` bits.
    let kind: mode_t
    /// The node's parent, as last seen (a directory's one parent; one of a file's).
    let parent: Mutex<UInt64>
    /// The name it was last found by in ``parent`` and when (the table's clock): what an
    /// eviction asks the kernel to forget.
    let lastSeen = Mutex<(name: [UInt8], tick: UInt64)>(([], 0))
    /// A directory's own default class (`user.dataprotection.class`), as read at a change time.
    let directoryDefault = Mutex<(changed: timespec, cls: ProtectionClass?)?>(nil)
    /// The file open through this node: one engine for every handle on it.
    let open = Mutex(OpenFile())
    /// The class below which nothing here may go (the highest floor of its directories, see
    /// ``ProtectedFileSystem/floorOfDirectory``): fixed when the node is made, from the parent it
    /// was found in — an item never leaves the subtree of its floor through the mount (a
    /// container is a mount of its own in a sandbox: a rename out of it is `EXDEV`).
    let floor: ProtectionClass?
    /// Whose share of the table the node counts in (the PID namespace of the program whose
    /// request made it, when the table shares itself out: ``NodeTable``).
    let owner: UInt64

    init(id: UInt64, fd: Int32, status st: stat, parent: UInt64, floor: ProtectionClass?, owner: UInt64 = 0) {
        self.floor = floor
        self.owner = owner
        self.id = id
        self.fd = fd
        self.identity = InodeIdentity(st)
        self.kind = st.st_mode & S_IFMT
        self.parent = Mutex(parent)
    }

    var isDirectory: Bool { kind == S_IFDIR }
    var isRegularFile: Bool { kind == S_IFREG }

    /// The path that reopens the backing item (`/proc/self/fd/N`, a link the kernel resolves to
    /// the item itself, never by name).
    var reopenPath: String { "/proc/self/fd/\(fd)" }

    /// `fstatat(fd, "", AT_EMPTY_PATH)`.
    func status() throws(FUSEErrno) -> stat {
        var st = stat()
        guard fstatat(fd, "", &st, cfuse_at_empty_path | AT_SYMLINK_NOFOLLOW) == 0 else { throw FUSEErrno(errno) }
        return st
    }

    deinit { close(fd) }
}

/// A regular file open through the file system: its backing descriptor and, for a protected
/// file, the engine that holds its key (dropped when its class locks, reopened after).
struct OpenFile {
    /// Handles open on the file.
    var handles = 0
    /// The backing file, read-write where the server may (else read-only).
    var descriptor: Int32 = -1
    var writable = false
    /// The protected file's engine; `nil` for a plain file, or while its class is locked.
    var engine: ProtectedFileEngine?
    /// The class of the protected file (`nil`: a plain file, served as it is, read-only).
    var protectionClass: ProtectionClass?
    /// Whether the kernel may hold pages of this class-A file (invalidated at a lock).
    var mayHavePages = false
}

/// The inodes the kernel holds, by node ID and by backing identity (device, inode); an entry
/// lives until the kernel forgets every lookup of it.
final class NodeTable: Sendable {
    private struct State {
        var nodes: [UInt64: (node: FileNode, lookups: UInt64)] = [:]
        var byIdentity: [InodeIdentity: UInt64] = [:]
        var next: UInt64 = 2
        /// Counts lookups: a node's ``FileNode/lastSeen`` tick says how recently it was used.
        var tick: UInt64 = 0
        /// Whether ``overflowing`` was signalled and no pass has run since.
        var evictionPending = false
        /// Nodes held, by owner (only when the table is shared out).
        var held: [UInt64: Int] = [:]
    }
    private let state = Mutex(State())
    let root: FileNode
    /// A directory's own floor, read on its descriptor (``ProtectedFileSystem/floorOfDirectory``).
    private let floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)?
    /// Nodes the table holds at most: each is a descriptor, and descriptors must stay for open
    /// files, directory listings and the server's own needs. Beyond it a lookup gets `ENFILE`.
    let capacity: Int
    /// Beyond this many nodes, the least recently found ones that nothing holds open are given
    /// back (``evictionCandidates()``), down to ``lowWater``: one program's flood of new files
    /// never leaves the others without descriptors.
    var highWater: Int { capacity / 2 }
    var lowWater: Int { capacity * 3 / 8 }
    /// Signalled when the table passes ``highWater``.
    let overflowing = DispatchSemaphore(value: 0)
    /// Whether directories — the nodes never given back to the kernel (see
    /// ``ProtectedFileSystem/evictUnused(_:)``) — are shared out among the programs' PID
    /// namespaces (apps: one each), so that one app's flood of them leaves room for the others:
    /// with *k* owners holding directories, each may have new ones while it holds fewer than
    /// 2/(*k* + 2) of ``capacity`` (alone, two thirds; a newcomer finds at least a third). Other
    /// nodes are given back, least recently found first, whoever made them.
    let sharedByRequester: Bool

    init(rootDescriptor: Int32, floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)? = nil, maxNodes: Int? = nil,
         sharedByRequester: Bool = false) throws {
        var st = stat()
        guard fstat(rootDescriptor, &st) == 0 else { throw FileSystemServerError.system("stat", errno) }
        self.floorOfDirectory = floorOfDirectory
        self.sharedByRequester = sharedByRequester
        // A node holds a descriptor, and a second while open as a file: both within three
        // quarters of the limit, the rest left for the server's own short-lived ones.
        let descriptors = DescriptorLimit.raise() * 3 / 8
        capacity = max(64, min(descriptors, maxNodes ?? descriptors))
        root = FileNode(id: UInt64(FUSE_ROOT_ID_VALUE), fd: rootDescriptor, status: st, parent: UInt64(FUSE_ROOT_ID_VALUE),
                        floor: floorOfDirectory?(rootDescriptor))
        state.withLock {
            $0.nodes[root.id] = (root, 1)
            $0.byIdentity[root.identity] = root.id
        }
    }

    func node(_ id: UInt64) throws(FUSEErrno) -> FileNode {
        guard let node = state.withLock({ $0.nodes[id]?.node }) else { throw FUSEErrno(ESTALE) }
        return node
    }

    /// Looks `name` up in `parent` (never following a link) and counts a lookup of its node.
    /// With the inode number a directory listing gave (`inodeHint`), a node the kernel holds for
    /// that inode is found with one `fstatat` (the name must still lead to it).
    func lookup(_ name: [UInt8], in parent: FileNode, inodeHint: UInt64? = nil) throws(FUSEErrno) -> (FileNode, stat) {
        if let inodeHint, let known = existing(InodeIdentity(device: parent.identity.device, inode: inodeHint)) {
            var st = stat()
            if withName(name, { fstatat(parent.fd, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0, InodeIdentity(st) == known.identity,
               st.st_mode & S_IFMT == known.kind, count(known, parent: parent.id, name: name) {
                return (known, st)
            }
        }
        let fd = withName(name) { openat(parent.fd, $0, cfuse_o_path | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw FUSEErrno(errno == EMFILE ? ENFILE : errno) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { let code = errno; close(fd); throw FUSEErrno(code) }
        return (try adopt(fd, st, parent: parent, name: name), st)
    }

    /// The node for a descriptor just opened (an existing node for the same inode keeps its own
    /// descriptor, and this one is closed), with one more lookup counted.
    ///
    /// A new node's floor is its parent's, raised by its own when it is a directory with one;
    /// beyond ``capacity`` nodes, `ENFILE` (the descriptor is closed).
    func adopt(_ fd: Int32, _ st: stat, parent: FileNode, name: [UInt8]) throws(FUSEErrno) -> FileNode {
        let identity = InodeIdentity(st)
        if let known = reuse(identity, st, parent: parent.id, name: name) {
            close(fd)
            return known
        }
        var floor = parent.floor
        if st.st_mode & S_IFMT == S_IFDIR, let own = floorOfDirectory?(fd) { floor = max(floor ?? own, own) }
        let shared = sharedByRequester && st.st_mode & S_IFMT == S_IFDIR
        let owner = shared ? Requester.namespace : 0
        let (node, adopted) = state.withLock { state -> (FileNode?, Bool) in
            if let known = Self.counted(identity, st, parent: parent.id, name: name, in: &state) { return (known, false) }
            guard state.nodes.count < capacity, !shared || hasRoom(for: owner, in: state) else { return (nil, false) }
            if shared { state.held[owner, default: 0] += 1 }
            let node = FileNode(id: state.next, fd: fd, status: st, parent: parent.id, floor: floor, owner: owner)
            state.next += 1
            state.tick += 1
            node.lastSeen.withLock { $0 = (name, state.tick) }
            state.nodes[node.id] = (node, 1)
            state.byIdentity[identity] = node.id
            if state.nodes.count > highWater, !state.evictionPending {
                state.evictionPending = true
                overflowing.signal()
            }
            return (node, true)
        }
        if !adopted { close(fd) }
        guard let node else { throw FUSEErrno(ENFILE) }
        return node
    }

    /// Whether `owner` may have one more directory (``sharedByRequester``).
    private func hasRoom(for owner: UInt64, in state: State) -> Bool {
        let owners = state.held.count + (state.held[owner] == nil ? 1 : 0)
        return state.held[owner, default: 0] < capacity * 2 / (owners + 2)
    }

    /// Refuses (`ENFILE`) before anything is made on disk when the table has no room for a new
    /// node — for a directory, of the program asking —: the make (create, mkdir…) would be done,
    /// and its node refused.
    func requireRoom(directory: Bool = false) throws(FUSEErrno) {
        let owner = sharedByRequester && directory ? Requester.namespace : 0
        guard state.withLock({ $0.nodes.count < capacity && (!sharedByRequester || !directory || hasRoom(for: owner, in: $0)) }) else {
            throw FUSEErrno(ENFILE)
        }
    }

    /// The node the kernel holds for `identity` (of the same kind), with one more lookup counted.
    private func reuse(_ identity: InodeIdentity, _ st: stat, parent: UInt64, name: [UInt8]) -> FileNode? {
        state.withLock { Self.counted(identity, st, parent: parent, name: name, in: &$0) }
    }

    private static func counted(_ identity: InodeIdentity, _ st: stat, parent: UInt64, name: [UInt8], in state: inout State) -> FileNode? {
        guard let id = state.byIdentity[identity], var entry = state.nodes[id], entry.node.kind == st.st_mode & S_IFMT else { return nil }
        entry.lookups += 1
        state.nodes[id] = entry
        state.tick += 1
        let tick = state.tick
        entry.node.parent.withLock { $0 = parent }
        entry.node.lastSeen.withLock { $0 = (name, tick) }
        return entry.node
    }

    /// An eviction pass is over: the next node beyond ``highWater`` signals again.
    func evictionDone() { state.withLock { $0.evictionPending = false } }

    /// The least recently found nodes beyond ``lowWater`` (never the root nor a directory), oldest first, with
    /// the parent and name to ask the kernel to forget; those open are left to the caller to skip.
    func evictionCandidates() -> [(node: FileNode, parent: UInt64, name: [UInt8])] {
        let all = state.withLock { state -> [FileNode] in
            state.nodes.count > lowWater ? state.nodes.values.map(\.node) : []
        }
        guard all.count > lowWater else { return [] }
        // Directories are never given back (see ProtectedFileSystem.evictUnused): the others,
        // oldest first, however many directories are older.
        let seen = all.filter { $0.id != root.id && !$0.isDirectory }.map { node in (node, node.lastSeen.withLock { $0 }) }
            .filter { !$0.1.name.isEmpty }
            .sorted { $0.1.tick < $1.1.tick }
        return seen.prefix(all.count - lowWater).map { ($0.0, $0.0.parent.withLock { $0 }, $0.1.name) }
    }

    /// Counts one more lookup of `node`, if the kernel still holds it.
    private func count(_ node: FileNode, parent: UInt64, name: [UInt8]) -> Bool {
        state.withLock { state in
            guard var entry = state.nodes[node.id], entry.node === node else { return false }
            entry.lookups += 1
            state.nodes[node.id] = entry
            state.tick += 1
            let tick = state.tick
            node.parent.withLock { $0 = parent }
            node.lastSeen.withLock { $0 = (name, tick) }
            return true
        }
    }

    /// The kernel forgets `count` lookups of `id`; at none left the node goes (its descriptor is
    /// closed after the table is unlocked: a `close` never holds up other requests).
    func forget(_ id: UInt64, count: UInt64) {
        guard id != root.id else { return }
        let gone: FileNode? = state.withLock { state in
            guard var entry = state.nodes[id] else { return nil }
            entry.lookups = entry.lookups > count ? entry.lookups - count : 0
            if entry.lookups == 0 {
                state.nodes[id] = nil
                if state.byIdentity[entry.node.identity] == id { state.byIdentity[entry.node.identity] = nil }
                if sharedByRequester, entry.node.isDirectory, let count = state.held[entry.node.owner] {
                    state.held[entry.node.owner] = count > 1 ? count - 1 : nil
                }
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

/// FUSE's root node ID.
let FUSE_ROOT_ID_VALUE = 1

/// Runs `body` with `name` (bytes, any encoding) as a C string.
func withName<T>(_ name: [UInt8], _ body: (UnsafePointer<CChar>) -> T) -> T {
    (name + [0]).withUnsafeBufferPointer { body(UnsafeRawPointer($0.baseAddress!).assumingMemoryBound(to: CChar.self)) }
}

/// This process's descriptor limit, raised for a server that holds one descriptor per inode the
/// kernel holds.
enum DescriptorLimit {
    /// Raises the soft limit to the hard one (as root, the hard one first to `fs.nr_open`, at
    /// most 2^20) and returns the soft limit.
    static func raise() -> Int {
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0 else { return 1024 }
        if geteuid() == 0, let text = try? String(contentsOfFile: "/proc/sys/fs/nr_open", encoding: .utf8),
           let most = rlim_t(text.trimmingCharacters(in: .whitespacesAndNewlines)), limit.rlim_max < min(most, 1 << 20) {
            var raised = limit
            raised.rlim_max = min(most, 1 << 20)
            raised.rlim_cur = raised.rlim_max
            if setrlimit(resource, &raised) == 0 { return Int(raised.rlim_cur) }
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            if setrlimit(resource, &limit) != 0 { _ = getrlimit(resource, &limit) }
        }
        return Int(clamping: limit.rlim_cur)
    }
}
