import Crypto
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: file keys.
extension EmbeddedKeybag {
    // MARK: - File keys

    /// The current key generation of `protectionClass`, or an error when it is unavailable.
    /// The generation grows each time the class key is discarded, so a handle that cached a
    /// file key under an older generation knows it must not use it any more.
    package func generation(of protectionClass: ProtectionClass) throws -> Int {
        try requireAvailable(protectionClass)
        return generations[protectionClass, default: 0]
    }

    /// Creates a random 256-bit file key and wraps it under `protectionClass`.
    /// Class B needs only the class public key, so it works while locked.
    package func wrapNewFileKey(
        for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false
    ) throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
        let key = SymmetricKey(size: .bits256)
        return (key, try wrap(key, for: protectionClass, thisDeviceOnly: thisDeviceOnly))
    }

    var deviceBinding: DeviceBinding {
        DeviceBinding(salt: secret.derive(DeviceBinding.saltLabel).withUnsafeBytes { Array($0) })
    }

    /// Unwraps a file key; throws ``KeybagError/classUnavailable(_:_:)`` when its class is
    /// unavailable now, ``KeybagError/foreignKeybag(expected:found:)`` or
    /// ``KeybagError/keyUnwrapFailed(_:)`` when it is not this keybag's.
    package func unwrapFileKey(_ wrapped: WrappedFileKey) throws -> SymmetricKey {
        guard wrapped.keybagID == id else { throw KeybagError.foreignKeybag(expected: id, found: wrapped.keybagID) }
        try requireAvailable(wrapped.protectionClass)
        do {
            if wrapped.protectionClass == .completeUnlessOpen {
                guard let ephemeralBytes = wrapped.ephemeralPublicKey, let bPrivate = classBPrivateKey else {
                    throw KeybagError.keyUnwrapFailed(.completeUnlessOpen)
                }
                return try ClassBKeyAgreement.unwrap(
                    wrapped.wrappedKey, ephemeralPublic: ephemeralBytes, classPrivate: bPrivate,
                    binding: wrapped.thisDeviceOnly ? deviceBinding : nil)
            }
            guard let classKey = classKeys[wrapped.protectionClass] else {
                throw KeybagError.keyUnwrapFailed(wrapped.protectionClass)
            }
            return try AES.KeyWrap.unwrap(
                wrapped.wrappedKey, using: wrapped.thisDeviceOnly ? deviceBinding.bind(classKey) : classKey)
        } catch let error as KeybagError {
            throw error
        } catch {
            throw KeybagError.keyUnwrapFailed(wrapped.protectionClass)
        }
    }

    /// ``unwrapFileKey(_:)`` and the generation of the key's class in one call (one round trip
    /// through keybagd when a handle opens).
    package func unwrapFileKeyWithGeneration(_ wrapped: WrappedFileKey) throws -> (key: SymmetricKey, generation: Int) {
        let key = try unwrapFileKey(wrapped)
        return (key, generations[wrapped.protectionClass, default: 0])
    }

    /// Rewraps a file key under another class (its content is not touched). Needs the old
    /// class available and the new one creatable.
    package func rewrapFileKey(_ wrapped: WrappedFileKey, to protectionClass: ProtectionClass) throws -> WrappedFileKey
    {
        try wrap(try unwrapFileKey(wrapped), for: protectionClass, thisDeviceOnly: wrapped.thisDeviceOnly)
    }

    /// Wraps an existing file key under `protectionClass` (and this device's secret when
    /// `thisDeviceOnly`).
    package func wrap(
        _ key: SymmetricKey, for protectionClass: ProtectionClass, thisDeviceOnly: Bool = false
    ) throws -> WrappedFileKey {
        try requireNotErased()
        let binding = thisDeviceOnly ? deviceBinding : nil
        if protectionClass == .completeUnlessOpen {
            let (wrapped, ephemeralPublic) = try ClassBKeyAgreement.wrap(key, to: classBPublicKey, binding: binding)
            return WrappedFileKey(
                protectionClass: .completeUnlessOpen, keybagID: id, wrappedKey: wrapped,
                ephemeralPublicKey: ephemeralPublic,
                thisDeviceOnly: thisDeviceOnly)
        }
        try requireAvailable(protectionClass)
        guard let classKey = classKeys[protectionClass] else {
            throw KeybagError.classUnavailable(protectionClass, state)
        }
        let kek = binding?.bind(classKey) ?? classKey
        return WrappedFileKey(
            protectionClass: protectionClass, keybagID: id,
            wrappedKey: Array(try AES.KeyWrap.wrap(key, using: kek)), ephemeralPublicKey: nil,
            thisDeviceOnly: thisDeviceOnly)
    }
}
