import Crypto
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Copying, moving and removing items: a copy never silently lowers protection, and a tree is
/// built under a hidden name and renamed into place once whole.
extension ProtectedFileManager {
    /// Copies a file or a directory tree. A copied protected file gets a new file key and the
    /// stronger of its own class and the destination's default — unless `protection` names one.
    /// A copy never silently lowers protection. Fails if `destination` exists.
    public func copyItem(at source: URL, to destination: URL, protection: ProtectionClass? = nil) async throws {
        if POSIXFile.linkStatus(destination.path) != nil {
            throw ProtectedFileError.fileSystem(
                FileSystemError("copy", path: LosslessPath.display(destination.path), errno: .fileExists))
        }
        guard case .directory = try self.protection(ofItemAt: source) else {
            return try await copyFile(at: source, to: destination, protection: protection)
        }
        // A tree: never into itself; built under a hidden name beside the destination and renamed
        // into place once whole, so a failure (a locked class, a full disk, a FIFO inside) leaves
        // nothing behind.
        if let sourceStatus = POSIXFile.status(source.path),
            Self.isInside(directory: sourceStatus, path: destination.deletingLastPathComponent().path)
        {
            throw ProtectedFileError.copyIntoItself(path: source.path, destination: destination.path)
        }
        let staging = URL(fileURLWithPath: POSIXFile.temporarySibling(of: destination.path))
        do {
            try await copyTree(at: source, to: staging, protection: protection)
            try wrapFS {
                try POSIXFile.renameWithoutReplacing(staging.path, to: destination.path)
            }
        } catch {
            try? POSIXFile.removeTree(staging.path)
            throw error
        }
    }

    /// Copies the directory `source` to `destination` (which does not exist yet). Below the top,
    /// links are copied as links (never followed); a device, FIFO or socket stops the copy.
    func copyTree(at source: URL, to destination: URL, protection: ProtectionClass?) async throws {
        guard case .directory(let defaultClass) = try self.protection(ofItemAt: source) else {
            throw ProtectedFileError.notARegularFile(path: source.path, kind: "no longer a directory")
        }
        let mode = (POSIXFile.status(source.path)?.st_mode ?? 0o755) & 0o777 & ~POSIXFile.currentUmask()
        try wrapFS {
            try POSIXFile.call("mkdir", destination.path) { mkdir($0, 0o700) }   // ours alone while it fills
            if let defaultClass { try DirectoryDefault.set(defaultClass, destination.path) }
            try BackupMark.copy(from: source.path, to: destination.path)   // as the class: kept by the copy
        }
        // as cp: the source's bits, less the umask
        defer { _ = try? POSIXFile.call("chmod", destination.path) { chmod($0, mode) } }
        let children = try wrapFS { try POSIXFile.directoryEntries(source.path) }
        for name in children.sorted() {
            let from = source.appendingPathComponent(name), to = destination.appendingPathComponent(name)
            guard let st = POSIXFile.linkStatus(from.path) else { continue }   // gone since the listing
            switch st.st_mode & S_IFMT {
            case S_IFDIR:
                try await copyTree(at: from, to: to, protection: protection)
            case S_IFLNK:
                try wrapFS {
                    let target = try POSIXFile.linkTarget(from.path)
                    try POSIXFile.call("symlink", target, to.path) { symlink($0, $1) }
                }
            case S_IFREG:
                try await copyFile(at: from, to: to, protection: protection)
            default:
                try ProtectedFileError.checkReplaceable(from.path)
            }
        }
    }

    /// Whether the directory `directory` is `path` or one of its ancestors (compared by device
    /// and inode, so links and `..` cannot hide it).
    static func isInside(directory: stat, path: String) -> Bool {
        var current = path.isEmpty ? "." : path
        for _ in 0..<1024 {
            guard let st = POSIXFile.status(current) else { return false }
            if st.st_dev == directory.st_dev, st.st_ino == directory.st_ino { return true }
            let up = current + "/.."
            guard let above = POSIXFile.status(up), above.st_dev != st.st_dev || above.st_ino != st.st_ino else {
                return false
            }   // "/"
            current = up
        }
        return false
    }

