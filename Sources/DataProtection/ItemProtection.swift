import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// What a path holds, as far as protection goes — readable without any key.
public enum ItemProtection: Sendable, Equatable {
    /// A directory, with its default class for new files if it has one.
    case directory(defaultClass: ProtectionClass?)
    /// A file in the protected format, with its class (from the header, not yet authenticated).
    case protected(ProtectionClass)
    /// A plain file: not protected. Protecting it converts it in place.
    case plain
    /// Something else (a device, a socket …).
    case other

    /// The class a file carries, `nil` for plain files and directories.
    public var fileClass: ProtectionClass? {
        if case .protected(let cls) = self { return cls }
        return nil
    }
}

/// Directory defaults, kept in the extended attribute `user.dataprotection.class`.
package enum DirectoryDefault {
    package static let attribute = "user.dataprotection.class"

    package static func get(_ directory: String) throws -> ProtectionClass? {
        guard let value = try POSIXFile.getAttribute(attribute, path: directory) else { return nil }
        return ProtectionClass(name: String(decoding: value, as: UTF8.self))
    }

    package static func set(_ cls: ProtectionClass?, _ directory: String) throws {
        if let cls {
            try POSIXFile.setAttribute(attribute, Array(cls.shortName.utf8), path: directory)
        } else {
            try POSIXFile.removeAttribute(attribute, path: directory)
        }
    }

    /// The default of the nearest ancestor of `path` that has one (unreadable ancestors are skipped).
    package static func inherited(forNewItemAt path: String) -> ProtectionClass? {
        var directory = POSIXFile.split(POSIXFile.standardized(path)).directory
        while true {
            if let cls = try? get(directory) { return cls }
            if directory == "/" || directory == "." { return nil }
            directory = POSIXFile.split(directory).directory
        }
    }
}

/// Reads what the protected format reveals without any key: the kind of item, a file's class
/// and its plaintext size. Works while locked and without a keybag (`dpctl ls` uses it).
public enum ItemInspector {
    /// What `url` holds: a directory (and its default class), a protected file (and its class),
    /// a plain file. A file that looks like the protected format but does not parse is an error
    /// (``ProtectedFileError/damaged(path:reason:)``), never "plain".
    public static func protection(ofItemAt url: URL) throws -> ItemProtection {
        let path = url.path
        guard let st = POSIXFile.status(path) else { throw ProtectedFileError.noSuchFile(path: path) }
        switch st.st_mode & S_IFMT {
        case S_IFDIR:
            return .directory(defaultClass: try wrapFS { try DirectoryDefault.get(path) })
        case S_IFREG:
            let prefix = try wrapFS { try readPrefix(path) }
            guard ProtectedFileHeader.looksProtected(prefix) else { return .plain }
            return .protected(try ProtectedFileHeader.parse(prefix, path: path).protectionClass)
        default:
            return .other
        }
    }

    /// The plaintext size of a file, from its length alone (for protected files: the length
    /// minus the header and 28 bytes per segment, FORMAT.md §3). Not authenticated until the file is read.
    public static func plaintextSize(ofItemAt url: URL) throws -> Int64 {
        let path = url.path
        guard let st = POSIXFile.status(path) else { throw ProtectedFileError.noSuchFile(path: path) }
        guard case .protected = try protection(ofItemAt: url) else { return Int64(st.st_size) }
        let header = try ProtectedFileHeader.parse(try wrapFS { try readPrefix(path) }, path: path)
        return header.layout.plaintextSize(fileSize: Int64(st.st_size))?.size ?? 0
    }

    /// A regular file's class and device binding from one read of its header; `nil` for a file
    /// that is not protected. Readable without a key.
    package static func classAndDeviceBinding(ofFileAt path: String) throws -> (ProtectionClass, thisDeviceOnly: Bool)?
    {
        let prefix = try wrapFS { try readPrefix(path) }
        guard ProtectedFileHeader.looksProtected(prefix) else { return nil }
        let header = try ProtectedFileHeader.parse(prefix, path: path)
        return (header.protectionClass, header.wrappedKey.thisDeviceOnly)
    }

    /// Where a protected file's sealed segments lie on disk (FORMAT.md §3): the header and
    /// segment 0 end at `first`, and every later segment takes `stride` bytes. `nil` for a file
    /// that is not protected. Readable without a key; a backup cuts a file's ciphertext there, so
    /// that a rewritten segment is stored alone.
    package static func segmentBoundaries(ofFileAt path: String) throws -> (first: Int, stride: Int)? {
        // Never a link, a FIFO or a device, whatever was there when the caller looked.
        let prefix = try wrapFS {
            let fd = try POSIXFile.openRegularFile(path)
            defer { try? fd.close() }
            return try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
        }
        guard ProtectedFileHeader.looksProtected(prefix) else { return nil }
        let layout = try ProtectedFileHeader.parse(prefix, path: path).layout
        return (Int(layout.offset(ofSegment: 1)), layout.capacity + SegmentLayout.overhead)
    }

    /// Whether a protected file is bound to this device ("this device only"); `false` for
    /// anything else. Readable without a key.
    public static func isThisDeviceOnly(_ url: URL) throws -> Bool {
        guard case .protected = try protection(ofItemAt: url) else { return false }
        return try ProtectedFileHeader.parse(try wrapFS { try readPrefix(url.path) }, path: url.path).wrappedKey
            .thisDeviceOnly
    }

    static func readPrefix(_ path: String) throws -> [UInt8] {
        let fd = try POSIXFile.open(path, .readOnly)
        defer { try? fd.close() }
        return try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
    }

    static func wrapFS<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as FileSystemError {
            if error.errno == .noSuchFileOrDirectory { throw ProtectedFileError.noSuchFile(path: error.path) }
            if error.errno == .isDirectory { throw ProtectedFileError.isDirectory(path: error.path) }
            throw ProtectedFileError.fileSystem(error)
        } catch let error as ProtectedFileError {
            throw error
        } catch let error as CocoaError {
            throw ProtectedFileError.fileSystem(
                FileSystemError(error.localizedDescription, path: error.filePath ?? "", errno: .ioError))
        }
    }
}
