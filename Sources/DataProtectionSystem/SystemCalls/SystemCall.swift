import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Linux system calls that Swift's Glibc module leaves out — calls without a libc wrapper,
/// macros that need `_GNU_SOURCE`, structures Swift cannot build (`CMSG_*`) — each wrapped once,
/// named after its call, throwing the call's `Errno` (swift-system's way). The C side
/// (`CLinuxShims`) returns a value or -errno; nothing outside this module calls it.
///
/// ```swift
/// let fd = try SystemCall.openat2(directory, "a/b", O_RDONLY | O_CLOEXEC, resolve: [.beneath, .noSymlinks])
/// try SystemCall.renameat2(AT_FDCWD, from, AT_FDCWD, to, flags: RENAME_NOREPLACE)
/// ```
package enum SystemCall {
    /// The value a shim returned, or the `Errno` its negative value carries.
    @inline(__always)
    static func checked<T: SignedInteger>(_ value: T) throws(Errno) -> T {
        guard value >= 0 else { throw Errno(rawValue: Int32(truncatingIfNeeded: 0 - value)) }
        return value
    }
}

// The macros Glibc's module leaves out (they need `_GNU_SOURCE`), by their C names.

/// `O_PATH`: a descriptor that holds an inode without opening it.
package let O_PATH: Int32 = cshim_o_path()
/// `O_TMPFILE`: an unnamed file in a directory, named later (``SystemCall/linkUnnamed(_:_:_:)``).
package let O_TMPFILE: Int32 = cshim_o_tmpfile()
/// `AT_EMPTY_PATH`: an `*at` call on the descriptor itself.
package let AT_EMPTY_PATH: Int32 = cshim_at_empty_path()
/// `UTIME_NOW` and `UTIME_OMIT`: `utimensat`'s "now" and "leave it".
package let UTIME_NOW: Int = cshim_utime_now()
package let UTIME_OMIT: Int = cshim_utime_omit()
/// `FALLOC_FL_KEEP_SIZE`.
package let FALLOC_FL_KEEP_SIZE: Int32 = cshim_falloc_keep_size()
/// `renameat2`'s flags.
package let RENAME_NOREPLACE = UInt32(CSHIM_RENAME_NOREPLACE)
package let RENAME_EXCHANGE = UInt32(CSHIM_RENAME_EXCHANGE)
