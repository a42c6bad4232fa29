import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

extension PreferencesStore {
    /// What identifies one version of the plist without reading it: its inode and its size and
    /// modification time (a class change rewraps the file in place).
    ///
    /// Alone it can match a *different* version: a file system gives a freed inode number to the
    /// next file at once (ext4 does), and a modification time is coarse (a few milliseconds), so
    /// a file rewritten twice within one tick may look like the one known. Compared with a
    /// ``PinnedFile``'s it cannot: the pinned inode is held, so its number is nobody else's.
    struct FileIdentity: Equatable {
        var device: UInt64, inode: UInt64, size: Int64, modified: Int, modifiedNanoseconds: Int

        init(_ st: stat) {
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
            size = Int64(st.st_size)
            modified = Int(st.st_mtim.tv_sec)
            modifiedNanoseconds = Int(st.st_mtim.tv_nsec)
        }

        /// The item at `path` (`lstat`: a link is not followed); `nil` when there is none.
        init?(_ path: String) {
            var st = stat()
            guard lstat(path, &st) == 0 else { return nil }
            self.init(st)
        }
    }

    /// One version of the plist, held by an `O_PATH` descriptor for as long as it is the version
    /// known: while it is held, no other file can get its inode number, so an item found at the
    /// path with the same identity is this very version. It is read through that descriptor
    /// (``reopenPath``): what is read is the version pinned, never a newer one put in place since.
    /// `@unchecked Sendable`: immutable after init (its descriptor is closed only at deinit).
    final class PinnedFile: @unchecked Sendable {
        let identity: FileIdentity
        /// Whether it is a regular file (not a link, a FIFO, a directory).
        let isRegularFile: Bool
        private let descriptor: Int32

        private init(descriptor: Int32, status st: stat) {
            self.descriptor = descriptor
            identity = FileIdentity(st)
            isRegularFile = st.st_mode & S_IFMT == S_IFREG
        }

        /// The item at `path` (never through a link: a link is pinned as itself); `nil` when
        /// there is none. Any other failure (no descriptor left, no memory) throws: a plist that
        /// could not be looked at is never taken for an absent one.
        static func at(_ path: String) throws -> PinnedFile? {
            let fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC)
            guard fd >= 0 else {
                let failure = errno
                if failure == ENOENT { return nil }
                throw ContainerError.fileSystem(FileSystemError("open", path: path, errno: Errno(rawValue: failure)))
            }
            var st = stat()
            guard fstat(fd, &st) == 0 else {
                let failure = errno
                close(fd)
                throw ContainerError.fileSystem(FileSystemError("fstat", path: path, errno: Errno(rawValue: failure)))
            }
            return PinnedFile(descriptor: fd, status: st)
        }

        deinit { close(descriptor) }

        /// Whether the item at `path` is still this version.
        func isStill(at path: String) -> Bool { FileIdentity(path) == identity }

        /// The path that opens this very version (`/proc/self/fd/N`, a link the kernel resolves
        /// to the pinned inode, whatever is at the plist's path now).
        var reopenPath: String { "/proc/self/fd/\(descriptor)" }
    }
}
