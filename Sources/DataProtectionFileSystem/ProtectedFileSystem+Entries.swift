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

/// Names, attributes and directories: each call is one `*at` system call on a node's descriptor
/// with one name, never following a link.
extension ProtectedFileSystem {
    // MARK: - Attributes

    /// The attributes the kernel is given for `node`: the backing item's, with a protected file's
    /// plaintext size.
    func attributes(
        _ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil
    ) -> NodeAttributes {
        let size = node.isRegularFile ? UInt64(max(0, plaintextSize(node, st, named: name))) : UInt64(st.st_size)
        return NodeAttributes(status: st, size: size)
    }

    /// A regular file's plaintext size: its engine's when open, else from its header and length.
    func plaintextSize(_ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> Int64 {
        if let size = node.open.withLock({ $0.engine?.size }) { return size }
        if case .protected(let prefix) = kind(of: node, st, named: name) {
            return prefix.plaintextSize(fileSize: Int64(st.st_size))
        }
        return Int64(st.st_size)
    }

    /// What a regular file is by its first bytes: as ``kinds`` recorded it while its length and
    /// change time stay the same, else read — through its name in its parent
    /// when the caller has them (a lookup: one `openat`), else through `/proc/self/fd`; a name
    /// that now leads to another inode is not read. A file that cannot be read is taken as plain
    /// (it is served read-only then).
    func kind(
        of node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil
    ) -> ProtectedFilePrefix.Kind {
        if let cached = kinds.kind(of: st) { return cached }
        var found: ProtectedFilePrefix.Kind? = st.st_size < 2 ? .plain : nil
        if found == nil, let name { found = readKind(named: name.name, in: name.parent, st) }
        if found == nil {
            let fd = open(node.reopenPath, O_RDONLY | O_CLOEXEC)
            if fd >= 0 {
                found = Self.kind(of: fd, st)
                close(fd)
            }
        }
        // A file that could not be read now (no descriptor left, no right to read it) is asked
        // again next time, not remembered as plain.
        guard let kind = found else { return .plain }
        kinds.record(kind, for: st)
        return kind
    }

    /// What the file `name` in `parent` (that `st` describes) is, read through that name: one
    /// `openat`, never following a link. `nil` when it cannot be opened or the name now leads to
    /// another inode.
    func readKind(named name: [UInt8], in parent: FileNode, _ st: stat) -> ProtectedFilePrefix.Kind? {
        let fd = withName(name) { openat(parent.fd, $0, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC) }
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var opened = stat()
        guard fstat(fd, &opened) == 0, InodeIdentity(opened) == InodeIdentity(st) else { return nil }
        return Self.kind(of: fd, st)
    }

    /// A protected file's prefix, `nil` for anything else.
    func prefix(of node: FileNode, _ st: stat) -> ProtectedFilePrefix? {
        if case .protected(let prefix) = kind(of: node, st) { return prefix }
        return nil
    }

    func entry(_ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> NodeEntry {
        NodeEntry(node: node.id, attributes: attributes(node, st, named: name))
    }

    func lookup(_ name: [UInt8], in parentID: UInt64) throws(Errno) -> NodeEntry {
        let parent = try nodes.node(parentID)
        let (node, st) = try nodes.lookup(name, in: parent)
        return entry(node, st, named: (parent, name))
    }

    func attributes(of nodeID: UInt64) throws(Errno) -> NodeAttributes {
        let node = try nodes.node(nodeID)
        return attributes(node, try node.status())
    }

    /// `access`, `faccessat` and `chdir`: the backing inode's own answer for this server's user
    /// (every caller's, the mount not being shared with other users).
    func checkAccess(_ nodeID: UInt64, mask: Int32) throws(Errno) {
        let node = try nodes.node(nodeID)
        guard faccessat(AT_FDCWD, node.reopenPath, mask & (R_OK | W_OK | X_OK), AT_EACCESS) == 0 else {
            throw Errno(rawValue: errno)
        }
    }

    /// Refuses a reserved name (``reservedNames``): `EPERM`.
    func refuseReserved(_ name: [UInt8]) throws(Errno) {
        if reservedNames.contains(name) { throw Errno(rawValue: EPERM) }
    }

    /// Refuses set-user-ID and set-group-ID bits on anything but a directory (whose set-group-ID
    /// bit only passes its group on), where the mount is asked to (``refusesSetID``).
    func refuseSetID(_ mode: UInt32, _ kind: mode_t) throws(Errno) {
        guard refusesSetID, kind != S_IFDIR, mode & UInt32(S_ISUID | S_ISGID) != 0 else { return }
        throw Errno(rawValue: EPERM)
    }

    /// A time to set, for `utimensat`.
    private static func time(_ time: AttributeChange.Time?) -> timespec {
        switch time {
        case nil: timespec(tv_sec: 0, tv_nsec: UTIME_OMIT)
        case .now?: timespec(tv_sec: 0, tv_nsec: UTIME_NOW)
        case .at(let seconds, let nanoseconds)?: timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds))
        }
    }

