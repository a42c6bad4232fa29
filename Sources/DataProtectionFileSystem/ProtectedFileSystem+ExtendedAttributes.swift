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

    /// The largest value an attribute may have (`XATTR_SIZE_MAX`).
    static let maxValueSize = 64 * 1024

    func extendedAttribute(_ name: [UInt8], of nodeID: UInt64) throws(Errno) -> [UInt8] {
        let node = try nodes.node(nodeID)
        if name == Self.classAttributeName {
            guard let cls = try currentClass(of: node) else { throw Errno(rawValue: ENODATA) }
            return Array(cls.shortName.utf8)
        }
        guard Self.isServed(name) else { throw Errno(rawValue: ENODATA) }
        guard node.kind != S_IFLNK else { throw Errno(rawValue: EOPNOTSUPP) }
        // Values are short (a URL, a tag): one call into a small buffer, and again at the value's
        // size only when it is larger (`ERANGE`, also when it grew in between).
        var buffer = [UInt8](repeating: 0, count: 256)
        return try withName(name) { attribute in
            Result { () throws(Errno) -> [UInt8] in
                while true {
                    do throws(Errno) {
                        let n = try SystemCall.getxattr(node.reopenPath, attribute, &buffer)
                        return Array(buffer[0..<n])
                    } catch .outOfRange where buffer.count < Self.maxValueSize {
                        var none: [UInt8] = []
                        let size = try SystemCall.getxattr(node.reopenPath, attribute, &none)
                        buffer = [UInt8](repeating: 0, count: min(max(size, buffer.count * 2), Self.maxValueSize))
                    }
                }
            }
        }.get()
    }

    func extendedAttributeNames(of nodeID: UInt64) throws(Errno) -> [[UInt8]] {
        let node = try nodes.node(nodeID)
        guard node.kind != S_IFLNK else { return [] }
        var none: [UInt8] = []
        guard let size = try? SystemCall.listxattr(node.reopenPath, &none), size > 0 else { return [] }
        var buffer = [UInt8](repeating: 0, count: size)
        guard let n = try? SystemCall.listxattr(node.reopenPath, &buffer), n > 0 else { return [] }
        return buffer[0..<n].split(separator: 0).map(Array.init).filter {
            Self.isServed($0) && $0 != Self.classAttributeName
        }
    }

    func setExtendedAttribute(_ name: [UInt8], of nodeID: UInt64, to value: [UInt8], flags: Int32) throws(Errno) {
        let node = try nodes.node(nodeID)
        guard !node.isReadOnly else { throw Errno(rawValue: EPERM) }
        try requireTerritory(node)
        if name == Self.classAttributeName {
            guard
                let cls = ProtectionClass(
                    name: String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
            else {
                throw Errno(rawValue: EINVAL)
            }
            try setClass(cls, of: node)
        } else {
            guard Self.isServed(name), node.kind != S_IFLNK else { throw Errno(rawValue: EOPNOTSUPP) }
            try withName(name) { attribute in
                Result { () throws(Errno) in try SystemCall.setxattr(node.reopenPath, attribute, value, flags: flags) }
            }.get()
        }
    }

    func removeExtendedAttribute(_ name: [UInt8], of nodeID: UInt64) throws(Errno) {
        let node = try nodes.node(nodeID)
        guard !node.isReadOnly else { throw Errno(rawValue: EPERM) }
        try requireTerritory(node)
        guard Self.isServed(name), node.kind != S_IFLNK else { throw Errno(rawValue: EOPNOTSUPP) }
        if name == Self.classAttributeName {
            // A file always has a class: removing it leaves it (what `rsync -X` does to an
            // attribute its source lacks). A directory's default goes.
            guard node.isDirectory else {
                guard node.isRegularFile, try currentClass(of: node) != nil else { throw Errno(rawValue: ENODATA) }
                return
            }
            node.directoryDefault.withLock { $0 = nil }
        }
        try withName(name) { attribute in
            Result { () throws(Errno) in try SystemCall.removexattr(node.reopenPath, attribute) }
        }.get()
        node.directoryDefault.withLock { $0 = nil }
    }

    /// A file's class (from its header), a directory's own default; `nil` for a plain file, a
    /// directory without a default, anything else.
    func currentClass(of node: FileNode) throws(Errno) -> ProtectionClass? {
        if node.isDirectory { return directoryDefault(of: node) }
        guard node.isRegularFile else { return nil }
        if let cls = node.open.withLock({ $0.protectionClass }) { return cls }
        return prefix(of: node, try node.status())?.protectionClass
    }

    /// Sets a directory's default, or rewraps a protected file's key for `cls`. A plain file is
    /// refused (`ENOTSUP`: protecting one rewrites it whole, `dpctl protect`), and so is a class
    /// below the floor of where the item is (`EPERM`).
    func setClass(_ cls: ProtectionClass, of node: FileNode) throws(Errno) {
        if let floor = node.floor, cls < floor { throw Errno(rawValue: EPERM) }
        // As for any `user.` attribute: the caller must be allowed to write the item.
        guard faccessat(AT_FDCWD, node.reopenPath, W_OK, AT_EACCESS) == 0 else { throw Errno(rawValue: errno) }
        if node.isDirectory {
            let value = Array(cls.shortName.utf8)
            try SystemCall.setxattr(node.reopenPath, Self.classAttribute, value)
            node.directoryDefault.withLock { $0 = nil }
            return
        }
        guard node.isRegularFile, try currentClass(of: node) != nil else { throw Errno(rawValue: ENOTSUP) }
        try attach(node, writing: false, reading: false)
        defer { detach(node) }
        try rewrap(node, to: cls)
    }

    /// Rewraps the key of a protected file that is attached (a handle counted) for `cls`,
    /// through its open engine if it has one. No floor or permission check: the caller's.
    func rewrap(_ node: FileNode, to cls: ProtectionClass) throws(Errno) {
        let fd = node.open.withLock { $0.descriptor }
        do {
            // The new wrapping is made outside the file's lock (it may ask keybagd); it is written
            // under it, through the open engine if there is one: one writer of the header at a
            // time, whose marks are kept (FORMAT.md §3).
            let path = describe(node)
            guard
                let rewrap = try runBlocking({ [files] in
                    try await files.prepareRewrap(fd: FileDescriptor(rawValue: fd), path: path, to: cls)
                })
            else { return }
            try node.open.withLock { file in
                if let engine = file.engine {
                    try engine.apply(rewrap)
                } else {
                    try rewrap.apply(fd: FileDescriptor(rawValue: fd), path: path)
                }
                file.protectionClass = cls
                if cls == .complete { file.mayHavePages = true }
            }
        } catch {
            throw Self.errorCode(error)
        }
        kinds.forget(node.identity)
    }
}
