import CFUSEKernel
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

extension FileSystemRequest {
    /// Decodes `raw` by its opcode (`<linux/fuse.h>`, protocol 7.x): every structure read only
    /// as far as the body goes, every name checked (``KernelRequest/name(in:)``).
    ///
    /// - Throws: `EINVAL` for a body too short for its operation, a name without its NUL or that
    ///   is not one path component, a WRITE carrying fewer bytes than it says or more than
    ///   `maxWrite`; `ENAMETOOLONG` for a name longer than `NAME_MAX`; `ERANGE` for an extended
    ///   attribute's name longer than `XATTR_NAME_MAX`.
    init(decoding raw: KernelRequest, maxWrite: Int) throws(Errno) {
        let node = raw.nodeID
        switch fuse_opcode(rawValue: raw.opcode) {
        case FUSE_INIT:
            let offered = try raw.argument(fuse_init_in.self)
            self = .initialize(
                major: offered.major, minor: offered.minor, maxReadahead: offered.max_readahead, flags: offered.flags)
        case FUSE_DESTROY: self = .destroy
        case FUSE_FORGET: self = .forget([(node, try raw.argument(fuse_forget_in.self).nlookup)])
        case FUSE_BATCH_FORGET: self = .forget(try Self.forgotten(raw))
        case FUSE_INTERRUPT: self = .interrupt(unique: try raw.argument(fuse_interrupt_in.self).unique)

        case FUSE_LOOKUP: self = .lookup(name: try KernelRequest.name(in: raw.body).name, parent: node)
        case FUSE_GETATTR: self = .getAttributes(node: node)
        case FUSE_ACCESS:
            self = .checkAccess(node: node, mask: Int32(bitPattern: try raw.argument(fuse_access_in.self).mask))
        case FUSE_SETATTR: self = .setAttributes(node: node, AttributeChange(try raw.argument(fuse_setattr_in.self)))
        case FUSE_READLINK: self = .readLink(node: node)
        case FUSE_SYMLINK:
            let (name, rest) = try KernelRequest.name(in: raw.body)
            self = .symbolicLink(name: name, parent: node, target: try KernelRequest.terminated(in: rest).0)
        case FUSE_MKNOD:
            let argument = try raw.argument(fuse_mknod_in.self)
            self = .makeNode(
                name: try KernelRequest.name(in: try raw.tail(after: fuse_mknod_in.self)).name, parent: node,
                mode: argument.mode)
        case FUSE_MKDIR:
            let argument = try raw.argument(fuse_mkdir_in.self)
            let name = try KernelRequest.name(in: try raw.tail(after: fuse_mkdir_in.self)).name
            self = .makeDirectory(name: name, parent: node, mode: argument.mode)
        case FUSE_UNLINK:
            self = .remove(name: try KernelRequest.name(in: raw.body).name, parent: node, directory: false)
        case FUSE_RMDIR: self = .remove(name: try KernelRequest.name(in: raw.body).name, parent: node, directory: true)
        case FUSE_RENAME:
            let argument = try raw.argument(fuse_rename_in.self)
            self = try Self.rename(
                raw, names: try raw.tail(after: fuse_rename_in.self), newParent: argument.newdir, flags: 0)
        case FUSE_RENAME2:
            let argument = try raw.argument(fuse_rename2_in.self)
            self = try Self.rename(
                raw, names: try raw.tail(after: fuse_rename2_in.self), newParent: argument.newdir, flags: argument.flags
            )
        case FUSE_LINK:
            let argument = try raw.argument(fuse_link_in.self)
            let name = try KernelRequest.name(in: try raw.tail(after: fuse_link_in.self)).name
            self = .link(node: argument.oldnodeid, name: name, newParent: node)

        case FUSE_OPEN:
            let argument = try raw.argument(fuse_open_in.self)
            let killsSetID = argument.open_flags & cfuse_open_kill_suidgid != 0
            self = .open(node: node, OpenOptions(flags: Int32(bitPattern: argument.flags), killsSetID: killsSetID))
        case FUSE_CREATE:
            let argument = try raw.argument(fuse_create_in.self)
            let name = try KernelRequest.name(in: try raw.tail(after: fuse_create_in.self)).name
            self = .create(
                name: name, parent: node, mode: argument.mode, OpenOptions(flags: Int32(bitPattern: argument.flags)))
        case FUSE_READ:
            let argument = try raw.argument(fuse_read_in.self)
            let size = min(Int(argument.size), maxWrite)
            self = .read(node: node, handle: argument.fh, offset: Int64(bitPattern: argument.offset), size: size)
        case FUSE_WRITE:
            let argument = try raw.argument(fuse_write_in.self)
            let data = try raw.tail(after: fuse_write_in.self)
            let size = Int(argument.size)
            guard size <= data.count, size <= maxWrite else { throw Errno(rawValue: EINVAL) }
            self = .write(
                node: node, handle: argument.fh, offset: Int64(bitPattern: argument.offset),
                data: UnsafeRawBufferPointer(rebasing: data[0..<size]),
                killsSetID: argument.write_flags & cfuse_write_kill_suidgid != 0)
        case FUSE_FLUSH: self = .flush
        case FUSE_RELEASE: self = .release(node: node, handle: try raw.argument(fuse_release_in.self).fh)
        case FUSE_FSYNC:
            let argument = try raw.argument(fuse_fsync_in.self)
            self = .synchronize(node: node, handle: argument.fh, dataOnly: argument.fsync_flags & 1 != 0)
        case FUSE_FALLOCATE:
            let argument = try raw.argument(fuse_fallocate_in.self)
            self = .allocate(
                node: node, handle: argument.fh, offset: Int64(bitPattern: argument.offset),
                length: Int64(bitPattern: argument.length), mode: argument.mode)
        case FUSE_STATFS: self = .fileSystemStatus(node: node)

        case FUSE_OPENDIR: self = .openDirectory(node: node)
        case FUSE_READDIR, FUSE_READDIRPLUS:
            let argument = try raw.argument(fuse_read_in.self)
            self = .readDirectory(
                node: node, handle: argument.fh, offset: Int64(bitPattern: argument.offset), size: Int(argument.size),
                plus: raw.opcode == FUSE_READDIRPLUS.rawValue)
        case FUSE_RELEASEDIR: self = .releaseDirectory(node: node, handle: try raw.argument(fuse_release_in.self).fh)
        case FUSE_FSYNCDIR:
            let argument = try raw.argument(fuse_fsync_in.self)
            self = .synchronizeDirectory(node: node, handle: argument.fh, dataOnly: argument.fsync_flags & 1 != 0)

        case FUSE_GETXATTR:
            let argument = try raw.argument(fuse_getxattr_in.self)
            let name = try KernelRequest.attributeName(in: try raw.tail(after: fuse_getxattr_in.self)).name
            self = .getExtendedAttribute(node: node, name: name, size: Int(argument.size))
        case FUSE_SETXATTR:
            // The structure without `FUSE_SETXATTR_EXT` (which this server does not ask for):
            // the value's size and the flags, 8 bytes.
            guard raw.body.count >= Self.setAttributeHeader else { throw Errno(rawValue: EINVAL) }
            let size = Int(raw.body.loadUnaligned(as: UInt32.self))
            let flags = raw.body.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
            let (name, rest) = try KernelRequest.attributeName(in: try raw.tail(after: Self.setAttributeHeader))
            guard rest.count >= size else { throw Errno(rawValue: EINVAL) }
            let value = Array(rest[rest.startIndex..<(rest.startIndex + size)])
            self = .setExtendedAttribute(node: node, name: name, value: value, flags: Int32(bitPattern: flags))
        case FUSE_LISTXATTR:
            self = .listExtendedAttributes(node: node, size: Int(try raw.argument(fuse_getxattr_in.self).size))
        case FUSE_REMOVEXATTR:
            self = .removeExtendedAttribute(node: node, name: try KernelRequest.attributeName(in: raw.body).name)

        case FUSE_IOCTL: self = .ioctl
        default: self = .unknown(opcode: raw.opcode)
        }
    }

