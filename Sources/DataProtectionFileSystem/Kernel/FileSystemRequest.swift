import DataProtectionSystem

#if canImport(Glibc)
import Glibc
#endif

/// One request from the kernel, decoded (``init(decoding:maxWrite:)``): what the operation is and
/// its arguments in Swift's types — names as bytes, already checked to be one path component;
/// nothing of the protocol's raw structures is left for ``FileSystemOperations`` to read.
enum FileSystemRequest {
    /// `FUSE_INIT`: the kernel's protocol version and what it offers.
    case initialize(major: UInt32, minor: UInt32, maxReadahead: UInt32, flags: UInt32)
    /// `FUSE_DESTROY`: the mount goes.
    case destroy
    /// `FUSE_FORGET` and `FUSE_BATCH_FORGET` (not answered): the kernel drops `count` lookups of
    /// each node.
    case forget([(node: UInt64, count: UInt64)])
    /// `FUSE_INTERRUPT` (not answered): the program behind request `unique` got a signal.
    case interrupt(unique: UInt64)

    case lookup(name: [UInt8], parent: UInt64)
    case getAttributes(node: UInt64)
    /// `access`, `faccessat`, `chdir`: `mask` of `R_OK`, `W_OK`, `X_OK`.
    case checkAccess(node: UInt64, mask: Int32)
    case setAttributes(node: UInt64, AttributeChange)
    case readLink(node: UInt64)
    case symbolicLink(name: [UInt8], parent: UInt64, target: [UInt8])
    /// `mknod`: `mode` with the file type bits (`S_IFREG`, `S_IFIFO`…), masked by the caller's
    /// umask already.
    case makeNode(name: [UInt8], parent: UInt64, mode: UInt32)
    case makeDirectory(name: [UInt8], parent: UInt64, mode: UInt32)
    case remove(name: [UInt8], parent: UInt64, directory: Bool)
    /// `renameat2`'s flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`); 0 for a plain `rename`.
    case rename(name: [UInt8], parent: UInt64, newName: [UInt8], newParent: UInt64, flags: UInt32)
    case link(node: UInt64, name: [UInt8], newParent: UInt64)

    case open(node: UInt64, OpenOptions)
    /// `open` with `O_CREAT` (and `creat`): `mode` masked by the caller's umask already.
    case create(name: [UInt8], parent: UInt64, mode: UInt32, OpenOptions)
    /// Up to `size` bytes (at most the mount's largest WRITE) from `offset`.
    case read(node: UInt64, handle: UInt64, offset: Int64, size: Int)
    /// `data` points into the request's buffer: valid, and writable (to clear it), until the
    /// request is answered.
    case write(node: UInt64, handle: UInt64, offset: Int64, data: UnsafeRawBufferPointer, killsSetID: Bool)
    /// `close` of a descriptor (one per `dup`): every WRITE is on disk when answered.
    case flush
    case release(node: UInt64, handle: UInt64)
    case synchronize(node: UInt64, handle: UInt64, dataOnly: Bool)
    /// `fallocate`'s `mode` bits as the system call has them (`FALLOC_FL_KEEP_SIZE`…).
    case allocate(node: UInt64, handle: UInt64, offset: Int64, length: Int64, mode: UInt32)
    case fileSystemStatus(node: UInt64)

    case openDirectory(node: UInt64)
    /// READDIR (`plus`: READDIRPLUS, each entry with what LOOKUP gives) from the backing
    /// directory's `offset`, at most `size` bytes of entries.
    case readDirectory(node: UInt64, handle: UInt64, offset: Int64, size: Int, plus: Bool)
    case releaseDirectory(node: UInt64, handle: UInt64)
    case synchronizeDirectory(node: UInt64, handle: UInt64, dataOnly: Bool)

    /// `size` 0: the caller asks how long the value is.
    case getExtendedAttribute(node: UInt64, name: [UInt8], size: Int)
    case setExtendedAttribute(node: UInt64, name: [UInt8], value: [UInt8], flags: Int32)
    /// `size` 0: the caller asks how long the list is.
    case listExtendedAttributes(node: UInt64, size: Int)
    case removeExtendedAttribute(node: UInt64, name: [UInt8])

    /// `ioctl` on a file of the mount.
    case ioctl
    /// An opcode this server does not know.
    case unknown(opcode: UInt32)
}

/// What a SETATTR changes: each field present is to be set.
struct AttributeChange: Equatable {
    /// A time to set: the moment it is set, or seconds (negative before 1970) and nanoseconds.
    enum Time: Equatable {
        case now
        case at(seconds: Int64, nanoseconds: UInt32)
    }

    /// Permission bits and set-ID bits (`0o7777`).
    var mode: UInt32?
    var owner: UInt32?
    var group: UInt32?
    var size: UInt64?
    /// The handle of the open file the change comes through (`ftruncate`, `futimens`).
    var handle: UInt64?
    var accessTime: Time?
    var modificationTime: Time?
    /// The kernel asks the server to clear set-user-ID and set-group-ID bits (a truncation or
    /// `chown` by an unprivileged caller).
    var killsSetID = false

    /// Whether the change only sets the size and touches times to now (what `ftruncate` on a
    /// writable descriptor sends), nothing else.
    var isSizeOrTouchOnly: Bool {
        mode == nil && owner == nil && group == nil
            && (accessTime == nil || accessTime == .now) && (modificationTime == nil || modificationTime == .now)
    }
}

/// How a file is opened: its `open(2)` flags (`O_ACCMODE`, `O_TRUNC`, `O_EXCL`…), and whether
/// the kernel asks for set-ID bits to be cleared (an `O_TRUNC` open by an unprivileged caller).
struct OpenOptions: Equatable {
    var flags: Int32
    var killsSetID = false

    var access: Int32 { flags & O_ACCMODE }
    /// Opened for writing (or read-write).
    var isWritable: Bool { access != O_RDONLY }
    /// Opened for reading (or read-write).
    var isReadable: Bool { access != O_WRONLY }
    var truncates: Bool { flags & O_TRUNC != 0 }
    var isExclusive: Bool { flags & O_EXCL != 0 }
}
