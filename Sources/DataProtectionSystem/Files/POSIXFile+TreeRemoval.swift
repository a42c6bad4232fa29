import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

extension POSIXFile {
    /// This process's umask (set to 077 for the instant it takes to read it).
    package static func currentUmask() -> mode_t {
        let mask = umask(0o077)
        umask(mask)
        return mask
    }

    /// Removes the tree at `path` (a file, a link or a directory): descriptor-relative (`openat`
    /// with `O_NOFOLLOW`, `unlinkat`), so no depth is too deep for a path and no link is followed
    /// out of it; a directory made unreadable (`chmod 0`) is given back `u+rwx` first. Nothing
    /// at `path` is not an error.
    /// - Throws: ``FileSystemError`` naming what could not be removed.
    package static func removeTree(_ path: String) throws {
        guard let st = linkStatus(path) else { return }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            guard try LosslessPath.withCString(path, { Glibc.unlink($0) }) == 0 || errno == ENOENT else {
                throw FileSystemError("unlink", path: path, errno: Errno(rawValue: errno))
            }
            return
        }
        _ = try? LosslessPath.withCString(path) { Glibc.chmod($0, 0o700) }
        let fd = try LosslessPath.withCString(path) { Glibc.open($0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
        guard fd >= 0 else { throw FileSystemError("open", path: path, errno: Errno(rawValue: errno)) }
        try removeContents(fd, shown: path)
        guard try LosslessPath.withCString(path, { Glibc.rmdir($0) }) == 0 || errno == ENOENT else {
            throw FileSystemError("rmdir", path: path, errno: Errno(rawValue: errno))
        }
    }

    /// Empties the directory open as `fd` (and closes it).
    private static func removeContents(_ fd: Int32, shown: String) throws {
        guard let directory = fdopendir(fd) else {
            close(fd)
            throw FileSystemError("fdopendir", path: shown, errno: Errno(rawValue: errno))
        }
        defer { closedir(directory) }
        var names: [[CChar]] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                Array(raw.bindMemory(to: CChar.self).prefix { $0 != 0 }) + [0]
            }
            if name == [46, 0] || name == [46, 46, 0] { continue }   // "." and ".."
            names.append(name)
        }
        let parent = dirfd(directory)
        for name in names {
            var st = stat()
            guard fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) == 0 else { continue }
            if st.st_mode & S_IFMT == S_IFDIR {
                _ = fchmodat(parent, name, 0o700, 0)
                let child = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                guard child >= 0 else { throw FileSystemError("openat", path: shown, errno: Errno(rawValue: errno)) }
                try removeContents(child, shown: shown)
                guard unlinkat(parent, name, AT_REMOVEDIR) == 0 else {
                    throw FileSystemError("rmdir", path: shown, errno: Errno(rawValue: errno))
                }
            } else {
                guard unlinkat(parent, name, 0) == 0 else {
                    throw FileSystemError("unlink", path: shown, errno: Errno(rawValue: errno))
                }
            }
        }
    }
}
