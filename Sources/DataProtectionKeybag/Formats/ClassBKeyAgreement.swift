import Crypto
import Foundation

/// Class B's file-key wrapping: a one-pass X25519 agreement between a fresh ephemeral key and
/// the class's static key (NIST SP 800-56A C(1e, 1s)), as iOS does for
/// `NSFileProtectionCompleteUnlessOpen`. Wrapping needs only the class *public* key, so it
/// works while the device is locked; unwrapping needs the private key, which only an unlock gives.
///
/// KEK = HKDF-SHA256(ikm: X25519(e, B), salt: ephemeral public ‖ class public,
/// info: "DataProtection v1 class B file key wrap"); the file key is AES-key-wrapped under it.
/// (Apple uses the SP 800-56A concatenation KDF; HKDF is swift-crypto's and equally sound.)
enum ClassBKeyAgreement {
    static let label = "DataProtection v1 class B file key wrap"

    static func wrappingKey(
        shared: SharedSecret, ephemeralPublic: [UInt8], classPublic: Curve25519.KeyAgreement.PublicKey,
        binding: DeviceBinding?
    ) -> SymmetricKey {
        let kek = shared.hkdfDerivedSymmetricKey(
            using: SHA256.self, salt: ephemeralPublic + Array(classPublic.rawRepresentation),
            sharedInfo: Array(label.utf8), outputByteCount: 32)
        return binding?.bind(kek) ?? kek
    }

    /// Wraps `fileKey` to the class public key; returns the wrapped key and the ephemeral public key.
    static func wrap(
        _ fileKey: SymmetricKey, to classPublic: Curve25519.KeyAgreement.PublicKey,
        ephemeral: Curve25519.KeyAgreement.PrivateKey = .init(), binding: DeviceBinding? = nil
    ) throws -> (wrapped: [UInt8], ephemeralPublic: [UInt8]) {
        let ephemeralPublic = Array(ephemeral.publicKey.rawRepresentation)
        let kek = wrappingKey(
            shared: try ephemeral.sharedSecretFromKeyAgreement(with: classPublic),
            ephemeralPublic: ephemeralPublic, classPublic: classPublic, binding: binding)
        return (Array(try AES.KeyWrap.wrap(fileKey, using: kek)), ephemeralPublic)
    }

    /// Unwraps with the class private key.
    static func unwrap(
        _ wrapped: [UInt8], ephemeralPublic: [UInt8], classPrivate: Curve25519.KeyAgreement.PrivateKey,
        binding: DeviceBinding? = nil
    ) throws -> SymmetricKey {
        let ephemeral = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: ephemeralPublic)
        let kek = wrappingKey(
            shared: try classPrivate.sharedSecretFromKeyAgreement(with: ephemeral),
            ephemeralPublic: ephemeralPublic, classPublic: classPrivate.publicKey, binding: binding)
        return try AES.KeyWrap.unwrap(wrapped, using: kek)
    }
}

/// Ties a wrapping key to the device secret for "this device only" file keys:
/// `HKDF(ikm: KEK, salt: HKDF(S, "", "DataProtection v1 this device only"),`
/// `info: "DataProtection v1 this device only KEK")`.
/// Without the device secret — on another device, from a backup keybag — it cannot be rebuilt.
struct DeviceBinding: Sendable {
    static let saltLabel = "DataProtection v1 this device only"
    static let infoLabel = "DataProtection v1 this device only KEK"
    let salt: [UInt8]

    func bind(_ kek: SymmetricKey) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: kek, salt: salt, info: Array(Self.infoLabel.utf8), outputByteCount: 32)
    }
}
