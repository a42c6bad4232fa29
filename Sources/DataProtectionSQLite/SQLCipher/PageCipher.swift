import Crypto
import _CryptoExtras
import CLinuxShims
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Seals and opens single pages in SQLCipher's page format (docs/FORMAT.md §7):
///
///     [ciphertext: pageSize − reserve][IV 16][HMAC][random fill]
///
/// AES-256-CBC without padding under a fresh random IV on every write; the HMAC (SHA512 in
/// SQLCipher 4, SHA1 in 3) covers ciphertext ‖ IV ‖ page number (u32 little-endian) and is
/// checked, in constant time, before anything is decrypted. Page 1 starts with the 16-byte salt
/// in place of `"SQLite format 3\0"` and is encrypted from byte 16.
struct PageCipher: Sendable {
    let format: SQLCipherFormat
    let keys: PageKeys
    /// HMACs already keyed: keying costs two hash blocks and some allocation, so each page copies
    /// a keyed one (its state is copied on write) instead of keying a new one.
    private let keyedMAC512: HMAC<SHA512>
    private let keyedMAC1: HMAC<Insecure.SHA1>

    static let sqliteMagic: [UInt8] = Array("SQLite format 3\0".utf8)

    init(format: SQLCipherFormat, keys: PageKeys) {
        self.format = format
        self.keys = keys
        self.keyedMAC512 = HMAC<SHA512>(key: keys.macKey)
        self.keyedMAC1 = HMAC<Insecure.SHA1>(key: keys.macKey)
    }

    var pageSize: Int { format.pageSize }

    /// Encrypts the plaintext page `plain` (pageSize bytes) as page `pgno` into `out`.
    /// `fillReserve` fills the reserve area (the IV is its first 16 bytes): random, except in
    /// the test vectors.
    func seal(_ plain: UnsafeRawBufferPointer, pgno: UInt32, into out: UnsafeMutableRawBufferPointer,
              fillReserve: (UnsafeMutableRawBufferPointer) throws -> Void = PageCipher.fillRandom) throws {
        let usable = format.usableSize
        let start = pgno == 1 ? 16 : 0
        precondition(plain.count == pageSize && out.count == pageSize)
        // The whole reserve area is random; its first 16 bytes are the IV.
        try fillReserve(UnsafeMutableRawBufferPointer(rebasing: out[usable...]))
        let iv = try AES._CBC.IV(ivBytes: UnsafeRawBufferPointer(rebasing: out[usable..<usable + 16]))
        let ciphertext = try AES._CBC.encrypt(UnsafeRawBufferPointer(rebasing: plain[start..<usable]),
                                               using: keys.encryptionKey, iv: iv, noPadding: true)
        ciphertext.withUnsafeBytes { out.baseAddress!.advanced(by: start).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        if start == 16 { keys.salt.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 16) } }
        let mac = self.mac(UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(out)[start..<usable + 16]), pgno: pgno)
        mac.withUnsafeBytes { out.baseAddress!.advanced(by: usable + 16).copyMemory(from: $0.baseAddress!, byteCount: format.macSize) }
    }

    /// Authenticates and decrypts the raw page `raw` as page `pgno` into `out`.
    /// - Returns: `false` (and leaves `out` unspecified) when the page fails authentication.
    func open(_ raw: UnsafeRawBufferPointer, pgno: UInt32, into out: UnsafeMutableRawBufferPointer) -> Bool {
        let usable = format.usableSize
        let start = pgno == 1 ? 16 : 0
        guard raw.count == pageSize, out.count == pageSize else { return false }
        let stored = UnsafeRawBufferPointer(rebasing: raw[(usable + 16)..<(usable + 16 + format.macSize)])
        guard macMatches(UnsafeRawBufferPointer(rebasing: raw[start..<usable + 16]), pgno: pgno, stored: stored) else { return false }
        guard let iv = try? AES._CBC.IV(ivBytes: UnsafeRawBufferPointer(rebasing: raw[usable..<usable + 16])),
              let plain = try? AES._CBC.decrypt(UnsafeRawBufferPointer(rebasing: raw[start..<usable]),
                                                using: keys.encryptionKey, iv: iv, noPadding: true) else { return false }
        // Copy the reserve first: `raw` and `out` may be the same buffer's neighbours, never overlapping.
        out.baseAddress!.advanced(by: usable).copyMemory(from: raw.baseAddress!.advanced(by: usable), byteCount: pageSize - usable)
        plain.withUnsafeBytes { out.baseAddress!.advanced(by: start).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        if start == 16 { Self.sqliteMagic.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 16) } }
        return true
    }

    /// HMAC(macKey, body ‖ pgno as u32 little-endian), from an already keyed HMAC.
    private static func mac<H: HashFunction>(_ keyed: HMAC<H>, _ body: UnsafeRawBufferPointer, pgno: UInt32) -> HashedAuthenticationCode<H> {
        var hmac = keyed
        hmac.update(data: body)
        withUnsafeBytes(of: pgno.littleEndian) { hmac.update(data: $0) }
        return hmac.finalize()
    }

    private func mac(_ body: UnsafeRawBufferPointer, pgno: UInt32) -> [UInt8] {
        format.compatibility >= 4 ? Array(Self.mac(keyedMAC512, body, pgno: pgno)) : Array(Self.mac(keyedMAC1, body, pgno: pgno))
    }

    /// Compares in constant time (swift-crypto's `==` between a MAC and bytes).
    private func macMatches(_ body: UnsafeRawBufferPointer, pgno: UInt32, stored: UnsafeRawBufferPointer) -> Bool {
        format.compatibility >= 4 ? Self.mac(keyedMAC512, body, pgno: pgno) == stored : Self.mac(keyedMAC1, body, pgno: pgno) == stored
    }

    /// Fills `buffer` from the kernel's CSPRNG (getrandom(2)).
    static func fillRandom(_ buffer: UnsafeMutableRawBufferPointer) throws {
        var filled = 0
        while filled < buffer.count {
            let n = getrandom(buffer.baseAddress!.advanced(by: filled), buffer.count - filled, 0)
            if n < 0 {
                if errno == EINTR { continue }
                throw DatabaseCipherError.randomUnavailable
            }
            filled += n
        }
    }
}
