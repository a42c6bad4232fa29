import COpenSSLCrypto
import Crypto
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

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
///
/// The primitives are the system's OpenSSL libcrypto, SQLCipher's own default provider, and this
/// is the only place in the package that calls it (every other key, hash and cipher goes through
/// swift-crypto): a page open is an HMAC over 4 KiB and a CBC decryption, and OpenSSL's
/// SHA-512 and AES take their vector paths on every x86-64 CPU where BoringSSL's portable
/// SHA-512 is 1.7× slower per page (docs/BENCHMARKS.md). The AES key schedules and the keyed HMAC
/// are prepared once per key, here; each open file takes a ``Session`` (its own copies, used by
/// one thread at a time), so a page costs no key setup and no allocation.
///
/// ```swift
/// let cipher = try PageCipher(format: .sqlcipher4, keys: keys)
/// let session = try cipher.makeSession()
/// try session.seal(plain, pgno: 2, into: sealed)
/// let authentic = session.open(sealed, pgno: 2, into: plain)
/// ```
package struct PageCipher: Sendable {
    let format: SQLCipherFormat
    let keys: PageKeys
    private let prepared: PreparedKeys

    package static let sqliteMagic: [UInt8] = Array("SQLite format 3\0".utf8)

    /// Prepares `keys` for `format`: the AES-256 key schedule in both directions and the HMAC
    /// keyed with the MAC key.
    init(format: SQLCipherFormat, keys: PageKeys) throws {
        self.format = format
        self.keys = keys
        self.prepared = try PreparedKeys(format: format, keys: keys)
    }

    var pageSize: Int { format.pageSize }

    /// A sealer and opener of pages for one user at a time (an open file, a maintenance copy).
    func makeSession() throws -> Session { try Session(self, prepared.copy()) }

    /// Fills `buffer` from the kernel's CSPRNG (getrandom(2)).
    static func fillRandom(_ buffer: UnsafeMutableRawBufferPointer) throws {
        do throws(Errno) { try SystemCall.getrandom(buffer) } catch { throw DatabaseCipherError.randomUnavailable }
    }
}

extension PageCipher {
    /// The OpenSSL contexts of one user: an encryption and a decryption context holding the AES
    /// key schedule (each page only sets its IV) and an HMAC context holding the keyed state
    /// (each page restarts it from there). Not for concurrent use; the contexts are freed, and
    /// OpenSSL wipes the key material in them, when the session goes.
    final class Session {
        let format: SQLCipherFormat
        let keys: PageKeys
        private let contexts: Contexts
        /// The MAC computed over a page being opened, compared with the stored one.
        private let computedMAC = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 16)

        fileprivate init(_ cipher: PageCipher, _ contexts: Contexts) {
            self.format = cipher.format
            self.keys = cipher.keys
            self.contexts = contexts
        }

        deinit {
            contexts.free()
            computedMAC.initializeMemory(as: UInt8.self, repeating: 0)
            computedMAC.deallocate()
        }

        var pageSize: Int { format.pageSize }

