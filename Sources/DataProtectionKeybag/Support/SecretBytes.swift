import Crypto
import DataProtectionSystem
import Foundation

/// Bytes of a secret — a passcode, a key on its way through a socket — in memory this package
/// controls: one `mmap`'d region, `mlock`'ed (never swapped), left out of core dumps, zeroed
/// with `explicit_bzero` by ``wipe()`` and when released. It hands out no `Array` or `String`
/// copy, which the runtime would free without zeroing.
///
/// ```swift
/// let passcode = SecretBytes(copying: frame[offset..<offset + length])
/// try kdf.derive(passcode: passcode, salt: salt)       // scrypt reads it in place
/// passcode.wipe()                                     // or let it go: deinit wipes too
/// ```
/// `@unchecked Sendable`: its buffer is filled by its one owner at creation and wiped by it at the end; in between
/// it is only read.
package final class SecretBytes: @unchecked Sendable {
    private let base: UnsafeMutableRawPointer
    private let capacity: Int
    /// The number of bytes held.
    package private(set) var count: Int

    /// A zeroed buffer of `count` bytes.
    package init(count: Int) {
        let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        capacity = max(pageSize, (count + pageSize - 1) / pageSize * pageSize)
        guard let mapped = mmap(nil, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            mapped != MAP_FAILED
        else {
            fatalError("SecretBytes: mmap of \(capacity) bytes failed")   // out of address space
        }
        base = mapped
        _ = mlock(base, capacity)
        _ = madvise(base, capacity, 16 /* MADV_DONTDUMP */)
        self.count = count
    }

    /// A buffer holding a copy of `bytes` (the caller wipes its own copy, if it has one).
    package convenience init(copying bytes: some Collection<UInt8>) {
        self.init(count: bytes.count)
        var index = 0
        for byte in bytes {
            base.storeBytes(of: byte, toByteOffset: index, as: UInt8.self)
            index += 1
        }
    }

    /// The UTF-8 bytes of `string` (the string itself stays the caller's).
    package convenience init(utf8 string: String) {
        self.init(copying: string.utf8)
    }

    deinit {
        SystemCall.explicitBzero(base, capacity)
        munlock(base, capacity)
        munmap(base, capacity)
    }

    /// Zeroes the bytes now; the count becomes 0.
    package func wipe() {
        SystemCall.explicitBzero(base, capacity)
        count = 0
    }

    package var isEmpty: Bool { count == 0 }

    /// Whether the bytes are valid UTF-8 (checked in place).
    package var isUTF8: Bool { withUnsafeBytes { String(validating: $0, as: UTF8.self) != nil } }

    package func withUnsafeBytes<T>(_ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeRawBufferPointer(start: base, count: count))
    }

    package func withUnsafeMutableBytes<T>(_ body: (UnsafeMutableRawBufferPointer) throws -> T) rethrows -> T {
        try body(UnsafeMutableRawBufferPointer(start: base, count: count))
    }
}

extension Array where Element == UInt8 {
    /// Zeroes the array's storage in place, even where other copies share it (for buffers that
    /// carried a secret and are about to be released).
    package func wipeInPlace() {
        withUnsafeBufferPointer {
            SystemCall.explicitBzero(UnsafeMutableRawPointer(mutating: $0.baseAddress), $0.count)
        }
    }
}

extension ByteReader {
    /// The next `n` bytes as ``SecretBytes``, with no intermediate array.
    package mutating func secret(_ n: Int, _ field: String) throws -> SecretBytes {
        guard n >= 0, remaining >= n else { throw OutOfBounds(field: field) }
        defer { skip(n) }
        return peekingBytes(n) { SecretBytes(copying: $0) }
    }
}

extension ByteReader {
    /// The next 32 bytes as a key, copied once into the key's own (zeroed-on-release) storage.
    package mutating func peekingKey() throws -> SymmetricKey {
        guard remaining >= 32 else { throw OutOfBounds(field: "key") }
        defer { skip(32) }
        return peekingBytes(32) { SymmetricKey(data: UnsafeRawBufferPointer($0)) }
    }
}
