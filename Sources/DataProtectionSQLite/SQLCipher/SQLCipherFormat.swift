/// The page format of an SQLCipher database: which SQLCipher version's settings it uses and its
/// page size. Like `PRAGMA cipher_compatibility` and `PRAGMA cipher_page_size`.
///
/// | | ``sqlcipher4`` (default) | ``sqlcipher3`` |
/// |---|---|---|
/// | cipher | AES-256-CBC, fresh IV per page write | same |
/// | page size | 4096 | 1024 |
/// | page MAC | HMAC-SHA512 | HMAC-SHA1 |
/// | reserved bytes per page | 80 | 48 |
/// | passphrase KDF | PBKDF2-HMAC-SHA512, 256,000 rounds | PBKDF2-HMAC-SHA1, 64,000 rounds |
///
/// ```swift
/// let format = SQLCipherFormat.sqlcipher4.withPageSize(8192)  // PRAGMA cipher_page_size = 8192
/// ```
public struct SQLCipherFormat: Sendable, Hashable, CustomStringConvertible {
    /// SQLCipher's major version whose defaults this format uses: 3 or 4.
    public let compatibility: Int
    /// Bytes per page: a power of two from 512 to 65536.
    public let pageSize: Int
    /// PBKDF2 rounds for passphrases (raw keys skip the KDF).
    public let kdfIterations: Int

    /// SQLCipher 4's defaults.
    public static let sqlcipher4 = SQLCipherFormat(compatibility: 4, pageSize: 4096, kdfIterations: 256_000)
    /// SQLCipher 3's defaults (`PRAGMA cipher_compatibility = 3`).
    public static let sqlcipher3 = SQLCipherFormat(compatibility: 3, pageSize: 1024, kdfIterations: 64_000)

    /// The defaults of SQLCipher `compatibility` (3 or 4).
    public init(compatibility: Int) throws {
        switch compatibility {
        case 3: self = .sqlcipher3
        case 4: self = .sqlcipher4
        default:
            throw DatabaseCipherError.unsupportedFormat(
                "cipher compatibility \(compatibility) (only 3 and 4 are supported)")
        }
    }

    private init(compatibility: Int, pageSize: Int, kdfIterations: Int) {
        self.compatibility = compatibility
        self.pageSize = pageSize
        self.kdfIterations = kdfIterations
    }

    /// The same format with another page size (`PRAGMA cipher_page_size`).
    public func withPageSize(_ size: Int) throws -> SQLCipherFormat {
        guard size >= 512, size <= 65536, size & (size - 1) == 0 else {
            throw DatabaseCipherError.unsupportedFormat("page size \(size) (a power of two from 512 to 65536)")
        }
        return SQLCipherFormat(compatibility: compatibility, pageSize: size, kdfIterations: kdfIterations)
    }

    /// Bytes of the page MAC: 64 (HMAC-SHA512) or 20 (HMAC-SHA1).
    var macSize: Int { compatibility >= 4 ? 64 : 20 }
    /// Bytes SQLite leaves unused at the end of every page: IV + MAC, rounded up to 16.
    var reserve: Int { (16 + macSize + 15) / 16 * 16 }
    /// Bytes of a page that hold ciphertext.
    var usableSize: Int { pageSize - reserve }

    public var description: String { "SQLCipher \(compatibility) (page size \(pageSize))" }
}
