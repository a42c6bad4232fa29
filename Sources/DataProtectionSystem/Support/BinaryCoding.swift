import Foundation

/// Appends big-endian fields to a byte buffer (the byte order of every format in `docs/FORMAT.md`).
package struct ByteWriter {
    package private(set) var bytes: [UInt8] = []
    package init() {}
    /// A writer whose storage holds `capacity` bytes before it must grow (a growing array leaves
    /// its old storage behind unzeroed: buffers that carry keys are sized up front).
    package init(capacity: Int) { bytes.reserveCapacity(capacity) }
    /// Overwrites a big-endian u32 at `offset` (a frame's length, once the payload is known).
    package mutating func patchU32(_ v: UInt32, at offset: Int) {
        for i in 0..<4 { bytes[offset + i] = UInt8(truncatingIfNeeded: v >> UInt32(24 - 8 * i)) }
    }
    package mutating func u8(_ v: UInt8) { bytes.append(v) }
    package mutating func u16(_ v: UInt16) { bytes += [UInt8(v >> 8), UInt8(v & 0xff)] }
    package mutating func u32(_ v: UInt32) {
        for s in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: v >> UInt32(s))) }
    }
    package mutating func u64(_ v: UInt64) {
        for s in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: v >> UInt64(s))) }
    }
    package mutating func raw<C: Collection<UInt8>>(_ v: C) { bytes += v }
    package mutating func zeros(_ n: Int) { bytes += [UInt8](repeating: 0, count: n) }
    /// A service channel's string (FORMAT.md §11.4, §12.2): u16 length, then UTF-8 — paths as
    /// their bytes (see `LosslessPath`); cut at 65,535 bytes.
    package mutating func text(_ value: String) {
        let utf8 = Array(value.utf8.prefix(Int(UInt16.max)))
        u16(UInt16(utf8.count))
        raw(utf8)
    }
}

/// Reads big-endian fields, failing with a message (never trapping) when input runs out.
package struct ByteReader {
    package struct OutOfBounds: Error {
        package let field: String
        package init(field: String) { self.field = field }
    }
    private let bytes: [UInt8]
    package private(set) var offset = 0
    package init(_ bytes: [UInt8]) { self.bytes = bytes }
    package var remaining: Int { bytes.count - offset }

    /// A string written by ``ByteWriter/text(_:)``; bytes that are not UTF-8 become U+FFFD.
    package mutating func text(_ field: String) throws -> String {
        let count = Int(try u16(field))
        return String(decoding: try raw(count, field), as: UTF8.self)
    }

    package mutating func raw(_ n: Int, _ field: String) throws -> [UInt8] {
        guard n >= 0, remaining >= n else { throw OutOfBounds(field: field) }
        defer { offset += n }
        return Array(bytes[offset..<offset + n])
    }
    package mutating func skip(_ n: Int) { offset += n }
    /// Calls `body` with the next `n` bytes in place (no copy); the caller checked `remaining`.
    package func peekingBytes<T>(_ n: Int, _ body: (UnsafeBufferPointer<UInt8>) throws -> T) rethrows -> T {
        try bytes.withUnsafeBufferPointer { try body(UnsafeBufferPointer(rebasing: $0[offset..<offset + n])) }
    }
    package mutating func u8(_ field: String) throws -> UInt8 { try raw(1, field)[0] }
    package mutating func u16(_ field: String) throws -> UInt16 { try raw(2, field).reduce(0) { $0 << 8 | UInt16($1) } }
    package mutating func u32(_ field: String) throws -> UInt32 { try raw(4, field).reduce(0) { $0 << 8 | UInt32($1) } }
    package mutating func u64(_ field: String) throws -> UInt64 { try raw(8, field).reduce(0) { $0 << 8 | UInt64($1) } }
}

extension Array where Element == UInt8 {
    /// Lower-case hexadecimal.
    package var hex: String { map { String(format: "%02x", $0) }.joined() }
    /// Parses hexadecimal; `nil` on odd length or a non-hex digit.
    package init?(hex: String) {
        var out: [UInt8] = []
        var chars = Array(hex.utf8)
        guard chars.count % 2 == 0 else { return nil }
        while !chars.isEmpty {
            guard let b = UInt8(String(decoding: chars.prefix(2), as: UTF8.self), radix: 16) else { return nil }
            out.append(b)
            chars.removeFirst(2)
        }
        self = out
    }
}

extension UUID {
    /// The 16 bytes of the UUID.
    package var bytes: [UInt8] { withUnsafeBytes(of: uuid) { Array($0) } }
    /// A UUID from 16 bytes.
    package init(bytes b: [UInt8]) {
        precondition(b.count == 16)
        self.init(
            uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15])
        )
    }
}
