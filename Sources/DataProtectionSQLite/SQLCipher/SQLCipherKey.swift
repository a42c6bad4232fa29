import Crypto
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import _CryptoExtras

/// The key of an SQLCipher database, in the two modes SQLCipher defines.
///
/// ```swift
/// let key = SQLCipherKey.passphrase("correct horse")          // PRAGMA key = 'correct horse'
/// let raw = try SQLCipherKey(rawKeyHex: "2DD29CA8...")          // PRAGMA key = "x'2DD29CA8...'"
/// ```
public enum SQLCipherKey: Sendable {
    /// A passphrase: the page key is derived with PBKDF2 and the database's 16-byte salt.
    case passphrase(Data)
    /// A raw 256-bit key: no KDF. `salt`, when given, replaces the salt stored in the file
    /// (SQLCipher's `x'<64 hex><32 hex>'` form).
    case rawKey(SymmetricKey, salt: Data?)

    /// A passphrase given as text (UTF-8, as SQLCipher uses it).
    public static func passphrase(_ text: String) -> SQLCipherKey { .passphrase(Data(text.utf8)) }

    /// A raw key as SQLCipher's blob literal holds it: 64 hex digits, or 96 with the salt.
    public init(rawKeyHex hex: String) throws {
        var digits = hex
        if digits.hasPrefix("x'") && digits.hasSuffix("'") { digits = String(digits.dropFirst(2).dropLast()) }
        guard digits.count == 64 || digits.count == 96, let bytes = [UInt8](hex: digits) else {
            throw DatabaseCipherError.invalidKey("a raw key is 64 hex digits (or 96: key and salt)")
        }
        self = .rawKey(SymmetricKey(data: bytes[0..<32]), salt: bytes.count == 48 ? Data(bytes[32...]) : nil)
    }

    /// The `PRAGMA key` value SQLCipher's tools take for this key (raw keys as `x'…'`).
    public var pragmaValue: String {
        switch self {
        case .passphrase(let data): return String(decoding: data, as: UTF8.self)
        case .rawKey(let key, let salt):
            let hex = key.withUnsafeBytes { Self.hex($0) } + (salt.map { Self.hex($0) } ?? "")
            return "x'\(hex)'"
        }
    }

    /// Derives the page keys for a database with `salt` (the file's first 16 bytes).
    func pageKeys(salt fileSalt: [UInt8], format: SQLCipherFormat) throws -> PageKeys {
        let kdf: KDF.Insecure.PBKDF2.HashFunction = format.compatibility >= 4 ? .sha512 : .insecureSHA1
        let encryptionKey: SymmetricKey
        let salt: [UInt8]
        switch self {
        case .passphrase(let passphrase):
            salt = fileSalt
            encryptionKey = try KDF.Insecure.PBKDF2.deriveKey(
                from: passphrase, salt: salt, using: kdf, outputByteCount: 32,
                unsafeUncheckedRounds: format.kdfIterations)
        case .rawKey(let key, let givenSalt):
            guard key.bitCount == 256 else { throw DatabaseCipherError.invalidKey("a raw key is 256 bits") }
            if let givenSalt {
                guard givenSalt.count == 16 else { throw DatabaseCipherError.invalidKey("a salt is 16 bytes") }
                salt = Array(givenSalt)
            } else {
                salt = fileSalt
            }
            encryptionKey = key
        }
        // SQLCipher: the MAC key is PBKDF2(enc key, salt XOR 0x3a, 2 rounds) with the same PRF.
        let macSalt = salt.map { $0 ^ 0x3a }
        let macKey = try encryptionKey.withUnsafeBytes { keyBytes in
            try KDF.Insecure.PBKDF2.deriveKey(
                from: keyBytes, salt: macSalt, using: kdf, outputByteCount: 32, unsafeUncheckedRounds: 2)
        }
        return PageKeys(encryptionKey: encryptionKey, macKey: macKey, salt: salt)
    }

    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { String(format: "%02X", $0) }.joined()
    }
}

/// The keys pages are sealed with: AES-256 key, HMAC key, and the database's salt.
struct PageKeys: Sendable {
    let encryptionKey: SymmetricKey
    let macKey: SymmetricKey
    let salt: [UInt8]
}
