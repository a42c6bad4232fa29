import CFUSEKernel
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// One message read from `/dev/fuse`, undecoded: its header (`fuse_in_header`) and the bytes
/// after it. ``FileSystemRequest/init(decoding:maxWrite:)`` reads the body defensively: a body
/// shorter than the operation's structure is refused (`EINVAL`), never read past.
struct KernelRequest {
    let unique: UInt64
    let opcode: UInt32
    let nodeID: UInt64
    let uid: UInt32, gid: UInt32, pid: UInt32
    /// The body (after the header), valid while the buffer it came from is.
    let body: UnsafeRawBufferPointer

    /// The message in `bytes`; `nil` when they are shorter than a header or not the length the
    /// header says (nothing can be answered: the message has no trustworthy `unique`).
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
    func argument<T>(_ type: T.Type) throws(Errno) -> T {
        guard body.count >= MemoryLayout<T>.size else { throw Errno(rawValue: EINVAL) }
        return body.loadUnaligned(as: T.self)
    }

    /// The bytes after the operation's fixed structure.
    func tail<T>(after type: T.Type) throws(Errno) -> UnsafeRawBufferPointer {
        try tail(after: MemoryLayout<T>.size)
    }

    /// The bytes after the body's first `count`.
    func tail(after count: Int) throws(Errno) -> UnsafeRawBufferPointer {
        guard body.count >= count else { throw Errno(rawValue: EINVAL) }
        return UnsafeRawBufferPointer(rebasing: body[count...])
    }

    /// A NUL-terminated name starting at `bytes`, and what follows it. A name is one path
    /// component: never empty, `.`, `..`, nor containing `/` (the kernel sends none; a name
    /// that is one anyway is refused, `EINVAL`); longer than `NAME_MAX`: `ENAMETOOLONG`.
    static func name(in bytes: UnsafeRawBufferPointer) throws(Errno) -> (name: [UInt8], rest: UnsafeRawBufferPointer) {
        let (name, rest) = try terminated(in: bytes)
        guard !name.isEmpty, name != [0x2E], name != [0x2E, 0x2E], !name.contains(0x2F) else {
            throw Errno(rawValue: EINVAL)
        }
        guard name.count <= Int(NAME_MAX) else { throw Errno(rawValue: ENAMETOOLONG) }
        return (name, rest)
    }

    /// An extended attribute's name (NUL-terminated, 1 to `XATTR_NAME_MAX` bytes: else `EINVAL`
    /// or `ERANGE`, as the kernel answers), and what follows it.
    static func attributeName(
        in bytes: UnsafeRawBufferPointer
    ) throws(Errno) -> (name: [UInt8], rest: UnsafeRawBufferPointer) {
        let (name, rest) = try terminated(in: bytes)
        guard !name.isEmpty, name.count <= Int(XATTR_NAME_MAX) else {
            throw Errno(rawValue: name.isEmpty ? EINVAL : ERANGE)
        }
        return (name, rest)
    }

    /// The bytes up to the first NUL, and those after it; `EINVAL` without a NUL.
    static func terminated(in bytes: UnsafeRawBufferPointer) throws(Errno) -> ([UInt8], UnsafeRawBufferPointer) {
        guard let end = bytes.firstIndex(of: 0) else { throw Errno(rawValue: EINVAL) }
        return (Array(bytes[bytes.startIndex..<end]), UnsafeRawBufferPointer(rebasing: bytes[(end + 1)...]))
    }
}
