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

/// Extended attributes: `user.dataprotection.class` is a file's class (from its header; setting
/// it rewraps the file's key) and a directory's default for new files — served when asked by
/// name, never listed, and removing it from a file does nothing (a file always has a class), so
/// that copying tools (`rsync -aX`, `cp --preserve=xattr`, `tar --xattrs`) neither fail on it nor
/// stamp a class onto plain files elsewhere; every other `user.` attribute is the backing item's
/// own. Other namespaces are not served, as gocryptfs does:
/// `system.` (POSIX ACLs, which the kernel would not enforce on this mount), `security.` and
/// `trusted.` are absent (`ENODATA`) and cannot be set (`EOPNOTSUPP`) — and a listing's two
/// questions per file (`ls -l` asks for `security.selinux` and an ACL) cost no system call.
extension ProtectedFileSystem {
    /// The attribute that names a class, on files and directories.
    public static let classAttribute = "user.dataprotection.class"

    /// ``classAttribute``'s bytes.
    static let classAttributeName = Array(classAttribute.utf8)

    /// Whether an attribute's name is in the namespace the mount serves (`user.`).
    static func isServed(_ name: [UInt8]) -> Bool { name.starts(with: userNamespace) }
    private static let userNamespace = Array("user.".utf8)

    /// SETXATTR's structure without `FUSE_SETXATTR_EXT` (which this server does not ask for).
    private static let setAttributeHeader = 8

    func getExtendedAttribute(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        let argument = try request.argument(fuse_getxattr_in.self)
        let (name, _) = try Self.attributeName(in: try request.tail(after: fuse_getxattr_in.self))
        let value: [UInt8]
        if name == Array(Self.classAttribute.utf8) {
            guard let cls = try currentClass(of: node) else { throw FUSEErrno(ENODATA) }
            value = Array(cls.shortName.utf8)
        } else {
            guard Self.isServed(name) else { throw FUSEErrno(ENODATA) }
            guard node.kind != S_IFLNK else { throw FUSEErrno(EOPNOTSUPP) }
            var buffer = [UInt8](repeating: 0, count: min(Int(argument.size), 64 * 1024))
            let n = withName(name) { attribute in
                buffer.withUnsafeMutableBytes { getxattr(node.reopenPath, attribute, argument.size == 0 ? nil : $0.baseAddress, argument.size == 0 ? 0 : $0.count) }
            }
            guard n >= 0 else { throw FUSEErrno(errno) }
            if argument.size == 0 { return replySize(request, n, replier) }
            value = Array(buffer[0..<n])
        }
        if argument.size == 0 { return replySize(request, value.count, replier) }
        guard value.count <= Int(argument.size) else { throw FUSEErrno(ERANGE) }
        value.withUnsafeBytes { replier.reply(request.unique, [$0]) }
    }

    private func replySize(_ request: FUSERequest, _ size: Int, _ replier: FUSEReplier) {
        var out = fuse_getxattr_out()
        out.size = UInt32(size)
        replier.reply(request.unique, out)
    }

    func listExtendedAttributes(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        let argument = try request.argument(fuse_getxattr_in.self)
        var names = [UInt8]()
        if node.kind != S_IFLNK {
            let size = listxattr(node.reopenPath, nil, 0)
            if size > 0 {
                var buffer = [UInt8](repeating: 0, count: size)
                let n = listxattr(node.reopenPath, &buffer, size)
                if n > 0 {
                    for name in buffer[0..<n].split(separator: 0) where Self.isServed(Array(name)) && !name.elementsEqual(Self.classAttributeName) {
                        names += Array(name) + [0]
                    }
                }
            }
        }
        if argument.size == 0 { return replySize(request, names.count, replier) }
        guard names.count <= Int(argument.size) else { throw FUSEErrno(ERANGE) }
        names.withUnsafeBytes { replier.reply(request.unique, [$0]) }
    }

    func setExtendedAttribute(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        guard !node.isReadOnly else { throw FUSEErrno(EPERM) }
        try requireTerritory(node)
        guard request.body.count >= Self.setAttributeHeader else { throw FUSEErrno(EINVAL) }
        let size = Int(request.body.loadUnaligned(as: UInt32.self))
        let flags = request.body.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        let (name, rest) = try Self.attributeName(in: UnsafeRawBufferPointer(rebasing: request.body[Self.setAttributeHeader...]))
        guard rest.count >= size else { throw FUSEErrno(EINVAL) }
        let value = Array(rest[rest.startIndex..<(rest.startIndex + size)])
        if name == Array(Self.classAttribute.utf8) {
            guard let cls = ProtectionClass(name: String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) else {
                throw FUSEErrno(EINVAL)
            }
            try setClass(cls, of: node)
        } else {
            guard Self.isServed(name), node.kind != S_IFLNK else { throw FUSEErrno(EOPNOTSUPP) }
            let done = withName(name) { setxattr(node.reopenPath, $0, value, value.count, Int32(flags)) }
            guard done == 0 else { throw FUSEErrno(errno) }
        }
        replier.reply(request.unique)
    }

