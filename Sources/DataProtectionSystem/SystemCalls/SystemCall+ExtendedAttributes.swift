import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Extended attributes (`<sys/xattr.h>`, which Glibc's module does not export), by path (links
/// followed, as the calls do) and by descriptor.
extension SystemCall {
    /// `getxattr(2)`: the value's length, read into `buffer` (an empty buffer: only its length).
    package static func getxattr(
        _ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ buffer: inout [UInt8]
    ) throws(Errno) -> Int {
        try returned(buffer.withUnsafeMutableBytes { CLinuxShims.getxattr(path, name, $0.baseAddress, $0.count) })
    }

    /// `fgetxattr(2)`.
    package static func fgetxattr(
        _ fd: Int32, _ name: UnsafePointer<CChar>, _ buffer: inout [UInt8]
    ) throws(Errno) -> Int {
        try returned(buffer.withUnsafeMutableBytes { CLinuxShims.fgetxattr(fd, name, $0.baseAddress, $0.count) })
    }

    /// `setxattr(2)` with `flags` (`XATTR_CREATE`, `XATTR_REPLACE`).
    package static func setxattr(
        _ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: [UInt8],
        flags: Int32 = 0
    ) throws(Errno) {
        _ = try returned(
            value.withUnsafeBytes { Int(CLinuxShims.setxattr(path, name, $0.baseAddress, $0.count, flags)) })
    }

    /// `fsetxattr(2)` with `flags`.
    package static func fsetxattr(
        _ fd: Int32, _ name: UnsafePointer<CChar>, _ value: [UInt8], flags: Int32 = 0
    ) throws(Errno) {
        _ = try returned(
            value.withUnsafeBytes { Int(CLinuxShims.fsetxattr(fd, name, $0.baseAddress, $0.count, flags)) })
    }

    /// `listxattr(2)`: the list's length (NUL-terminated names), read into `buffer` (an empty
    /// buffer: only its length).
    package static func listxattr(_ path: UnsafePointer<CChar>, _ buffer: inout [UInt8]) throws(Errno) -> Int {
        try returned(
            buffer.withUnsafeMutableBytes {
                CLinuxShims.listxattr(path, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count)
            })
    }

    /// `removexattr(2)`.
    package static func removexattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>) throws(Errno) {
        _ = try returned(Int(CLinuxShims.removexattr(path, name)))
    }

    /// A libc call's result: its value, or `errno` when it is -1.
    @inline(__always)
    private static func returned(_ value: Int) throws(Errno) -> Int {
        guard value >= 0 else { throw Errno(rawValue: errno) }
        return value
    }
}