    func setAttributes(
        _ change: AttributeChange, of nodeID: UInt64, _ request: RequestContext
    ) throws(Errno) -> NodeAttributes {
        let node = try nodes.node(nodeID)
        guard !node.isReadOnly else { throw Errno(rawValue: EPERM) }
        try requireTerritory(node, change: change)
        if let mode = change.mode {
            guard node.kind != S_IFLNK else { throw Errno(rawValue: EOPNOTSUPP) }
            try refuseSetID(mode, node.kind)
            guard chmod(node.reopenPath, mode) == 0 else { throw Errno(rawValue: errno) }
        }
        if change.owner != nil || change.group != nil {
            let done = fchownat(
                node.fd, "", change.owner ?? UInt32.max, change.group ?? UInt32.max, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW
            )
            guard done == 0 else { throw Errno(rawValue: errno) }
        }
        if let size = change.size {
            guard node.isRegularFile else { throw Errno(rawValue: node.isDirectory ? EISDIR : EINVAL) }
            try truncate(node, to: Int64(bitPattern: size), handle: change.handle, request: request)
        }
        if change.killsSetID, change.mode == nil, node.isRegularFile { clearSetID(node) }
        if change.accessTime != nil || change.modificationTime != nil {
            let times = [Self.time(change.accessTime), Self.time(change.modificationTime)]
            // A link's own times on its O_PATH descriptor (a kernel that refuses it leaves them);
            // anything else's through the descriptor's /proc/self/fd link.
            if node.kind == S_IFLNK {
                guard utimensat(node.fd, "", times, AT_EMPTY_PATH) == 0 || errno == EINVAL else {
                    throw Errno(rawValue: errno)
                }
            } else if node.isRegularFile {
                // Under the file's lock: a close that settles the file (the kernel sends RELEASE
                // after close() returned, so it may come after this) keeps the time set here.
                let done = node.open.withLock { _ in utimensat(AT_FDCWD, node.reopenPath, times, 0) == 0 ? 0 : errno }
                guard done == 0 else { throw Errno(rawValue: done) }
            } else {
                guard utimensat(AT_FDCWD, node.reopenPath, times, 0) == 0 else { throw Errno(rawValue: errno) }
            }
        }
        return attributes(node, try node.status())
    }

    // MARK: - Making and removing names

    func makeDirectory(_ name: [UInt8], in parentID: UInt64, mode: UInt32) throws(Errno) -> NodeEntry {
        let parent = try nodes.node(parentID)
        try requireTerritory(parent, else: EACCES)
        try refuseReserved(name)
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        guard withName(name, { mkdirat(parent.fd, $0, mode & 0o7777) }) == 0 else { throw Errno(rawValue: errno) }
        applyModeIfMasked(mode & 0o7777, name: name, in: parent)
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        return entry(node, st)
    }

    func makeNode(_ name: [UInt8], in parentID: UInt64, mode: UInt32) throws(Errno) -> NodeEntry {
        let parent = try nodes.node(parentID)
        try requireTerritory(parent, else: EACCES)
        try refuseReserved(name)
        try refuseSetID(mode, mode & S_IFMT)
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        switch mode & S_IFMT {
        case S_IFREG:
            // An empty regular file: a protected file of its directory's class, as CREATE makes.
            let (node, st) = try createProtectedFile(
                name, in: parent, mode: mode & 0o7777, exclusive: true, reservation: room
            ).node
            detach(node)   // made, not opened: no handle holds it
            return entry(node, st)
        case S_IFIFO, S_IFSOCK:
            guard withName(name, { mknodat(parent.fd, $0, mode, 0) }) == 0 else { throw Errno(rawValue: errno) }
            applyModeIfMasked(mode & 0o7777, name: name, in: parent)
        default:
            throw Errno(rawValue: EPERM)   // no device files among data
        }
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        return entry(node, st)
    }

