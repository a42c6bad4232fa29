import Crypto
import Foundation

/// Measures the page cipher alone, for `dp-bench sqlite`'s context rows.
package enum PageCipherProbe {
    /// Microseconds per page to seal and to open (authenticate + decrypt) `iterations` pages.
    package static func microsecondsPerPage(
        format: SQLCipherFormat = .sqlcipher4, iterations: Int = 20_000
    ) throws -> (seal: Double, open: Double) {
        let keys = try SQLCipherKey.rawKey(.init(size: .bits256), salt: nil).pageKeys(
            salt: CipherConnection.randomSalt(), format: format)
        let cipher = try PageCipher(format: format, keys: keys).makeSession()
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: format.pageSize, alignment: 16)
        let sealed = UnsafeMutableRawBufferPointer.allocate(byteCount: format.pageSize, alignment: 16)
        let opened = UnsafeMutableRawBufferPointer.allocate(byteCount: format.pageSize, alignment: 16)
        defer { plain.deallocate(); sealed.deallocate(); opened.deallocate() }
        plain.initializeMemory(as: UInt8.self, repeating: 7)
        let clock = ContinuousClock()
        let sealTime = try clock.measure {
            for i in 0..<iterations {
                try cipher.seal(UnsafeRawBufferPointer(plain), pgno: UInt32(2 + i % 1000), into: sealed)
            }
        }
        try cipher.seal(UnsafeRawBufferPointer(plain), pgno: 2, into: sealed)
        var ok = true
        let openTime = clock.measure {
            for _ in 0..<iterations { ok = ok && cipher.open(UnsafeRawBufferPointer(sealed), pgno: 2, into: opened) }
        }
        precondition(ok)
        func micros(_ d: Duration) -> Double {
            (Double(d.components.seconds) * 1e6 + Double(d.components.attoseconds) / 1e12) / Double(iterations)
        }
        return (micros(sealTime), micros(openTime))
    }
}