        /// Encrypts the plaintext page `plain` (pageSize bytes) as page `pgno` into `out`.
        /// `fillReserve` fills the reserve area (the IV is its first 16 bytes): random, except in
        /// the test vectors.
        func seal(
            _ plain: UnsafeRawBufferPointer, pgno: UInt32, into out: UnsafeMutableRawBufferPointer,
            fillReserve: (UnsafeMutableRawBufferPointer) throws -> Void = PageCipher.fillRandom
        ) throws {
            let usable = format.usableSize
            let start = pgno == 1 ? 16 : 0
            precondition(plain.count == pageSize && out.count == pageSize)
            // The whole reserve area is random; its first 16 bytes are the IV.
            try fillReserve(UnsafeMutableRawBufferPointer(rebasing: out[usable...]))
            let base = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
            guard EVP_EncryptInit_ex2(contexts.encrypt, nil, nil, base + usable, nil) == 1,
                EVP_CIPHER_CTX_set_padding(contexts.encrypt, 0) == 1
            else { throw DatabaseCipherError.cipherFailed("AES-256-CBC setup") }
            var written: Int32 = 0
            guard
                EVP_EncryptUpdate(
                    contexts.encrypt, base + start, &written,
                    plain.baseAddress!.assumingMemoryBound(to: UInt8.self) + start, Int32(usable - start)) == 1,
                Int(written) == usable - start
            else { throw DatabaseCipherError.cipherFailed("AES-256-CBC encryption") }
            if start == 16 {
                keys.salt.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 16) }
            }
            guard
                mac(
                    UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(out)[start..<usable + 16]), pgno: pgno,
                    into: base + usable + 16)
            else { throw DatabaseCipherError.cipherFailed("HMAC") }
        }

        /// Authenticates and decrypts the raw page `raw` as page `pgno` into `out` (never the
        /// same memory).
        /// - Returns: `false` (and leaves `out` unspecified) when the page fails authentication.
        func open(_ raw: UnsafeRawBufferPointer, pgno: UInt32, into out: UnsafeMutableRawBufferPointer) -> Bool {
            let usable = format.usableSize
            let start = pgno == 1 ? 16 : 0
            guard raw.count == pageSize, out.count == pageSize else { return false }
            let source = raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
            guard
                mac(
                    UnsafeRawBufferPointer(rebasing: raw[start..<usable + 16]), pgno: pgno,
                    into: computedMAC.baseAddress!.assumingMemoryBound(to: UInt8.self)),
                CRYPTO_memcmp(computedMAC.baseAddress!, source + usable + 16, format.macSize) == 0
            else { return false }
            let target = out.baseAddress!.assumingMemoryBound(to: UInt8.self)
            var written: Int32 = 0
            guard EVP_DecryptInit_ex2(contexts.decrypt, nil, nil, source + usable, nil) == 1,
                EVP_CIPHER_CTX_set_padding(contexts.decrypt, 0) == 1,
                EVP_DecryptUpdate(contexts.decrypt, target + start, &written, source + start, Int32(usable - start))
                    == 1,
                Int(written) == usable - start
            else { return false }
            (target + usable).update(from: source + usable, count: pageSize - usable)
            if start == 16 {
                Self.magic.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 16) }
            }
            return true
        }

        /// Whether the raw page `raw` authenticates as page `pgno` (its MAC only; nothing is decrypted).
        func authenticates(_ raw: UnsafeRawBufferPointer, pgno: UInt32) -> Bool {
            let usable = format.usableSize
            let start = pgno == 1 ? 16 : 0
            guard raw.count == pageSize else { return false }
            return mac(
                UnsafeRawBufferPointer(rebasing: raw[start..<usable + 16]), pgno: pgno,
                into: computedMAC.baseAddress!.assumingMemoryBound(to: UInt8.self))
                && CRYPTO_memcmp(computedMAC.baseAddress!, raw.baseAddress! + usable + 16, format.macSize) == 0
        }

        private static let magic = PageCipher.sqliteMagic

        /// HMAC(macKey, body ‖ pgno as u32 little-endian) into `out` (64 bytes of room), from
        /// the keyed state (EVP_MAC_init with no key restarts from it).
        private func mac(_ body: UnsafeRawBufferPointer, pgno: UInt32, into out: UnsafeMutablePointer<UInt8>) -> Bool {
            var number = pgno.littleEndian
            var length = 0
            return EVP_MAC_init(contexts.mac, nil, 0, nil) == 1
                && EVP_MAC_update(contexts.mac, body.baseAddress!.assumingMemoryBound(to: UInt8.self), body.count) == 1
                && withUnsafeBytes(of: &number) {
                    EVP_MAC_update(contexts.mac, $0.baseAddress!.assumingMemoryBound(to: UInt8.self), 4)
                } == 1
                && EVP_MAC_final(contexts.mac, out, &length, 64) == 1
                && length == format.macSize
        }
    }

    /// One set of OpenSSL contexts (EVP_CIPHER_CTX ×2, EVP_MAC_CTX).
    fileprivate struct Contexts {
        let encrypt: OpaquePointer
        let decrypt: OpaquePointer
        let mac: OpaquePointer

        func free() {
            EVP_CIPHER_CTX_free(encrypt)
            EVP_CIPHER_CTX_free(decrypt)
            EVP_MAC_CTX_free(mac)
        }
    }

    /// The contexts keyed once per key, only ever copied from (under a lock) by new sessions.
    /// `@unchecked Sendable`: `template` never changes and is only copied from, under `lock`.
    private final class PreparedKeys: @unchecked Sendable {
        private let template: Contexts
        private let lock = Mutex(())

        nonisolated(unsafe) private static let aes256CBC = EVP_CIPHER_fetch(nil, "AES-256-CBC", nil)
        nonisolated(unsafe) private static let hmac = EVP_MAC_fetch(nil, "HMAC", nil)

        init(format: SQLCipherFormat, keys: PageKeys) throws {
            guard let aes = Self.aes256CBC, let hmac = Self.hmac else {
                throw DatabaseCipherError.cipherFailed(
                    "OpenSSL has no AES-256-CBC or HMAC (libcrypto's default provider is not loaded)")
            }
            guard let encrypt = EVP_CIPHER_CTX_new() else { throw DatabaseCipherError.cipherFailed("out of memory") }
            guard let decrypt = EVP_CIPHER_CTX_new() else {
                EVP_CIPHER_CTX_free(encrypt); throw DatabaseCipherError.cipherFailed("out of memory")
            }
            guard let mac = EVP_MAC_CTX_new(hmac) else {
                EVP_CIPHER_CTX_free(encrypt); EVP_CIPHER_CTX_free(decrypt)
                throw DatabaseCipherError.cipherFailed("out of memory")
            }
            let contexts = Contexts(encrypt: encrypt, decrypt: decrypt, mac: mac)
            let keyed =
                keys.encryptionKey.withUnsafeBytes { key -> Bool in
                    let key = key.baseAddress!.assumingMemoryBound(to: UInt8.self)
                    return EVP_EncryptInit_ex2(encrypt, aes, key, nil, nil) == 1
                        && EVP_DecryptInit_ex2(decrypt, aes, key, nil, nil) == 1
                }
                && keys.macKey.withUnsafeBytes { key in
                    Self.withDigestParameter(format.compatibility >= 4 ? "SHA512" : "SHA1") { parameters in
                        EVP_MAC_init(mac, key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count, parameters)
                            == 1
                    }
                }
            guard keyed else { contexts.free(); throw DatabaseCipherError.cipherFailed("keying AES-256-CBC or HMAC") }
            template = contexts
        }

        deinit { template.free() }

        /// Copies of the keyed contexts, for one session.
        func copy() throws -> Contexts {
            try lock.withLock { _ in
                guard let encrypt = EVP_CIPHER_CTX_new() else {
                    throw DatabaseCipherError.cipherFailed("out of memory")
                }
                guard let decrypt = EVP_CIPHER_CTX_new() else {
                    EVP_CIPHER_CTX_free(encrypt); throw DatabaseCipherError.cipherFailed("out of memory")
                }
                guard EVP_CIPHER_CTX_copy(encrypt, template.encrypt) == 1,
                    EVP_CIPHER_CTX_copy(decrypt, template.decrypt) == 1,
                    let mac = EVP_MAC_CTX_dup(template.mac)
                else {
                    EVP_CIPHER_CTX_free(encrypt); EVP_CIPHER_CTX_free(decrypt)
                    throw DatabaseCipherError.cipherFailed("copying the keyed contexts")
                }
                return Contexts(encrypt: encrypt, decrypt: decrypt, mac: mac)
            }
        }

        /// `{ "digest": name, end }` for EVP_MAC_init: both strings outlive the call.
        private static func withDigestParameter<R>(_ name: String, _ body: (UnsafePointer<OSSL_PARAM>) -> R) -> R {
            "digest".withCString { key in
                name.withCString { value in
                    let parameters = [
                        OSSL_PARAM_construct_utf8_string(key, UnsafeMutablePointer(mutating: value), 0),
                        OSSL_PARAM_construct_end(),
                    ]
                    return parameters.withUnsafeBufferPointer { body($0.baseAddress!) }
                }
            }
        }
    }
}
