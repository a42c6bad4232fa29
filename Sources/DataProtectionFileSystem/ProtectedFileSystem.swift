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

/// A directory of protected files served as a file system (FUSE), so that every program —
/// a shell, Python, the `sqlite3` CLI, git — reads plaintext through it while every regular file
/// on disk is a protected file (FORMAT.md §14), and the classes hold at every call, as on iOS:
///
/// - a new file gets its directory's default class (inherited, as ``ProtectedFileManager``
///   gives it), with 4 KiB segments;
/// - **A**: after lock + grace, opens, reads and writes fail (`EACCES`), and pages the kernel
///   cached are dropped and unmapped (a mapped page faults: `SIGBUS`);
/// - **B**: while locked, files can be created and written, descriptors opened before keep
///   working, and a new open of an existing file fails until unlock;
/// - **C**: nothing opens before the first unlock; **D**: always.
///
/// A file's class, and a directory's default, are the extended attribute
/// `user.dataprotection.class` on the mount (`getfattr`, `setfattr`, `os.setxattr`): setting it on
/// a file rewraps its key. Files already in the directory in the protected format read as
/// they are; plain files are served as they are (and `dpctl ls` and the audit report them).
///
/// ```swift
/// let fileSystem = try ProtectedFileSystem(directory: "/home/me/Private", files: files)
/// let mount = try fileSystem.mount(at: "/home/me/mnt")
/// await mount.serve()          // until unmounted
/// ```
public final class ProtectedFileSystem: Sendable {
    /// The directory served.
    public let directory: String
    let files: ProtectedFileManager
    let nodes: NodeTable
    let handles = HandleTable()
    let gate = ClassGate()
    /// Zero fills under way (``withRoomForZeros(_:upTo:_:)``).
    let fills = ZeroFills()
    /// What regular files are by their first bytes, kept beyond the kernel's nodes.
    let kinds = FileKindCache()
    /// The default class of new files at the directory's root (the nearest default above it).
    let rootDefault: ProtectionClass
    /// The class a directory's subtree may never go below, if it has one (an app's container:
    /// the class its user chose), read on the directory's descriptor.
    let floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)?
    /// Whether set-user-ID and set-group-ID bits are refused (`EPERM`) rather than kept.
    let refusesSetID: Bool
    /// Whether callers may lack this server's capabilities (``init(directory:files:floorOfDirectory:refusesSetID:reservedNames:sharesNodesAmongApps:servesWithoutPrivileges:readOnlyPrefixes:maxNodes:)``).
    let servesWithoutPrivileges: Bool
    /// Names no program may make, remove, rename or link through the mount (`EPERM`), anywhere:
    /// what the server reads its floors from (a container's metadata).
    let reservedNames: Set<[UInt8]>
    /// The sandboxed apps served, when the mount is shared among apps: what each may change
    /// outside its own containers (nothing but through a descriptor it was handed), and whose
    /// share of the inodes its nodes count in.
    public let apps = ServedApps()
    let logger = Logger(label: "dataprotection.filesystem")
    /// Requests the kernel asked to interrupt (their program got a signal) while they run: a
    /// long one (a zero fill) stops at its next step and answers `EINTR`.
    let interrupts = Mutex<Set<UInt64>>([])

    /// Opens `directory` for serving (it must exist and be a directory).
    ///
    /// - Parameters:
    ///   - floorOfDirectory: the class below which nothing in a directory's subtree may go, read
    ///     from the directory's descriptor (`nil`: none): new files get at least it, and setting a
    ///     file's class or a directory's default below it is refused (`EPERM`). Asked again when
    ///     the directory's change time moves.
    ///   - refusesSetID: refuse set-user-ID and set-group-ID bits (`EPERM`), as apps need.
    ///   - reservedNames: names no program may make, remove, rename or link through the mount.
    ///   - sharesNodesAmongApps: share the inodes served out among the programs' PID
    ///     namespaces (each sandboxed app has its own), so that one app's flood of directories,
    ///     or of files it keeps open or pinned, leaves room for the others
    ///     (``NodeTable/sharedByRequester``).
    ///   - servesWithoutPrivileges: callers may lack the capabilities of this server's user
    ///     (sandboxed apps: root without `CAP_DAC_OVERRIDE`, `CAP_FOWNER`…): a server run as root
    ///     then has the kernel check modes and owners with each caller's own credentials
    ///     (`default_permissions`, one round trip more per created or removed file), so that a
    ///     file its user made read-only stays so. Not as root, every caller already has this
    ///     server's user ID and no capability, and the backing file system's answer is theirs.
    ///   - readOnlyPrefixes: items found at the directory's root under a name starting with one
    ///     of these cannot be changed through the mount (`EPERM`): no write, truncation, mode,
    ///     owner, time or attribute change, whoever holds a descriptor of them.
    ///   - maxNodes: the most inodes served at once (each holds a descriptor, and one more while
    ///     it is open as a file; default: three eighths of the descriptor limit, so that both stay
    ///     within three quarters of it). Past half of it, the least recently found are given back
    ///     to the kernel.
    public init(directory: String, files: ProtectedFileManager, floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)? = nil,
                refusesSetID: Bool = false, reservedNames: Set<String> = [], sharesNodesAmongApps: Bool = false,
                servesWithoutPrivileges: Bool = false, readOnlyPrefixes: Set<String> = [], maxNodes: Int? = nil) throws {
        let absolute = URL(fileURLWithPath: directory).standardizedFileURL.path
        let fd = open(absolute, cfuse_o_path | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw FileSystemServerError.badMountPoint(absolute, "cannot be served: \(String(cString: strerror(errno)))") }
        self.directory = absolute
        self.files = files
        self.nodes = try NodeTable(rootDescriptor: fd, floorOfDirectory: floorOfDirectory, maxNodes: maxNodes,
                                   sharedByRequester: sharesNodesAmongApps, readOnlyPrefixes: readOnlyPrefixes.map { Array($0.utf8) },
                                   apps: apps)
        self.rootDefault = files.defaultProtection(forNewItemAt: URL(fileURLWithPath: absolute + "/x"))
        self.floorOfDirectory = floorOfDirectory
        self.refusesSetID = refusesSetID
        self.servesWithoutPrivileges = servesWithoutPrivileges
        self.reservedNames = Set(reservedNames.map { Array($0.utf8) })
    }

    /// Mounts the file system at `mountPoint`. Serve it with ``MountedFileSystem/serve()``.
    ///
    /// - Throws: ``FileSystemServerError/unavailable(_:)`` without `/dev/fuse` or `fusermount3`.
    public func mount(at mountPoint: String) throws -> MountedFileSystem {
        let absolute = URL(fileURLWithPath: mountPoint).standardizedFileURL.path
        if absolute == directory || absolute.hasPrefix(directory + "/") {
            throw FileSystemServerError.badMountPoint(absolute, "is inside the directory it would serve")
        }
        let device = try FUSEDevice.mount(at: absolute, kernelChecksPermissions: servesWithoutPrivileges && geteuid() == 0)
        return MountedFileSystem(fileSystem: self, device: device)
    }

    // MARK: - Dispatch

    /// Answers one request (every reply is written before this returns, except for those the
    /// protocol does not answer: FORGET, BATCH_FORGET, INTERRUPT).
    func handle(_ request: FUSERequest, replier: FUSEReplier) {
        let op = fuse_opcode(rawValue: request.opcode)
        do throws(FUSEErrno) {
            switch op {
            case FUSE_INIT: try initialize(request, replier)
            case FUSE_DESTROY: replier.reply(request.unique)
            case FUSE_FORGET:
                let argument = try request.argument(fuse_forget_in.self)
                nodes.forget(request.nodeID, count: argument.nlookup)
            case FUSE_BATCH_FORGET: try batchForget(request)
            case FUSE_INTERRUPT:
                let argument = try request.argument(fuse_interrupt_in.self)
                interrupts.withLock { pending in
                    if pending.count > 4096 { pending.removeAll() }   // interrupts of requests long answered
                    pending.insert(argument.unique)
                }
            case FUSE_LOOKUP: try lookup(request, replier)
            case FUSE_GETATTR: try getAttributes(request, replier)
            case FUSE_ACCESS: try checkAccess(request, replier)
            case FUSE_SETATTR: try setAttributes(request, replier)
            case FUSE_READLINK: try readLink(request, replier)
            case FUSE_SYMLINK: try symbolicLink(request, replier)
            case FUSE_MKNOD: try makeNode(request, replier)
            case FUSE_MKDIR: try makeDirectory(request, replier)
            case FUSE_UNLINK: try remove(request, replier, directory: false)
            case FUSE_RMDIR: try remove(request, replier, directory: true)
            case FUSE_RENAME: try rename(request, replier, extended: false)
            case FUSE_RENAME2: try rename(request, replier, extended: true)
            case FUSE_LINK: try link(request, replier)
            case FUSE_OPEN: try openFile(request, replier)
            case FUSE_CREATE: try createFile(request, replier)
            case FUSE_READ: try read(request, replier)
            case FUSE_WRITE: try write(request, replier)
            // Nothing to do at a close: every WRITE is written when answered, and locks are the
            // kernel's. ENOSYS makes the kernel stop asking (one round trip less per close).
            case FUSE_FLUSH: throw FUSEErrno(ENOSYS)
            case FUSE_RELEASE: try release(request, replier)
            case FUSE_FSYNC: try synchronize(request, replier)
            case FUSE_FALLOCATE: try allocate(request, replier)
            case FUSE_STATFS: try fileSystemStatus(request, replier)
            case FUSE_OPENDIR: try openDirectory(request, replier)
            case FUSE_READDIR: try readDirectory(request, replier, plus: false)
            case FUSE_READDIRPLUS: try readDirectory(request, replier, plus: true)
            case FUSE_RELEASEDIR: try releaseDirectory(request, replier)
            case FUSE_FSYNCDIR: try synchronizeDirectory(request, replier)
            case FUSE_GETXATTR: try getExtendedAttribute(request, replier)
            case FUSE_SETXATTR: try setExtendedAttribute(request, replier)
            case FUSE_LISTXATTR: try listExtendedAttributes(request, replier)
            case FUSE_REMOVEXATTR: try removeExtendedAttribute(request, replier)
            case FUSE_IOCTL: throw FUSEErrno(ENOTTY)       // not remembered by the kernel: the cheapest answer
            default: throw FUSEErrno(ENOSYS)                // the kernel remembers it for most calls
            }
        } catch {
            replier.reply(request.unique, error: error.code)
        }
        if op != FUSE_INTERRUPT { interrupts.withLock { if !$0.isEmpty { $0.remove(request.unique) } } }
    }

    /// Whether the kernel asked to interrupt request `unique`.
    func isInterrupted(_ unique: UInt64) -> Bool { interrupts.withLock { !$0.isEmpty && $0.contains(unique) } }

    private func initialize(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let offered = try request.argument(fuse_init_in.self)
        guard offered.major == cfuse_major else {
            // An older or newer major: say ours, and the kernel gives up.
            var out = fuse_init_out()
            out.major = cfuse_major
            out.minor = cfuse_minor
            replier.reply(request.unique, out)
            return
        }
        var out = fuse_init_out()
        out.major = cfuse_major
        out.minor = min(offered.minor, cfuse_minor)
        out.max_readahead = offered.max_readahead
        let wanted = cfuse_async_read | cfuse_atomic_o_trunc | cfuse_big_writes | cfuse_max_pages | cfuse_parallel_dirops | cfuse_handle_killpriv_v2
            | cfuse_do_readdirplus | cfuse_readdirplus_auto
        out.flags = offered.flags & wanted
        out.max_background = 64
        out.congestion_threshold = 48
        out.max_write = UInt32(MountedFileSystem.maxWrite)
        out.time_gran = 1
        out.max_pages = UInt16(MountedFileSystem.maxWrite / 4096)
        replier.reply(request.unique, out)
    }

    private func batchForget(_ request: FUSERequest) throws(FUSEErrno) {
        let header = try request.argument(fuse_batch_forget_in.self)
        let entries = try request.tail(after: fuse_batch_forget_in.self)
        let size = MemoryLayout<fuse_forget_one>.size
        for index in 0..<min(Int(header.count), entries.count / size) {
            let one = entries.loadUnaligned(fromByteOffset: index * size, as: fuse_forget_one.self)
            nodes.forget(one.nodeid, count: one.nlookup)
        }
    }
}