    /// Copies one file (a protected one re-encrypted under a new key, a plain one protected).
    func copyFile(at source: URL, to destination: URL, protection: ProtectionClass?) async throws {
        switch try self.protection(ofItemAt: source) {
        case .directory:
            throw ProtectedFileError.isDirectory(path: source.path)
        case .protected(let sourceClass):
            let cls = protection ?? max(sourceClass, defaultProtection(forNewItemAt: destination))
            let handle = try await openHandle(forReadingFrom: source)
            do {
                try await copyStreaming(
                    from: handle, size: try await handle.size(), to: destination, protection: cls,
                    thisDeviceOnly: servedByFileSystem ? false : try ItemInspector.isThisDeviceOnly(source))
                try await handle.close()
            } catch {
                try? await handle.close()
                throw error
            }
        case .plain where BackupMark.isCacheDirectoryTag(source.path):
            // A cache directory tag is copied as it is: the tools that honour it read it as plaintext.
            try await ProtectedFileError.translating(path: destination.path, writing: true) {
                try POSIXFile.writeNew(destination.path, try POSIXFile.readAll(source.path))
            }
        case .plain:
            let cls = protection ?? defaultProtection(forNewItemAt: destination)
            let fd = try await ProtectedFileError.translating(path: source.path, writing: false) {
                try POSIXFile.open(source.path, .readOnly)
            }
            defer { try? fd.close() }
            try await write(contentsOf: fd, to: destination, protection: cls)
        case .other:
            try ProtectedFileError.checkReplaceable(source.path)
            throw ProtectedFileError.notProtected(path: source.path)
        }
        try wrapFS { try BackupMark.copy(from: source.path, to: destination.path) }   // as the class: kept by the copy
        // As cp: the source's permission bits, less the umask (a 0600 file stays private).
        if let st = POSIXFile.status(source.path) {
            try wrapFS {
                try POSIXFile.call("chmod", destination.path) {
                    chmod($0, st.st_mode & 0o777 & ~POSIXFile.currentUmask())
                }
            }
        }
    }

    func copyStreaming(
        from handle: ProtectedFileHandle, size: Int64, to destination: URL, protection: ProtectionClass,
        thisDeviceOnly: Bool
    ) async throws {
        // Decrypt into a temporary protected file chunk by chunk; memory stays at one chunk.
        // The copy keeps the source's segment size: it is used the way the source was.
        let created = try await createFile(
            at: URL(fileURLWithPath: POSIXFile.temporarySibling(of: destination.path)), protection: protection,
            thisDeviceOnly: thisDeviceOnly, segmentSizeLog2: handle.segmentSizeLog2)
        var offset: Int64 = 0
        do {
            while offset < size {
                let data = try await handle.read(at: offset, count: 1 << 20)
                try await created.write(data, at: offset)
                offset += Int64(data.count)
            }
            try await created.synchronize()
            try await created.close()
            try await ProtectedFileError.translating(path: destination.path, writing: true) {
                if POSIXFile.linkStatus(destination.path) != nil {
                    throw FileSystemError("rename", path: LosslessPath.display(destination.path), errno: .fileExists)
                }
                try POSIXFile.call("rename", created.url.path, destination.path) { rename($0, $1) }
            }
        } catch {
            try? await created.close()
            _ = try? POSIXFile.call("unlink", created.url.path) { unlink($0) }
            throw error
        }
    }

    /// Moves an item; a protected file keeps its class and key. Across file systems the file
    /// is copied (same class) and the original removed.
    public func moveItem(at source: URL, to destination: URL) async throws {
        if (try? LosslessPath.withCString(
            source.path, { s in try LosslessPath.withCString(destination.path) { rename(s, $0) } })) == 0
        {
            return
        }
        let err = Errno(rawValue: errno)
        guard err == .improperLink else {
            throw err == .noSuchFileOrDirectory
                ? ProtectedFileError.noSuchFile(path: source.path)
                : ProtectedFileError.fileSystem(FileSystemError("rename", path: source.path, errno: err))
        }
        try await copyItem(at: source, to: destination, protection: (try? self.protection(ofItemAt: source))?.fileClass)
        try removeItem(at: source)
    }

    /// Removes a file or a directory tree.
    public func removeItem(at url: URL) throws {
        guard let st = POSIXFile.linkStatus(url.path) else { throw ProtectedFileError.noSuchFile(path: url.path) }
        if st.st_mode & S_IFMT == S_IFDIR {
            for name in try wrapFS({ try POSIXFile.directoryEntries(url.path) }) {
                try removeItem(at: url.appendingPathComponent(name))
            }
            try wrapFS { try POSIXFile.call("rmdir", url.path) { rmdir($0) } }
        } else {
            try wrapFS { try POSIXFile.call("unlink", url.path) { unlink($0) } }
        }
    }
}