    func symbolicLink(_ name: [UInt8], in parentID: UInt64, to target: [UInt8]) throws(Errno) -> NodeEntry {
        let parent = try nodes.node(parentID)
        try requireTerritory(parent, else: EACCES)
        try refuseReserved(name)
        guard !target.isEmpty, target.count < Int(PATH_MAX) else {
            throw Errno(rawValue: target.isEmpty ? ENOENT : ENAMETOOLONG)
        }
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        let made = withName(target) { targetPath in withName(name) { symlinkat(targetPath, parent.fd, $0) } }
        guard made == 0 else { throw Errno(rawValue: errno) }
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        return entry(node, st)
    }

    /// The class of the protected regular file `name` in `directory` (which `st` describes): the
    /// open file's, else its header's; `nil` for a plain one.
    func protectedClass(named name: [UInt8], in directory: FileNode, _ st: stat) -> ProtectionClass? {
        if let node = nodes.existing(InodeIdentity(st)), let cls = node.open.withLock({ $0.protectionClass }) {
            return cls
        }
        if case .protected(let prefix)? = kinds.kind(of: st) ?? readKind(named: name, in: directory, st) {
            return prefix.protectionClass
        }
        return nil
    }

    func readLink(_ nodeID: UInt64) throws(Errno) -> [UInt8] {
        let node = try nodes.node(nodeID)
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let n = readlinkat(node.fd, "", &buffer, buffer.count)
        guard n >= 0 else { throw Errno(rawValue: errno) }
        return Array(buffer[0..<n])
    }

    func remove(_ name: [UInt8], in parentID: UInt64, directory: Bool) throws(Errno) {
        let parent = try nodes.node(parentID)
        try requireTerritory(parent, else: EACCES)
        try refuseReserved(name)
        guard withName(name, { unlinkat(parent.fd, $0, directory ? AT_REMOVEDIR : 0) }) == 0 else {
            throw Errno(rawValue: errno)
        }
    }

