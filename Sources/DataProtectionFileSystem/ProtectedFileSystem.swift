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
    /// Whether callers may lack this server's capabilities
    /// (``init(directory:files:floorOfDirectory:refusesSetID:reservedNames:sharesNodesAmongApps:servesWithoutPrivileges:readOnlyPrefixes:maxNodes:)``).
    let servesWithoutPrivileges: Bool
    /// Names no program may make, remove, rename or link through the mount (`EPERM`), anywhere:
    /// what the server reads its floors from (a container's metadata).
    let reservedNames: Set<[UInt8]>
    /// The sandboxed apps served, when the mount is shared among apps: what each may change
    /// outside its own containers (nothing but through a descriptor it was handed), and whose
    /// share of the inodes its nodes count in.
    public let apps = ServedApps()
    let logger = Logger(label: "dataprotection.filesystem")

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
    public init(
        directory: String, files: ProtectedFileManager,
        floorOfDirectory: (@Sendable (Int32) -> ProtectionClass?)? = nil,
        refusesSetID: Bool = false, reservedNames: Set<String> = [], sharesNodesAmongApps: Bool = false,
        servesWithoutPrivileges: Bool = false, readOnlyPrefixes: Set<String> = [], maxNodes: Int? = nil
    ) throws {
        let absolute = URL(fileURLWithPath: directory).standardizedFileURL.path
        let fd = open(absolute, O_PATH | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else {
            throw MountError.badMountPoint(absolute, "cannot be served: \(String(cString: strerror(errno)))")
        }
        self.directory = absolute
        self.files = files
        self.nodes = try NodeTable(
            rootDescriptor: fd, floorOfDirectory: floorOfDirectory, maxNodes: maxNodes,
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
    /// - Throws: ``MountError/unavailable(_:)`` without `/dev/fuse` or `fusermount3`.
    public func mount(at mountPoint: String) throws -> MountedFileSystem {
        let absolute = URL(fileURLWithPath: mountPoint).standardizedFileURL.path
        if absolute == directory || absolute.hasPrefix(directory + "/") {
            throw MountError.badMountPoint(absolute, "is inside the directory it would serve")
        }
        let device = try FUSEDevice.mount(
            at: absolute, kernelChecksPermissions: servesWithoutPrivileges && geteuid() == 0)
        return MountedFileSystem(fileSystem: self, device: device)
    }
}

extension ProtectedFileSystem: FileSystemOperations {
    func forget(_ node: UInt64, count: UInt64) { nodes.forget(node, count: count) }
}
