import Crypto
import DataProtectionSystem
import Foundation
import SystemPackage

/// The device secret: 256 random bits, the software stand-in for the hardware UID that iOS
/// tangles into every class key. It is kept either in `ROOT/device.secret` (mode 0600), or
/// sealed by the TPM (`ROOT/device.tpm` then says where; see ``TPMBindingRecord``).
///
/// It never leaves this type: callers get keys derived from it with HKDF-SHA256, one label
/// per purpose (see `docs/FORMAT.md` § Key derivation). Without it a copied keybag is
/// useless; destroying it (crypto-erase) makes every protected file of the root unrecoverable.
struct DeviceSecret: Sendable {
    static let fileName = "device.secret"
    static let byteCount = 32

    private let key: SymmetricKey

    init(key: SymmetricKey) { self.key = key }

    /// A new random secret, not yet stored anywhere.
    static func generate() -> DeviceSecret { DeviceSecret(key: SymmetricKey(size: .bits256)) }

    /// Seals this secret in a new persistent object of the TPM.
    func seal(in tpm: TPMDevice, pcrs: TPMPCRSelection?) throws -> TPMBindingRecord {
        var bytes = key.withUnsafeBytes { Array($0) }
        defer { bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } } }
        return try tpm.sealDeviceSecret(bytes, pcrs: pcrs)
    }

    /// Unseals the secret the TPM keeps for `record`.
    static func unseal(_ record: TPMBindingRecord, from tpm: TPMDevice) throws -> DeviceSecret {
        let bytes = try tpm.unsealDeviceSecret(record)
        guard bytes.count == byteCount else {
            throw KeybagError.badDeviceSecret(
                "the TPM object 0x\(String(record.deviceObject, radix: 16)) holds \(bytes.count) bytes, not \(byteCount)"
            )
        }
        return bytes.withUnsafeBytes { DeviceSecret(key: SymmetricKey(data: $0)) }
    }

    /// Creates a new secret file (refusing to overwrite one) with mode 0600.
    static func create(in root: String) throws -> DeviceSecret {
        try generate().store(in: root)
    }

    /// Writes this secret to a new file `ROOT/device.secret` (refusing to overwrite one), mode 0600.
    @discardableResult
    func store(in root: String) throws -> DeviceSecret {
        let path = root + "/" + Self.fileName
        var bytes = key.withUnsafeBytes { Array($0) }
        defer { bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } } }
        try POSIXFile.writeNew(path, bytes)
        return self
    }

    /// Loads the secret, refusing a file of the wrong size or one readable by others.
    static func load(from root: String) throws -> DeviceSecret {
        let path = root + "/" + fileName
        var st = stat()
        guard stat(path, &st) == 0 else {
            throw KeybagError.badDeviceSecret("\(path) is missing (the keybag cannot be opened without it)")
        }
        guard st.st_mode & 0o077 == 0 else {
            throw KeybagError.badDeviceSecret(
                "\(path) is accessible by other users (mode \(String(st.st_mode & 0o777, radix: 8))); it must be 0600")
        }
        let bytes = try POSIXFile.readAll(path)
        guard bytes.count == byteCount else {
            throw KeybagError.badDeviceSecret("\(path) holds \(bytes.count) bytes, not \(byteCount)")
        }
        return DeviceSecret(key: SymmetricKey(data: bytes))
    }

    /// Overwrites the secret with random bytes, flushes, and removes the file.
    static func destroy(in root: String) {
        let path = root + "/" + fileName
        if let fd = try? POSIXFile.open(path, .writeOnly) {
            let noise = (0..<byteCount).map { _ in UInt8.random(in: 0...255) }
            try? POSIXFile.write(fd, noise, at: 0, path: path)
            try? POSIXFile.sync(fd, path: path)
            try? fd.close()
        }
        unlink(path)
    }

    /// A key for one purpose, `HKDF-SHA256(ikm: secret, salt: salt, info: label)`.
    func derive(_ label: String, salt: [UInt8] = []) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: key, salt: salt, info: Array(label.utf8), outputByteCount: 32)
    }

    /// ``derive(_:salt:)`` with a salt read in place (a stretched passcode: no array copy).
    func derive(_ label: String, salt: UnsafeRawBufferPointer) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: key, salt: salt, info: Array(label.utf8), outputByteCount: 32)
    }
}
