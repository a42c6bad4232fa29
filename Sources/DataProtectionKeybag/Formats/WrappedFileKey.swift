import Foundation

/// A per-file key wrapped under a class key, as stored in a protected file's header.
///
/// Only a ``Keybag`` can unwrap it, and only while its class is available. For class B
/// it carries the ephemeral X25519 public key of the one-pass key agreement (NIST SP 800-56A
/// C(1e, 1s)), as iOS stores it beside the wrapped key.
public struct WrappedFileKey: Sendable, Hashable {
    /// The class the key is wrapped under.
    public var protectionClass: ProtectionClass
    /// The keybag that wrapped it.
    public var keybagID: UUID
    /// The AES-key-wrapped (RFC 3394) 256-bit file key: 40 bytes.
    public var wrappedKey: [UInt8]
    /// Class B only: the ephemeral X25519 public key (32 bytes).
    public var ephemeralPublicKey: [UInt8]?
    /// Bound to this device's secret as well as to its class key — like the keychain's
    /// `…ThisDeviceOnly` classes: a backup keybag cannot unwrap it on another device.
    public var thisDeviceOnly: Bool

    public init(
        protectionClass: ProtectionClass, keybagID: UUID, wrappedKey: [UInt8], ephemeralPublicKey: [UInt8]?,
        thisDeviceOnly: Bool = false
    ) {
        self.protectionClass = protectionClass
        self.keybagID = keybagID
        self.wrappedKey = wrappedKey
        self.ephemeralPublicKey = ephemeralPublicKey
        self.thisDeviceOnly = thisDeviceOnly
    }
}
