import CFUSEKernel
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One request read from the kernel: its header (`fuse_in_header`) and the bytes after it, read
/// defensively — a body shorter than the operation's structure is refused (`EINVAL`), never read
/// past.
struct FUSERequest {
    let unique: UInt64
    let opcode: UInt32
    let nodeID: UInt64
    let uid: UInt32, gid: UInt32, pid: UInt32
    /// The body (after the header), valid while the buffer it came from is.
    let body: UnsafeRawBufferPointer

    init?(_ bytes: UnsafeRawBufferPointer) {
        let headerSize = MemoryLayout<fuse_in_header>.size
        guard bytes.count >= headerSize else { return nil }
        let header = bytes.loadUnaligned(as: fuse_in_header.self)
        guard Int(header.len) == bytes.count else { return nil }
        (unique, opcode, nodeID) = (header.unique, header.opcode, header.nodeid)
        (uid, gid, pid) = (header.uid, header.gid, header.pid)
        body = UnsafeRawBufferPointer(rebasing: bytes[headerSize...])
    }

    /// The operation's fixed structure at the start of the body.
    func argument<T>(_ type: T.Type) throws(FUSEErrno) -> T {
        guard body.count >= MemoryLayout<T>.size else { throw FUSEErrno(EINVAL) }
        return body.loadUnaligned(as: T.self)
    }

    /// The bytes after the operation's fixed structure.
    func tail<T>(after type: T.Type) throws(FUSEErrno) -> UnsafeRawBufferPointer {
        guard body.count >= MemoryLayout<T>.size else { throw FUSEErrno(EINVAL) }
        return UnsafeRawBufferPointer(rebasing: body[MemoryLayout<T>.size...])
    }

    /// A NUL-terminated name starting at `bytes`, and what follows it. A name is one path
    /// component: never empty, `.`, `..`, nor containing `/` (the kernel sends none; a name
    /// that is one anyway is refused).
    static func name(in bytes: UnsafeRawBufferPointer) throws(FUSEErrno) -> (name: [UInt8], rest: UnsafeRawBufferPointer) {
        guard let end = bytes.firstIndex(of: 0) else { throw FUSEErrno(EINVAL) }
        let name = Array(bytes[bytes.startIndex..<end])
        guard !name.isEmpty, name != [0x2E], name != [0x2E, 0x2E], !name.contains(0x2F) else { throw FUSEErrno(EINVAL) }
        guard name.count <= Int(NAME_MAX) else { throw FUSEErrno(ENAMETOOLONG) }
        return (name, UnsafeRawBufferPointer(rebasing: bytes[(end + 1)...]))
    }
}

/// An errno a request is answered with.
struct FUSEErrno: Error {
    let code: Int32
    init(_ code: Int32) { self.code = code }
}

/// Replies and notifications, written to the device with one `writev` each (the kernel takes a
/// message whole or not at all).
struct FUSEReplier: Sendable {
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
                for part in parts where part.count > 0 { vectors.append(iovec(iov_base: UnsafeMutableRawPointer(mutating: part.baseAddress), iov_len: part.count)) }
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
        header.len = UInt32(MemoryLayout<fuse_out_header>.size + MemoryLayout<fuse_notify_inval_entry_out>.size + terminated.count)
        return withUnsafeBytes(of: &header) { head in
            withUnsafeBytes(of: &body) { payload in
                terminated.withUnsafeBytes { text in
                    let vectors = [iovec(iov_base: UnsafeMutableRawPointer(mutating: head.baseAddress), iov_len: head.count),
                                   iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress), iov_len: payload.count),
                                   iovec(iov_base: UnsafeMutableRawPointer(mutating: text.baseAddress), iov_len: text.count)]
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
                let vectors = [iovec(iov_base: UnsafeMutableRawPointer(mutating: head.baseAddress), iov_len: head.count),
                               iovec(iov_base: UnsafeMutableRawPointer(mutating: payload.baseAddress), iov_len: payload.count)]
                return writev(fd, vectors, 2) < 0 ? errno : 0
            }
        }
    }
}
