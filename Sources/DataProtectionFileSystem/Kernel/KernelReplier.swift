import CFUSEKernel
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Replies and notifications, written to the device with one `writev` each (the kernel takes a
/// message whole or not at all).
struct KernelReplier: Sendable {
    let fd: Int32

    /// A reply: the header, then `parts`.
    func reply(_ unique: UInt64, error: Int32 = 0, _ parts: [UnsafeRawBufferPointer] = []) {
        var header = fuse_out_header()
        header.unique = unique
        header.error = error == 0 ? 0 : -error
        header.len = UInt32(MemoryLayout<fuse_out_header>.size + (error == 0 ? parts.reduce(0) { $0 + $1.count } : 0))
        withUnsafeBytes(of: &header) { head in
            var vectors = [iovec(iov_base: UnsafeMutableRawPointer(mutating: head.baseAddress), iov_len: head.count)]
            if error == 0 {
                for part in parts where part.count > 0 {
                    vectors.append(
                        iovec(iov_base: UnsafeMutableRawPointer(mutating: part.baseAddress), iov_len: part.count))
                }
            }
            // ENOENT: the request was interrupted and is gone; nothing else to do.
            _ = writev(fd, vectors, Int32(vectors.count))
        }
    }

    /// A reply carrying one structure.
    func reply<T>(_ unique: UInt64, _ value: T) {
        var copy = value
        withUnsafeBytes(of: &copy) { reply(unique, [$0]) }
    }

    /// A reply carrying two structures (CREATE: the entry, then the open file).
    func reply<T, U>(_ unique: UInt64, _ first: T, _ second: U) {
        var a = first, b = second
        withUnsafeBytes(of: &a) { x in withUnsafeBytes(of: &b) { y in reply(unique, [x, y]) } }
    }

    /// `FUSE_NOTIFY_INVAL_ENTRY`: the kernel forgets the name `name` in directory `parent` (and
    /// then, once nothing uses it, the inode: a FORGET follows). Returns 0 or an errno.
    @discardableResult
    func invalidate(entry name: [UInt8], in parent: UInt64) -> Int32 {
        var header = fuse_out_header()
        var body = fuse_notify_inval_entry_out()
        body.parent = parent
        body.namelen = UInt32(name.count)
        header.unique = 0
        header.error = Int32(FUSE_NOTIFY_INVAL_ENTRY.rawValue)
        let terminated = name + [0]
        header.len = UInt32(
            MemoryLayout<fuse_out_header>.size + MemoryLayout<fuse_notify_inval_entry_out>.size + terminated.count)
        return withUnsafeBytes(of: &header) { head in
            withUnsafeBytes(of: &body) { payload in
                terminated.withUnsafeBytes { text in
                    let vectors = [
                        iovec(iov_base: UnsafeMutableRawPointer(mutating: head.baseAddress), iov_len: head.count),
                        iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress), iov_len: payload.count),
                        iovec(iov_base: UnsafeMutableRawPointer(mutating: text.baseAddress), iov_len: text.count),
                    ]
                    return writev(fd, vectors, 3) < 0 ? errno : 0
                }
            }
        }
    }

    /// A notification (`unique` 0, `error` the notification's code): `FUSE_NOTIFY_INVAL_INODE`
    /// drops an inode's cached pages and unmaps them from every mapping. Returns the errno.
    @discardableResult
    func invalidate(node: UInt64) -> Int32 {
        var header = fuse_out_header()
        var body = fuse_notify_inval_inode_out(ino: node, off: 0, len: 0)
        header.unique = 0
        header.error = Int32(FUSE_NOTIFY_INVAL_INODE.rawValue)
        header.len = UInt32(MemoryLayout<fuse_out_header>.size + MemoryLayout<fuse_notify_inval_inode_out>.size)
        return withUnsafeBytes(of: &header) { head in
            withUnsafeBytes(of: &body) { payload in
                let vectors = [
                    iovec(iov_base: UnsafeMutableRawPointer(mutating: head.baseAddress), iov_len: head.count),
                    iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress), iov_len: payload.count),
                ]
                return writev(fd, vectors, 2) < 0 ? errno : 0
            }
        }
    }

    // MARK: - Encoding

    /// How long the kernel may trust an entry or attributes it was given, in seconds.
    static let validity: UInt64 = 1

    /// An entry as LOOKUP, MKDIR, CREATE… answer it.
    static func encode(_ entry: NodeEntry) -> fuse_entry_out {
        var out = fuse_entry_out()
        out.nodeid = entry.node
        out.generation = 0
        out.entry_valid = validity
        out.attr_valid = validity
        out.attr = encode(entry.attributes)
        return out
    }

    /// Attributes as GETATTR and SETATTR answer them.
    static func encode(_ attributes: NodeAttributes) -> fuse_attr_out {
        var out = fuse_attr_out()
        out.attr_valid = validity
        out.attr = encode(attributes)
        return out
    }

    private static func encode(_ attributes: NodeAttributes) -> fuse_attr {
        let st = attributes.status
        var attr = fuse_attr()
        attr.ino = UInt64(st.st_ino)
        attr.size = attributes.size
        attr.blocks = UInt64(st.st_blocks)
        // Times before 1970 are negative: carried as the protocol's two's complement, never trapped.
        attr.atime = UInt64(bitPattern: Int64(st.st_atim.tv_sec));
        attr.atimensec = UInt32(truncatingIfNeeded: st.st_atim.tv_nsec)
        attr.mtime = UInt64(bitPattern: Int64(st.st_mtim.tv_sec));
        attr.mtimensec = UInt32(truncatingIfNeeded: st.st_mtim.tv_nsec)
        attr.ctime = UInt64(bitPattern: Int64(st.st_ctim.tv_sec));
        attr.ctimensec = UInt32(truncatingIfNeeded: st.st_ctim.tv_nsec)
        attr.mode = st.st_mode
        attr.nlink = UInt32(st.st_nlink)
        attr.uid = st.st_uid
        attr.gid = st.st_gid
        attr.rdev = UInt32(truncatingIfNeeded: st.st_rdev)
        attr.blksize = 4096
        return attr
    }

    /// `statvfs` as STATFS answers it.
    static func encode(_ st: statvfs) -> fuse_statfs_out {
        var out = fuse_statfs_out()
        out.st.blocks = UInt64(st.f_blocks)
        out.st.bfree = UInt64(st.f_bfree)
        out.st.bavail = UInt64(st.f_bavail)
        out.st.files = UInt64(st.f_files)
        out.st.ffree = UInt64(st.f_ffree)
        out.st.bsize = UInt32(st.f_bsize)
        out.st.namelen = UInt32(st.f_namemax)
        out.st.frsize = UInt32(st.f_frsize)
        return out
    }
}
