import Crypto
@testable import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Testing

/// The vectors of docs/FORMAT.md §7.6, computed independently with Python's hashlib and
/// pyca/cryptography (AES-256-CBC, HMAC-SHA512, PBKDF2), must come out of our page cipher.
@Suite struct PageFormatVectorTests {
    static let key = "2DD29CA851E7B56E4697B0E1F08507293D761A05CE4D1B628663F411A8086D99"
    static let salt = Array(UInt8(0)..<16)

    static func hex(_ bytes: some Sequence<UInt8>) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    @Test func keyDerivation() throws {
        let raw = try SQLCipherKey(rawKeyHex: Self.key).pageKeys(salt: Self.salt, format: .sqlcipher4)
        #expect(raw.macKey.withUnsafeBytes { Self.hex($0) } == "4af27af4b86f9048259f670ca69a156c5f0d44c35b2da4097701704ccd73db6a")
        let pass = try SQLCipherKey.passphrase("password").pageKeys(salt: Self.salt, format: .sqlcipher4)
        #expect(pass.encryptionKey.withUnsafeBytes { Self.hex($0) } == "f1dbedd27b9bf994e77a761b2036013a9afffee39393117a94360af8902e1f7e")
    }

    @Test(arguments: [(UInt32(1), "3517b0e22bc9f2a9f0386f0fa27a5b04cf75458ba862627389f0a0567cdf1170"),
                      (2, "1461ec51054c73d815cdd81d4d3662fdc4e71e983bfe39552ae8dd6f2cad074b")])
    func sealedPage(pgno: UInt32, sha256: String) throws {
        let cipher = try PageCipher(format: .sqlcipher4, keys: try SQLCipherKey(rawKeyHex: Self.key).pageKeys(salt: Self.salt, format: .sqlcipher4)).makeSession()
        var plain = (0..<4096).map { UInt8(($0 * 7) & 0xFF) }
        var sealed = [UInt8](repeating: 0, count: 4096)
        try plain.withUnsafeBytes { p in
            try sealed.withUnsafeMutableBytes { out in
                try cipher.seal(p, pgno: pgno, into: out) { reserve in
                    for i in 0..<reserve.count { reserve[i] = i < 16 ? UInt8(0x10 + i) : 0 }
                }
            }
        }
        #expect(Self.hex(SHA256.hash(data: sealed)) == sha256)
        // And it opens again, with SQLite's magic restored on page 1.
        var opened = [UInt8](repeating: 0, count: 4096)
        let ok = sealed.withUnsafeBytes { s in opened.withUnsafeMutableBytes { cipher.open(s, pgno: pgno, into: $0) } }
        #expect(ok)
        if pgno == 1 { plain.replaceSubrange(0..<16, with: PageCipher.sqliteMagic) }
        #expect(opened[0..<(4096 - 80)] == plain[0..<(4096 - 80)])
        // The wrong page number fails authentication.
        let moved = sealed.withUnsafeBytes { s in opened.withUnsafeMutableBytes { cipher.open(s, pgno: pgno + 1, into: $0) } }
        #expect(!moved)
    }
}
