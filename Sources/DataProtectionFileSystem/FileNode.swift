import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
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
    /// The ``lastSeen`` tick at which the kernel was last asked to forget the node: not asked
    /// again until it is found again (a program pins it — an `O_PATH` descriptor, a working
    /// directory — and the kernel keeps it whatever it is asked).
    let evictionAsked = Mutex<UInt64?>(nil)
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
    /// Whether the item may not be changed through the mount at all (``NodeTable/readOnlyPrefixes``).
    let isReadOnly: Bool
    /// The directory whose floor the node is under — the nearest found with a floor of its own (a
    /// container's root), fixed like ``floor`` when the node is made — or `nil` outside every one:
    /// what decides whether an app owns it (``ServedApps``), in one step.
    let zone: InodeIdentity?

    init(
        id: UInt64, fd: Int32, status st: stat, parent: UInt64, floor: ProtectionClass?, zone: InodeIdentity? = nil,
        owner: UInt64 = 0, isReadOnly: Bool = false
    ) {
        self.floor = floor
        self.zone = zone
        self.owner = owner
        self.isReadOnly = isReadOnly
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
    func status() throws(Errno) -> stat {
        var st = stat()
        guard fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 else { throw Errno(rawValue: errno) }
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
    /// Whether an eviction pass passed the file over because it was open: its last close may
    /// let a refused request ask for another (``NodeTable/fileClosed()``).
    var passedOverWhileOpen = false
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
            let most = rlim_t(text.trimmingCharacters(in: .whitespacesAndNewlines)), limit.rlim_max < min(most, 1 << 20)
        {
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
