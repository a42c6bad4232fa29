import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Where an open file's plaintext is read and written: a protected file's segments (sealed with
/// its key, ``SegmentedFile``), or — for a file the protected file system serves — the file
/// itself, which the file system seals (``PlainFileStorage``).
protocol PlaintextStorage: AnyObject {
    /// The plaintext length.
    var size: Int64 { get }
    func read(at offset: Int64, count: Int) throws -> Data
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws
    func truncate(to newSize: Int64) throws
    /// Fills a new, empty file from `source` (which fills the buffer it is given and returns the
    /// byte count, 0 at the end).
    func writeStream(from source: (UnsafeMutableRawBufferPointer) throws -> Int) throws
    /// Ends a run of writes in place (FORMAT.md §3, "Writing in place").
    func settle() throws
}

extension SegmentedFile: PlaintextStorage {}

/// A file the protected file system serves, read and written as it is (the file system does
/// the cryptography and enforces the class at every call).
final class PlainFileStorage: PlaintextStorage {
    let fd: FileDescriptor
    let path: String

    init(fd: FileDescriptor, path: String) {
        self.fd = fd
        self.path = path
    }

    var size: Int64 {
        var st = stat()
        return fstat(fd.rawValue, &st) == 0 ? Int64(st.st_size) : 0
    }

    func read(at offset: Int64, count: Int) throws -> Data {
        guard count > 0 else { return Data() }
        var buffer = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let n = try buffer.withUnsafeMutableBytes { raw in
                try POSIXFile.system("pread", path) {
                    try fd.read(
                        fromAbsoluteOffset: offset + Int64(done),
                        into: UnsafeMutableRawBufferPointer(rebasing: raw[done...]), retryOnInterrupt: true)
                }
            }
            if n == 0 { break }
            done += n
        }
        return Data(buffer[0..<done])
    }

    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        _ = try POSIXFile.system("pwrite", path) { try fd.writeAll(toAbsoluteOffset: offset, bytes) }
    }

    func truncate(to newSize: Int64) throws {
        try POSIXFile.system("ftruncate", path) { try fd.resize(to: newSize, retryOnInterrupt: true) }
    }

    func writeStream(from source: (UnsafeMutableRawBufferPointer) throws -> Int) throws {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while true {
            let n = try source(buffer)
            if n == 0 { return }
            try write(UnsafeRawBufferPointer(rebasing: buffer[0..<n]), at: offset)
            offset += Int64(n)
        }
    }

    /// Nothing to settle: the file system settles the files it serves.
    func settle() throws {}
}
