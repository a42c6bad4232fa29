import COpenSSLCrypto
import Crypto
import Foundation
import Synchronization

/// AES-256-GCM through the system's libcrypto, keyed once per file key: the key schedule is
/// computed once, into a template context, and each thread sealing or opening segments takes a
/// copy of it from a pool — per segment only the nonce is set (as gocryptfs does with OpenSSL,
/// for the same reason: a one-shot AEAD call expands the key for every 4 KiB). The wire format
/// is the same AES-256-GCM as swift-crypto's (`nonce ‖ ciphertext ‖ tag`, FORMAT.md §3).
/// `@unchecked Sendable`: `template` never changes; context pairs move through `pool` (a `Mutex`), each used by one
/// thread at a time.
final class GCMContexts: @unchecked Sendable {
    /// A context pair is used by one thread at a time (taken from the pool, put back after).
    /// `@unchecked Sendable`: a pair is used by one thread at a time (taken from the pool, put back after).
    private struct Pair: @unchecked Sendable { let encrypt: OpaquePointer, decrypt: OpaquePointer }
    private let template: Pair?
    private let pool = Mutex<[Pair]>([])
    /// Contexts kept for reuse (one per thread that used them at once, at most).
    private static let poolLimit = 16

    nonisolated(unsafe) private static let aes256GCM = EVP_CIPHER_fetch(nil, "AES-256-GCM", nil)

    init(key: SymmetricKey) {
        template = key.withUnsafeBytes { bytes -> Pair? in
            guard let cipher = Self.aes256GCM, bytes.count == 32,
                let encrypt = EVP_CIPHER_CTX_new(), let decrypt = EVP_CIPHER_CTX_new()
            else { return nil }
            let key = bytes.baseAddress!.assumingMemoryBound(to: UInt8.self)
            guard EVP_EncryptInit_ex2(encrypt, cipher, key, nil, nil) == 1,
                EVP_DecryptInit_ex2(decrypt, cipher, key, nil, nil) == 1
            else {
                EVP_CIPHER_CTX_free(encrypt)
                EVP_CIPHER_CTX_free(decrypt)
                return nil
            }
            return Pair(encrypt: encrypt, decrypt: decrypt)
        }
    }

    deinit {
        for pair in pool.withLock({ $0 }) + (template.map { [$0] } ?? []) {
            EVP_CIPHER_CTX_free(pair.encrypt)
            EVP_CIPHER_CTX_free(pair.decrypt)
        }
    }

    /// Runs `body` with a keyed pair of contexts of this thread's own.
    private func withContexts<R>(_ body: (Pair) throws -> R) throws -> R {
        guard let template else {
            throw ProtectedFileError.damaged(
                path: "", reason: "libcrypto has no AES-256-GCM (its default provider is not loaded)")
        }
        var pair = pool.withLock { $0.popLast() }
        if pair == nil {
            guard let encrypt = EVP_CIPHER_CTX_new(), let decrypt = EVP_CIPHER_CTX_new(),
                EVP_CIPHER_CTX_copy(encrypt, template.encrypt) == 1, EVP_CIPHER_CTX_copy(decrypt, template.decrypt) == 1
            else {
                throw ProtectedFileError.damaged(path: "", reason: "libcrypto could not copy a cipher context")
            }
            pair = Pair(encrypt: encrypt, decrypt: decrypt)
        }
        defer {
            let kept = pool.withLock { pool -> Bool in
                guard pool.count < Self.poolLimit else { return false }
                pool.append(pair!)
                return true
            }
            if !kept { EVP_CIPHER_CTX_free(pair!.encrypt); EVP_CIPHER_CTX_free(pair!.decrypt) }
        }
        return try body(pair!)
    }

    /// Seals `plaintext` with `nonce` (12 bytes) and `aad` into `output`, which must hold exactly
    /// `12 + plaintext.count + 16` bytes: nonce, ciphertext, tag.
    func seal(
        _ plaintext: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws {
        precondition(nonce.count == 12 && output.count == 12 + plaintext.count + 16)
        try withContexts { pair in
            let out = output.baseAddress!.assumingMemoryBound(to: UInt8.self)
            out.update(from: nonce.baseAddress!.assumingMemoryBound(to: UInt8.self), count: 12)
            var length: Int32 = 0
            guard EVP_EncryptInit_ex2(pair.encrypt, nil, nil, out, nil) == 1,
                EVP_EncryptUpdate(
                    pair.encrypt, nil, &length, aad.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(aad.count))
                    == 1,
                plaintext.isEmpty
                    || EVP_EncryptUpdate(
                        pair.encrypt, out + 12, &length, plaintext.baseAddress!.assumingMemoryBound(to: UInt8.self),
                        Int32(plaintext.count)) == 1,
                EVP_EncryptFinal_ex(pair.encrypt, out + 12 + plaintext.count, &length) == 1,
                EVP_CIPHER_CTX_ctrl(pair.encrypt, EVP_CTRL_AEAD_GET_TAG, 16, out + 12 + plaintext.count) == 1
            else {
                throw ProtectedFileError.damaged(path: "", reason: "libcrypto could not seal a segment")
            }
        }
    }

    /// Opens `sealed` (nonce, ciphertext, tag) into `output` (its plaintext's length); `false`
    /// when it does not authenticate with `aad`.
    func open(
        _ sealed: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer
    ) -> Bool {
        guard sealed.count >= 28, output.count == sealed.count - 28 else { return false }
        return
            (try? withContexts { pair -> Bool in
                let input = sealed.baseAddress!.assumingMemoryBound(to: UInt8.self)
                let textLength = sealed.count - 28
                var length: Int32 = 0
                // The tag is read where it lies (OpenSSL copies it; the pointer is only not const in
                // its signature), and GCM's final step writes nothing: no buffer per segment.
                let tag = UnsafeMutableRawPointer(mutating: input + 12 + textLength)
                guard EVP_DecryptInit_ex2(pair.decrypt, nil, nil, input, nil) == 1,
                    EVP_DecryptUpdate(
                        pair.decrypt, nil, &length, aad.baseAddress!.assumingMemoryBound(to: UInt8.self),
                        Int32(aad.count)) == 1,
                    textLength == 0
                        || EVP_DecryptUpdate(
                            pair.decrypt, output.baseAddress!.assumingMemoryBound(to: UInt8.self), &length, input + 12,
                            Int32(textLength)) == 1,
                    EVP_CIPHER_CTX_ctrl(pair.decrypt, EVP_CTRL_AEAD_SET_TAG, 16, tag) == 1
                else { return false }
                return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 16) {
                    EVP_DecryptFinal_ex(pair.decrypt, $0.baseAddress, &length) == 1
                }
            }) ?? false
    }
}
