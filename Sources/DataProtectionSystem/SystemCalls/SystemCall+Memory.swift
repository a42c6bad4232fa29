import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Memory that holds secrets, and words shared between processes.
extension SystemCall {
    /// `explicit_bzero`: zeroes `count` bytes at `pointer`, never optimised away.
    package static func explicitBzero(_ pointer: UnsafeMutableRawPointer?, _ count: Int) {
        cshim_wipe(pointer, UInt(count))
    }

    /// Zeroes 64 KiB of this thread's stack below the caller, where a crypto routine that just
    /// returned may have left secrets.
    package static func scrubStack() { cshim_scrub_stack() }

    /// A 64-bit word another process publishes in shared memory, read with acquire ordering.
    package static func loadAcquire(_ word: UnsafePointer<UInt64>) -> UInt64 { cshim_load_acquire_u64(word) }

    /// Publishes a 64-bit word in shared memory with release ordering.
    package static func storeRelease(_ word: UnsafeMutablePointer<UInt64>, _ value: UInt64) {
        cshim_store_release_u64(word, value)
    }
}

extension SystemCall {
    /// `getrandom(2)` until `buffer` is full (retrying on `EINTR` and short reads): the kernel's
    /// CSPRNG.
    package static func getrandom(_ buffer: UnsafeMutableRawBufferPointer) throws(Errno) {
        var filled = 0
        while filled < buffer.count {
            let n = CLinuxShims.getrandom(buffer.baseAddress!.advanced(by: filled), buffer.count - filled, 0)
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            filled += n
        }
    }
}