    func rename(
        _ old: [UInt8], in parentID: UInt64, to new: [UInt8], in newParentID: UInt64, flags: UInt32
    ) throws(Errno) {
        let parent = try nodes.node(parentID)
        let newParent = try nodes.node(newParentID)
        try requireTerritory(parent, else: EACCES)
        try requireTerritory(newParent, else: EACCES)
        try refuseReserved(old)
        try refuseReserved(new)
        // A WAL index (class C below a class-A floor) keeps a WAL index's name: renamed to any
        // other, it would be a class-C file where the floor promises A. (Only a WAL index's name
        // is looked at: no other rename pays for a look at its file.)
        var moving = stat()
        if newParent.floor != nil, Self.isWALIndexName(old),
            withName(old, { fstatat(parent.fd, $0, &moving, AT_SYMLINK_NOFOLLOW) }) == 0,
            moving.st_mode & S_IFMT == S_IFREG
        {
            try refuseBelowFloor(protectedClass(named: old, in: parent, moving), named: new, in: newParent)
        }
        if flags & RENAME_EXCHANGE != 0, parent.floor != nil, Self.isWALIndexName(new) {
            var other = stat()
            if withName(new, { fstatat(newParent.fd, $0, &other, AT_SYMLINK_NOFOLLOW) }) == 0,
                other.st_mode & S_IFMT == S_IFREG
            {
                try refuseBelowFloor(protectedClass(named: new, in: newParent, other), named: old, in: parent)
            }
        }
        let renamed = withName(old) { from in
            withName(new) { to in
                Result { () throws(Errno) in try SystemCall.renameat2(parent.fd, from, newParent.fd, to, flags: flags) }
            }
        }
        try renamed.get()
        // The moved item's node (if the kernel holds one) now lives under its new parent; with
        // RENAME_EXCHANGE, the other item under the old one.
        for (directory, name) in [(newParent, new)] + (flags & RENAME_EXCHANGE != 0 ? [(parent, old)] : []) {
            var st = stat()
            if withName(name, { fstatat(directory.fd, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0,
                let moved = nodes.existing(InodeIdentity(st))
            {
                nodes.move(moved, to: directory.id, name: name)
            }
        }
    }

    func link(_ nodeID: UInt64, as name: [UInt8], in newParentID: UInt64) throws(Errno) -> NodeEntry {
        let node = try nodes.node(nodeID)
        let newParent = try nodes.node(newParentID)
        try requireTerritory(node)
        try requireTerritory(newParent, else: EACCES)
        try refuseReserved(name)
        guard !node.isDirectory else { throw Errno(rawValue: EPERM) }
        try refuseBelowFloor(try currentClass(of: node), named: name, in: newParent)
        let linked = withName(name) { linkat(AT_FDCWD, node.reopenPath, newParent.fd, $0, AT_SYMLINK_FOLLOW) }
        guard linked == 0 else { throw Errno(rawValue: errno) }
        let (same, st) = try nodes.lookup(name, in: newParent)
        return entry(same, st)
    }

    // MARK: - Directories

    func openDirectory(_ nodeID: UInt64) throws(Errno) -> UInt64 {
        let node = try nodes.node(nodeID)
        guard node.isDirectory else { throw Errno(rawValue: ENOTDIR) }
        // Opened here for the caller's right to read it; each READDIR opens it again (an open
        // directory holds no descriptor: a program holding thousands of them open costs the
        // server none, and leaves the others their descriptors).
        let fd = open(node.reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw Errno(rawValue: errno == EMFILE ? ENFILE : errno) }
        close(fd)
        return handles.add(.directory(DirectoryHandle()))
    }

    /// Entries from the backing directory's offset the kernel asks for (`getdents64`'s own
    /// `d_off` values, which hold across descriptors: each READDIR opens the directory again), as
    /// many as fit in the size it asks for. With `plus` (READDIRPLUS), each
    /// entry but `.` and `..` comes with its node and attributes, as LOOKUP gives them (a lookup
    /// counted for each: an entry is looked up only once it is sure to fit).
    func readDirectory(
        _ nodeID: UInt64, handle: UInt64, from offset: Int64, into listing: inout DirectoryListing
    ) throws(Errno) {
        let directory = try handles.directory(handle)
        let parent = try nodes.node(nodeID)
        let wanted = listing.capacity
        try directory.lock.withLock { _ throws(Errno) in
            let fd = open(parent.reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw Errno(rawValue: errno == EMFILE ? ENFILE : errno) }
            defer { close(fd) }
            guard lseek(fd, off_t(offset), SEEK_SET) >= 0 else { throw Errno(rawValue: errno) }
            var raw = [UInt8](repeating: 0, count: wanted)
            let n = try raw.withUnsafeMutableBytes { buffer in
                Result { () throws(Errno) in try SystemCall.getdents64(fd, buffer) }
            }.get()
            var at = 0
            while at + 19 <= n {
                let inode = raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: UInt64.self) }
                let next = raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at + 8, as: Int64.self) }
                let length = Int(raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at + 16, as: UInt16.self) })
                let type = raw[at + 18]
                guard length > 19, at + length <= n else { break }
                let nameBytes = raw[(at + 19)..<(at + length)]
                let nameLength = nameBytes.firstIndex(of: 0).map { $0 - (at + 19) } ?? nameBytes.count
                let name = Array(raw[(at + 19)..<(at + 19 + nameLength)])
                guard listing.fits(nameLength: nameLength) else { break }
                var found: NodeEntry?
                if listing.plus, name != [0x2E], name != [0x2E, 0x2E],
                    let (node, st) = try? nodes.lookup(name, in: parent, inodeHint: inode)
                {
                    found = entry(node, st, named: (parent, name))
                }
                listing.append(name: name, inode: inode, nextOffset: next, type: type, entry: found)
                at += length
            }
        }
    }

    func releaseDirectory(_ nodeID: UInt64, handle: UInt64) {
        handles.remove(handle)
    }

    func synchronizeDirectory(_ nodeID: UInt64, handle: UInt64, dataOnly: Bool) throws(Errno) {
        _ = try handles.directory(handle)
        let fd = open(try nodes.node(nodeID).reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw Errno(rawValue: errno == EMFILE ? ENFILE : errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw Errno(rawValue: errno) }
    }

    func fileSystemStatus(_ nodeID: UInt64) throws(Errno) -> statvfs {
        var st = statvfs()
        guard fstatvfs(nodes.root.fd, &st) == 0 else { throw Errno(rawValue: errno) }
        return st
    }
}
