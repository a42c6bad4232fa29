import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Files, names and file systems.
extension SystemCall {
    /// `openat2(2)`'s `RESOLVE_*` rules.
    package struct Resolve: OptionSet, Sendable {
        package let rawValue: UInt64
        package init(rawValue: UInt64) { self.rawValue = rawValue }
        package static let noCrossDevice = Resolve(rawValue: UInt64(CSHIM_RESOLVE_NO_XDEV))
        package static let noMagicLinks = Resolve(rawValue: UInt64(CSHIM_RESOLVE_NO_MAGICLINKS))
        package static let noSymlinks = Resolve(rawValue: UInt64(CSHIM_RESOLVE_NO_SYMLINKS))
        package static let beneath = Resolve(rawValue: UInt64(CSHIM_RESOLVE_BENEATH))
        package static let inRoot = Resolve(rawValue: UInt64(CSHIM_RESOLVE_IN_ROOT))
    }

    /// `openat2(2)`: opens `path` relative to `directory` under `resolve`'s rules.
    package static func openat2(
        _ directory: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32, mode: UInt32 = 0,
        resolve: Resolve
    ) throws(Errno) -> Int32 {
        try checked(cshim_openat2(directory, path, flags, mode, resolve.rawValue))
    }

    /// `renameat2(2)` with `flags` (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``). A file system
    /// that lacks a flag answers `EINVAL`.
    package static func renameat2(
        _ oldDirectory: Int32, _ oldPath: UnsafePointer<CChar>, _ newDirectory: Int32,
        _ newPath: UnsafePointer<CChar>, flags: UInt32
    ) throws(Errno) {
        _ = try checked(cshim_renameat2(oldDirectory, oldPath, newDirectory, newPath, flags))
    }

    /// Renames without ever replacing what is at the new name (`EEXIST`): `renameat2` with
    /// ``RENAME_NOREPLACE`` — or, on a file system without it (`EINVAL`, `ENOSYS`), a look at
    /// the new name and then `renameat` (the one place that falls back). The fallback is not
    /// atomic: use it only where no one else makes names in the directory (the caller's own
    /// files); where an app may, call ``renameat2(_:_:_:_:flags:)``, which refuses instead.
    package static func renameWithoutReplacing(
        _ oldDirectory: Int32, _ oldPath: UnsafePointer<CChar>, _ newDirectory: Int32,
        _ newPath: UnsafePointer<CChar>
    ) throws(Errno) {
        do throws(Errno) {
            try renameat2(oldDirectory, oldPath, newDirectory, newPath, flags: RENAME_NOREPLACE)
        } catch  where error == .invalidArgument || error == .noFunction {
            var st = stat()
            guard fstatat(newDirectory, newPath, &st, AT_SYMLINK_NOFOLLOW) != 0 else { throw Errno.fileExists }
            while renameat(oldDirectory, oldPath, newDirectory, newPath) != 0 {
                guard errno == EINTR else { throw Errno(rawValue: errno) }
            }
        }
    }

    /// `getdents64(2)`: directory entries (`struct linux_dirent64`) from the descriptor's
    /// offset into `buffer`; the bytes read (0 at the end).
    package static func getdents64(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(Errno) -> Int {
        try checked(cshim_getdents64(fd, buffer.baseAddress, UInt(buffer.count)))
    }

    /// `copy_file_range(2)` between two offsets: the bytes copied (0 at the end of the input).
    package static func copyFileRange(
        from source: Int32, at sourceOffset: Int64, to target: Int32, at targetOffset: Int64,
        count: Int
    ) throws(Errno) -> Int {
        try checked(cshim_copy_file_range(source, sourceOffset, target, targetOffset, UInt(count)))
    }

    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)`: starts writing a range back, without waiting.
    package static func syncFileRangeWrite(_ fd: Int32, offset: Int64, count: Int64) throws(Errno) {
        _ = try checked(cshim_start_writeback(fd, offset, count))
    }

    /// `statx(2)`'s birth time of `path` relative to `directory` (a link not followed; an empty
    /// path: `directory` itself); `nil` when the file system keeps none.
    package static func statxBirthTime(_ directory: Int32, _ path: UnsafePointer<CChar>) throws(Errno) -> timespec? {
        var seconds: Int64 = 0, nanoseconds: UInt32 = 0
        guard try checked(cshim_birth_time(directory, path, &seconds, &nanoseconds)) == 0 else { return nil }
        return timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds))
    }

    /// `linkat(fd, "", AT_EMPTY_PATH)`: names a file opened with ``O_TMPFILE`` (through its
    /// `/proc/self/fd` link where the kernel refuses the former).
    package static func linkUnnamed(_ fd: Int32, _ newDirectory: Int32, _ newPath: UnsafePointer<CChar>) throws(Errno) {
        _ = try checked(cshim_link_unnamed(fd, newDirectory, newPath))
    }

    /// `fcntl(F_OFD_SETLK)` of a write lock on the whole file (`EAGAIN`: another open file
    /// description holds one). Released when the last descriptor of the description closes.
    package static func ofdWriteLock(_ fd: Int32) throws(Errno) {
        _ = try checked(cshim_ofd_write_lock(fd))
    }

    /// `fcntl(F_OFD_GETLK)` for a write lock on the whole file: whether another open file
    /// description holds a lock on it.
    package static func ofdIsLocked(_ fd: Int32) throws(Errno) -> Bool {
        try checked(cshim_ofd_is_locked(fd)) == 1
    }

    /// `fstatfs(2)`'s `f_type` (``fuseSuperMagic``…).
    package static func fstatfsType(_ fd: Int32) throws(Errno) -> Int64 {
        try checked(cshim_file_system_type(fd))
    }

    /// `statfs(2)`'s `f_type` of `path` (followed if a link).
    package static func statfsType(_ path: UnsafePointer<CChar>) throws(Errno) -> Int64 {
        try checked(cshim_path_file_system_type(path))
    }

    /// A FUSE file system's `f_type` (`FUSE_SUPER_MAGIC`).
    package static let fuseSuperMagic: Int64 = 0x6573_5546
}