    /// SETXATTR's structure without `FUSE_SETXATTR_EXT`.
    static let setAttributeHeader = 8

    /// BATCH_FORGET's entries: as many as its count says and its body holds.
    private static func forgotten(_ raw: KernelRequest) throws(Errno) -> [(node: UInt64, count: UInt64)] {
        let header = try raw.argument(fuse_batch_forget_in.self)
        let entries = try raw.tail(after: fuse_batch_forget_in.self)
        let size = MemoryLayout<fuse_forget_one>.size
        return (0..<min(Int(header.count), entries.count / size)).map { index in
            let one = entries.loadUnaligned(fromByteOffset: index * size, as: fuse_forget_one.self)
            return (one.nodeid, one.nlookup)
        }
    }

    private static func rename(
        _ raw: KernelRequest, names: UnsafeRawBufferPointer, newParent: UInt64, flags: UInt32
    ) throws(Errno) -> Self {
        let (old, rest) = try KernelRequest.name(in: names)
        let (new, _) = try KernelRequest.name(in: rest)
        return .rename(name: old, parent: raw.nodeID, newName: new, newParent: newParent, flags: flags)
    }
}

extension AttributeChange {
    /// SETATTR's structure: a field for each bit set in `valid`.
    init(_ raw: fuse_setattr_in) {
        let valid = raw.valid
        func has(_ bit: UInt32) -> Bool { valid & bit != 0 }
        func time(_ seconds: UInt64, _ nanoseconds: UInt32, now: Bool) -> Time {
            now ? .now : .at(seconds: Int64(bitPattern: seconds), nanoseconds: nanoseconds % 1_000_000_000)
        }
        mode = has(cfuse_fattr_mode) ? raw.mode & 0o7777 : nil
        owner = has(cfuse_fattr_uid) ? raw.uid : nil
        group = has(cfuse_fattr_gid) ? raw.gid : nil
        size = has(cfuse_fattr_size) ? raw.size : nil
        handle = has(cfuse_fattr_fh) ? raw.fh : nil
        accessTime = has(cfuse_fattr_atime) ? time(raw.atime, raw.atimensec, now: has(cfuse_fattr_atime_now)) : nil
        modificationTime =
            has(cfuse_fattr_mtime) ? time(raw.mtime, raw.mtimensec, now: has(cfuse_fattr_mtime_now)) : nil
        killsSetID = has(cfuse_fattr_kill_suidgid)
    }
}
