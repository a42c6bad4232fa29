import CFUSEKernel
import DataProtection
import DataProtectionKeybag
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Names, attributes and directories: each call is one `*at` system call on a node's descriptor
/// with one name, never following a link.
extension ProtectedFileSystem {
    /// How long the kernel may trust an entry or attributes it was given, in seconds.
    static let validity: UInt64 = 1

    // MARK: - Attributes

    /// The attributes the kernel is given for `node`: the backing item's, with a protected file's
    /// plaintext size.
    func attributes(_ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> fuse_attr {
        var attr = fuse_attr()
        attr.ino = UInt64(st.st_ino)
        attr.size = UInt64(st.st_size)
        attr.blocks = UInt64(st.st_blocks)
        // Times before 1970 are negative: carried as the protocol's two's complement, never trapped.
        attr.atime = UInt64(bitPattern: Int64(st.st_atim.tv_sec)); attr.atimensec = UInt32(truncatingIfNeeded: st.st_atim.tv_nsec)
        attr.mtime = UInt64(bitPattern: Int64(st.st_mtim.tv_sec)); attr.mtimensec = UInt32(truncatingIfNeeded: st.st_mtim.tv_nsec)
        attr.ctime = UInt64(bitPattern: Int64(st.st_ctim.tv_sec)); attr.ctimensec = UInt32(truncatingIfNeeded: st.st_ctim.tv_nsec)
        attr.mode = st.st_mode
        attr.nlink = UInt32(st.st_nlink)
        attr.uid = st.st_uid
        attr.gid = st.st_gid
        attr.rdev = UInt32(truncatingIfNeeded: st.st_rdev)
        attr.blksize = 4096
        if node.isRegularFile { attr.size = UInt64(max(0, plaintextSize(node, st, named: name))) }
        return attr
    }

    /// A regular file's plaintext size: its engine's when open, else from its header and length.
    func plaintextSize(_ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> Int64 {
        if let size = node.open.withLock({ $0.engine?.size }) { return size }
        if case .protected(let prefix) = kind(of: node, st, named: name) { return prefix.plaintextSize(fileSize: Int64(st.st_size)) }
        return Int64(st.st_size)
    }

    /// What a regular file is by its first bytes: as ``kinds`` recorded it while its length and
    /// change time stay the same, else read — through its name in its parent
    /// when the caller has them (a lookup: one `openat`), else through `/proc/self/fd`; a name
    /// that now leads to another inode is not read. A file that cannot be read is taken as plain
    /// (it is served read-only then).
    func kind(of node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> ProtectedFilePrefix.Kind {
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

    func entry(_ node: FileNode, _ st: stat, named name: (parent: FileNode, name: [UInt8])? = nil) -> fuse_entry_out {
        var entry = fuse_entry_out()
        entry.nodeid = node.id
        entry.generation = 0
        entry.entry_valid = Self.validity
        entry.attr_valid = Self.validity
        entry.attr = attributes(node, st, named: name)
        return entry
    }

    func lookup(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        let (name, _) = try FUSERequest.name(in: request.body)
        let (node, st) = try nodes.lookup(name, in: parent)
        replier.reply(request.unique, entry(node, st, named: (parent, name)))
    }

    func getAttributes(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        try replyAttributes(try nodes.node(request.nodeID), request, replier)
    }

    /// `access`, `faccessat` and `chdir`: the backing inode's own answer for this server's user
    /// (every caller's, the mount not being shared with other users).
    func checkAccess(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        let argument = try request.argument(fuse_access_in.self)
        let mask = Int32(argument.mask) & (R_OK | W_OK | X_OK)
        guard faccessat(AT_FDCWD, node.reopenPath, mask, AT_EACCESS) == 0 else { throw FUSEErrno(errno) }
        replier.reply(request.unique)
    }

    private func replyAttributes(_ node: FileNode, _ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        var out = fuse_attr_out()
        out.attr_valid = Self.validity
        out.attr = attributes(node, try node.status())
        replier.reply(request.unique, out)
    }

    /// Refuses a reserved name (``reservedNames``): `EPERM`.
    func refuseReserved(_ name: [UInt8]) throws(FUSEErrno) {
        if reservedNames.contains(name) { throw FUSEErrno(EPERM) }
    }

    /// Refuses set-user-ID and set-group-ID bits on anything but a directory (whose set-group-ID
    /// bit only passes its group on), where the mount is asked to (``refusesSetID``).
    func refuseSetID(_ mode: UInt32, _ kind: mode_t) throws(FUSEErrno) {
        guard refusesSetID, kind != S_IFDIR, mode & UInt32(S_ISUID | S_ISGID) != 0 else { return }
        throw FUSEErrno(EPERM)
    }

    /// A time SETATTR gives: now, or seconds (negative before 1970) and nanoseconds.
    private static func time(_ seconds: UInt64, _ nanoseconds: UInt32, now: Bool) -> timespec {
        now ? timespec(tv_sec: 0, tv_nsec: cfuse_utime_now) : timespec(tv_sec: Int(Int64(bitPattern: seconds)), tv_nsec: Int(nanoseconds % 1_000_000_000))
    }

    func setAttributes(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        guard !node.isReadOnly else { throw FUSEErrno(EPERM) }
        let change = try request.argument(fuse_setattr_in.self)
        try requireTerritory(node, change: change)
        let valid = change.valid
        if valid & cfuse_fattr_mode != 0 {
            guard node.kind != S_IFLNK else { throw FUSEErrno(EOPNOTSUPP) }
            try refuseSetID(change.mode, node.kind)
            guard chmod(node.reopenPath, change.mode & 0o7777) == 0 else { throw FUSEErrno(errno) }
        }
        if valid & (cfuse_fattr_uid | cfuse_fattr_gid) != 0 {
            let uid = valid & cfuse_fattr_uid != 0 ? change.uid : UInt32.max
            let gid = valid & cfuse_fattr_gid != 0 ? change.gid : UInt32.max
            guard fchownat(node.fd, "", uid, gid, cfuse_at_empty_path | AT_SYMLINK_NOFOLLOW) == 0 else { throw FUSEErrno(errno) }
        }
        if valid & cfuse_fattr_size != 0 {
            guard node.isRegularFile else { throw FUSEErrno(node.isDirectory ? EISDIR : EINVAL) }
            let handle = valid & cfuse_fattr_fh != 0 ? change.fh : nil
            try truncate(node, to: Int64(change.size), handle: handle, request: request.unique)
        }
        if valid & cfuse_fattr_kill_suidgid != 0, valid & cfuse_fattr_mode == 0, node.isRegularFile { clearSetID(node) }
        if valid & (cfuse_fattr_atime | cfuse_fattr_mtime) != 0 {
            let omit = timespec(tv_sec: 0, tv_nsec: cfuse_utime_omit)
            let times = [
                valid & cfuse_fattr_atime != 0 ? Self.time(change.atime, change.atimensec, now: valid & cfuse_fattr_atime_now != 0) : omit,
                valid & cfuse_fattr_mtime != 0 ? Self.time(change.mtime, change.mtimensec, now: valid & cfuse_fattr_mtime_now != 0) : omit,
            ]
            // A link's own times on its O_PATH descriptor (a kernel that refuses it leaves them);
            // anything else's through the descriptor's /proc/self/fd link.
            if node.kind == S_IFLNK {
                guard utimensat(node.fd, "", times, cfuse_at_empty_path) == 0 || errno == EINVAL else { throw FUSEErrno(errno) }
            } else if node.isRegularFile {
                // Under the file's lock: a close that settles the file (the kernel sends RELEASE
                // after close() returned, so it may come after this) keeps the time set here.
                let done = node.open.withLock { _ in utimensat(AT_FDCWD, node.reopenPath, times, 0) == 0 ? 0 : errno }
                guard done == 0 else { throw FUSEErrno(done) }
            } else {
                guard utimensat(AT_FDCWD, node.reopenPath, times, 0) == 0 else { throw FUSEErrno(errno) }
            }
        }
        try replyAttributes(node, request, replier)
    }

    // MARK: - Making and removing names

    func makeDirectory(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        try requireTerritory(parent, else: EACCES)
        let argument = try request.argument(fuse_mkdir_in.self)
        let (name, _) = try FUSERequest.name(in: try request.tail(after: fuse_mkdir_in.self))
        try refuseReserved(name)
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        guard withName(name, { mkdirat(parent.fd, $0, argument.mode & 0o7777) }) == 0 else { throw FUSEErrno(errno) }
        applyModeIfMasked(argument.mode & 0o7777, name: name, in: parent)
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        replier.reply(request.unique, entry(node, st))
    }

    func makeNode(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        try requireTerritory(parent, else: EACCES)
        let argument = try request.argument(fuse_mknod_in.self)
        let (name, _) = try FUSERequest.name(in: try request.tail(after: fuse_mknod_in.self))
        try refuseReserved(name)
        try refuseSetID(argument.mode, argument.mode & S_IFMT)
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        switch argument.mode & S_IFMT {
        case S_IFREG:
            // An empty regular file: a protected file of its directory's class, as CREATE makes.
            let (node, st) = try createProtectedFile(name, in: parent, mode: argument.mode & 0o7777, exclusive: true, reservation: room).node
            detach(node)   // made, not opened: no handle holds it
            replier.reply(request.unique, entry(node, st))
            return
        case S_IFIFO, S_IFSOCK:
            guard withName(name, { mknodat(parent.fd, $0, argument.mode, 0) }) == 0 else { throw FUSEErrno(errno) }
            applyModeIfMasked(argument.mode & 0o7777, name: name, in: parent)
        default:
            throw FUSEErrno(EPERM)   // no device files among data
        }
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        replier.reply(request.unique, entry(node, st))
    }

    func symbolicLink(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        try requireTerritory(parent, else: EACCES)
        let (name, rest) = try FUSERequest.name(in: request.body)
        try refuseReserved(name)
        guard let end = rest.firstIndex(of: 0) else { throw FUSEErrno(EINVAL) }
        let target = Array(rest[rest.startIndex..<end])
        guard !target.isEmpty, target.count < Int(PATH_MAX) else { throw FUSEErrno(target.isEmpty ? ENOENT : ENAMETOOLONG) }
        let room = try nodes.reserve()
        defer { nodes.release(room) }
        let made = withName(target) { targetPath in withName(name) { symlinkat(targetPath, parent.fd, $0) } }
        guard made == 0 else { throw FUSEErrno(errno) }
        let (node, st) = try nodes.lookup(name, in: parent, reservation: room)
        replier.reply(request.unique, entry(node, st))
    }

    /// The class of the protected regular file `name` in `directory` (which `st` describes): the
    /// open file's, else its header's; `nil` for a plain one.
    func protectedClass(named name: [UInt8], in directory: FileNode, _ st: stat) -> ProtectionClass? {
        if let node = nodes.existing(InodeIdentity(st)), let cls = node.open.withLock({ $0.protectionClass }) { return cls }
        if case .protected(let prefix)? = kinds.kind(of: st) ?? readKind(named: name, in: directory, st) { return prefix.protectionClass }
        return nil
    }

    func readLink(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX))
        let n = readlinkat(node.fd, "", &buffer, buffer.count)
        guard n >= 0 else { throw FUSEErrno(errno) }
        buffer.withUnsafeBytes { replier.reply(request.unique, [UnsafeRawBufferPointer(rebasing: $0[0..<n])]) }
    }

    func remove(_ request: FUSERequest, _ replier: FUSEReplier, directory: Bool) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        try requireTerritory(parent, else: EACCES)
        let (name, _) = try FUSERequest.name(in: request.body)
        try refuseReserved(name)
        guard withName(name, { unlinkat(parent.fd, $0, directory ? AT_REMOVEDIR : 0) }) == 0 else { throw FUSEErrno(errno) }
        replier.reply(request.unique)
    }

    func rename(_ request: FUSERequest, _ replier: FUSEReplier, extended: Bool) throws(FUSEErrno) {
        let parent = try nodes.node(request.nodeID)
        let newParentID: UInt64, flags: UInt32, names: UnsafeRawBufferPointer
        if extended {
            let argument = try request.argument(fuse_rename2_in.self)
            (newParentID, flags, names) = (argument.newdir, argument.flags, try request.tail(after: fuse_rename2_in.self))
        } else {
            let argument = try request.argument(fuse_rename_in.self)
            (newParentID, flags, names) = (argument.newdir, 0, try request.tail(after: fuse_rename_in.self))
        }
        let newParent = try nodes.node(newParentID)
        try requireTerritory(parent, else: EACCES)
        try requireTerritory(newParent, else: EACCES)
        let (old, rest) = try FUSERequest.name(in: names)
        let (new, _) = try FUSERequest.name(in: rest)
        try refuseReserved(old)
        try refuseReserved(new)
        // A WAL index (class C below a class-A floor) keeps a WAL index's name: renamed to any
        // other, it would be a class-C file where the floor promises A. (Only a WAL index's name
        // is looked at: no other rename pays for a look at its file.)
        var moving = stat()
        if newParent.floor != nil, Self.isWALIndexName(old), withName(old, { fstatat(parent.fd, $0, &moving, AT_SYMLINK_NOFOLLOW) }) == 0,
           moving.st_mode & S_IFMT == S_IFREG {
            try refuseBelowFloor(protectedClass(named: old, in: parent, moving), named: new, in: newParent)
        }
        if flags & cfuse_rename_exchange != 0, parent.floor != nil, Self.isWALIndexName(new) {
            var other = stat()
            if withName(new, { fstatat(newParent.fd, $0, &other, AT_SYMLINK_NOFOLLOW) }) == 0, other.st_mode & S_IFMT == S_IFREG {
                try refuseBelowFloor(protectedClass(named: new, in: newParent, other), named: old, in: parent)
            }
        }
        let renamed = withName(old) { from in withName(new) { to in cfuse_renameat2(parent.fd, from, newParent.fd, to, flags) } }
        guard renamed == 0 else { throw FUSEErrno(errno) }
        // The moved item's node (if the kernel holds one) now lives under its new parent; with
        // RENAME_EXCHANGE, the other item under the old one.
        for (directory, name) in [(newParent, new)] + (flags & cfuse_rename_exchange != 0 ? [(parent, old)] : []) {
            var st = stat()
            if withName(name, { fstatat(directory.fd, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0, let moved = nodes.existing(InodeIdentity(st)) {
                nodes.move(moved, to: directory.id, name: name)
            }
        }
        replier.reply(request.unique)
    }

    func link(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let argument = try request.argument(fuse_link_in.self)
        let node = try nodes.node(argument.oldnodeid)
        let newParent = try nodes.node(request.nodeID)
        try requireTerritory(node)
        try requireTerritory(newParent, else: EACCES)
        let (name, _) = try FUSERequest.name(in: try request.tail(after: fuse_link_in.self))
        try refuseReserved(name)
        guard !node.isDirectory else { throw FUSEErrno(EPERM) }
        try refuseBelowFloor(try currentClass(of: node), named: name, in: newParent)
        let linked = withName(name) { linkat(AT_FDCWD, node.reopenPath, newParent.fd, $0, AT_SYMLINK_FOLLOW) }
        guard linked == 0 else { throw FUSEErrno(errno) }
        let (same, st) = try nodes.lookup(name, in: newParent)
        replier.reply(request.unique, entry(same, st))
    }

    // MARK: - Directories

    func openDirectory(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        guard node.isDirectory else { throw FUSEErrno(ENOTDIR) }
        // Opened here for the caller's right to read it; each READDIR opens it again (an open
        // directory holds no descriptor: a program holding thousands of them open costs the
        // server none, and leaves the others their descriptors).
        let fd = open(node.reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw FUSEErrno(errno == EMFILE ? ENFILE : errno) }
        close(fd)
        var out = fuse_open_out()
        out.fh = handles.add(.directory(DirectoryHandle()))
        replier.reply(request.unique, out)
    }

    /// Entries from the backing directory's offset the kernel asks for (`getdents64`'s own
    /// `d_off` values, which hold across descriptors: each READDIR opens the directory again), as
    /// many as fit in the size it asks for. With `plus` (READDIRPLUS), each
    /// entry but `.` and `..` comes with its node and attributes, as LOOKUP gives them (a lookup
    /// counted for each: an entry is looked up only once it is sure to fit).
    func readDirectory(_ request: FUSERequest, _ replier: FUSEReplier, plus: Bool) throws(FUSEErrno) {
        let argument = try request.argument(fuse_read_in.self)
        let directory = try handles.directory(argument.fh)
        let parent = try nodes.node(request.nodeID)
        let wanted = min(Int(argument.size), 128 * 1024)
        let header = plus ? MemoryLayout<fuse_entry_out>.size + 24 : 24
        var out = [UInt8]()
        out.reserveCapacity(wanted)
        try directory.lock.withLock { _ throws(FUSEErrno) in
            let fd = open(parent.reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { throw FUSEErrno(errno == EMFILE ? ENFILE : errno) }
            defer { close(fd) }
            guard lseek(fd, off_t(Int64(bitPattern: argument.offset)), SEEK_SET) >= 0 else { throw FUSEErrno(errno) }
            var raw = [UInt8](repeating: 0, count: wanted)
            let n = raw.withUnsafeMutableBytes { cfuse_getdents64(fd, $0.baseAddress, UInt(wanted)) }
            guard n >= 0 else { throw FUSEErrno(errno) }
            var at = 0
            while at + 19 <= n {
                let inode = raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: UInt64.self) }
                let offset = raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at + 8, as: Int64.self) }
                let length = Int(raw.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at + 16, as: UInt16.self) })
                let type = raw[at + 18]
                guard length > 19, at + length <= n else { break }
                let nameBytes = raw[(at + 19)..<(at + length)]
                let nameLength = nameBytes.firstIndex(of: 0).map { $0 - (at + 19) } ?? nameBytes.count
                let name = Array(raw[(at + 19)..<(at + 19 + nameLength)])
                let record = (header + nameLength + 7) & ~7
                if out.count + record > wanted { break }
                if plus {
                    var entry = fuse_entry_out()
                    if name != [0x2E], name != [0x2E, 0x2E], let (node, st) = try? nodes.lookup(name, in: parent, inodeHint: inode) {
                        entry = self.entry(node, st, named: (parent, name))
                    }
                    withUnsafeBytes(of: &entry) { out += $0 }
                }
                var dirent = fuse_dirent()
                dirent.ino = inode
                dirent.off = UInt64(bitPattern: offset)
                dirent.namelen = UInt32(nameLength)
                dirent.type = UInt32(type)
                withUnsafeBytes(of: &dirent) { out += $0.prefix(24) }
                out += name
                out += [UInt8](repeating: 0, count: record - header - nameLength)
                at += length
            }
        }
        out.withUnsafeBytes { replier.reply(request.unique, [$0]) }
    }

    func releaseDirectory(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let argument = try request.argument(fuse_release_in.self)
        handles.remove(argument.fh)
        replier.reply(request.unique)
    }

    func synchronizeDirectory(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let argument = try request.argument(fuse_fsync_in.self)
        _ = try handles.directory(argument.fh)
        let fd = open(try nodes.node(request.nodeID).reopenPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw FUSEErrno(errno == EMFILE ? ENFILE : errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw FUSEErrno(errno) }
        replier.reply(request.unique)
    }

    func fileSystemStatus(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        var st = statvfs()
        guard fstatvfs(nodes.root.fd, &st) == 0 else { throw FUSEErrno(errno) }
        var out = fuse_statfs_out()
        out.st.blocks = UInt64(st.f_blocks)
        out.st.bfree = UInt64(st.f_bfree)
        out.st.bavail = UInt64(st.f_bavail)
        out.st.files = UInt64(st.f_files)
        out.st.ffree = UInt64(st.f_ffree)
        out.st.bsize = UInt32(st.f_bsize)
        out.st.namelen = UInt32(st.f_namemax)
        out.st.frsize = UInt32(st.f_frsize)
        replier.reply(request.unique, out)
    }
}