    func removeExtendedAttribute(_ request: FUSERequest, _ replier: FUSEReplier) throws(FUSEErrno) {
        let node = try nodes.node(request.nodeID)
        guard !node.isReadOnly else { throw FUSEErrno(EPERM) }
        try requireTerritory(node)
        let (name, _) = try Self.attributeName(in: request.body)
        guard Self.isServed(name), node.kind != S_IFLNK else { throw FUSEErrno(EOPNOTSUPP) }
        if name == Self.classAttributeName {
            // A file always has a class: removing it leaves it (what `rsync -X` does to an
            // attribute its source lacks). A directory's default goes.
            guard node.isDirectory else {
                guard node.isRegularFile, try currentClass(of: node) != nil else { throw FUSEErrno(ENODATA) }
                return replier.reply(request.unique)
            }
            node.directoryDefault.withLock { $0 = nil }
        }
        guard withName(name, { removexattr(node.reopenPath, $0) }) == 0 else { throw FUSEErrno(errno) }
        node.directoryDefault.withLock { $0 = nil }
        replier.reply(request.unique)
    }

    /// A file's class (from its header), a directory's own default; `nil` for a plain file, a
    /// directory without a default, anything else.
    func currentClass(of node: FileNode) throws(FUSEErrno) -> ProtectionClass? {
        if node.isDirectory { return directoryDefault(of: node) }
        guard node.isRegularFile else { return nil }
        if let cls = node.open.withLock({ $0.protectionClass }) { return cls }
        return prefix(of: node, try node.status())?.protectionClass
    }

    /// Sets a directory's default, or rewraps a protected file's key for `cls`. A plain file is
    /// refused (`ENOTSUP`: protecting one rewrites it whole, `dpctl protect`), and so is a class
    /// below the floor of where the item is (`EPERM`).
    func setClass(_ cls: ProtectionClass, of node: FileNode) throws(FUSEErrno) {
        if let floor = node.floor, cls < floor { throw FUSEErrno(EPERM) }
        // As for any `user.` attribute: the caller must be allowed to write the item.
        guard faccessat(AT_FDCWD, node.reopenPath, W_OK, AT_EACCESS) == 0 else { throw FUSEErrno(errno) }
        if node.isDirectory {
            let value = Array(cls.shortName.utf8)
            guard setxattr(node.reopenPath, Self.classAttribute, value, value.count, 0) == 0 else { throw FUSEErrno(errno) }
            node.directoryDefault.withLock { $0 = nil }
            return
        }
        guard node.isRegularFile, try currentClass(of: node) != nil else { throw FUSEErrno(ENOTSUP) }
        try attach(node, writing: false, reading: false)
        defer { detach(node) }
        try rewrap(node, to: cls)
    }

    /// Rewraps the key of a protected file that is attached (a handle counted) for `cls`,
    /// through its open engine if it has one. No floor or permission check: the caller's.
    func rewrap(_ node: FileNode, to cls: ProtectionClass) throws(FUSEErrno) {
        let fd = node.open.withLock { $0.descriptor }
        do {
            // The new wrapping is made outside the file's lock (it may ask keybagd); it is written
            // under it, through the open engine if there is one: one writer of the header at a
            // time, whose marks are kept (FORMAT.md §3).
            let path = describe(node)
            guard let rewrap = try runBlocking({ [files] in try await files.prepareRewrap(fd: FileDescriptor(rawValue: fd), path: path, to: cls) }) else { return }
            try node.open.withLock { file in
                if let engine = file.engine { try engine.apply(rewrap) } else { try rewrap.apply(fd: FileDescriptor(rawValue: fd), path: path) }
                file.protectionClass = cls
                if cls == .complete { file.mayHavePages = true }
            }
        } catch {
            throw Self.errorCode(error)
        }
        kinds.forget(node.identity)
    }

    /// An attribute's name (NUL-terminated), and what follows it.
    static func attributeName(in bytes: UnsafeRawBufferPointer) throws(FUSEErrno) -> (name: [UInt8], rest: UnsafeRawBufferPointer) {
        guard let end = bytes.firstIndex(of: 0) else { throw FUSEErrno(EINVAL) }
        let name = Array(bytes[bytes.startIndex..<end])
        guard !name.isEmpty, name.count <= Int(XATTR_NAME_MAX) else { throw FUSEErrno(name.isEmpty ? EINVAL : ERANGE) }
        return (name, UnsafeRawBufferPointer(rebasing: bytes[(end + 1)...]))
    }
}
