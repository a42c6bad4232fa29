import Crypto
import DataProtectionSystem
import Foundation

/// A backup keybag: a device's class keys wrapped under a backup password, so that a backup
/// restores on another device (another device secret, another keybag) — iOS's "backup keybag".
///
/// It holds no device secret: whoever has the file and the password has the class keys, which
/// is what a backup must allow. The password goes through scrypt with parameters at least as
/// costly as the passcode's. Specified in `docs/FORMAT.md` § Backup keybag.
///
/// ```swift
/// try await keybag.setBackupPassword("correct horse")        // while unlocked
/// let backup = try BackupKeybag(contentsOf: url)            // on the other machine
/// let keys = try backup.unlock(password: "correct horse")
/// let adopted = try await otherKeybag.adoptFileKey(wrapped, from: keys)
/// ```
public struct BackupKeybag: Sendable, Equatable {
    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x42, 0x4B, 0x0D, 0x0A, 0x1A]   // \x89 D P B K \r \n \x1a
    static let version: UInt16 = 1
    static let recordSize = 41
    static let bodySize = 48 + 4 * recordSize + 32   // 244
    package static let totalSize = bodySize + 32   // 276
    public static let fileName = "backup-keybag"

    /// The keybag whose class keys this holds (file keys name it).
    public var sourceKeybagID: UUID
    var kdf: PasscodeKDF
    var salt: [UInt8]
    /// Per class, the AES-key-wrapped class key (class B: its X25519 private key).
    var wrappedKeys: [ProtectionClass: [UInt8]]
    var classBPublicKey: [UInt8]
    private var bytes: [UInt8]

    /// The file's bytes.
    public var encoded: [UInt8] { bytes }

    /// Parses a backup keybag; the MAC is checked by ``unlock(password:)``.
    public init(bytes: [UInt8]) throws {
        func reject(_ why: String) -> KeybagError { .corruptKeybag("backup keybag: " + why) }
        guard bytes.count >= 12, Array(bytes[0..<8]) == Self.magic else {
            throw reject("not a backup keybag (bad magic)")
        }
        var r = ByteReader(bytes)
        do {
            _ = try r.raw(8, "magic")
            let version = try r.u16("version")
            guard version == Self.version else { throw reject("format version \(version) is not supported") }
            guard try r.u16("length") == UInt16(Self.totalSize), bytes.count == Self.totalSize else {
                throw reject("wrong length")
            }
            sourceKeybagID = UUID(bytes: try r.raw(16, "keybag id"))
            salt = try r.raw(16, "salt")
            kdf = PasscodeKDF(logN: try r.u8("logN"), r: try r.u8("r"), p: try r.u8("p"))
            guard kdf.isPlausible else { throw reject("implausible KDF parameters") }
            guard try r.u8("reserved") == 0 else { throw reject("reserved byte not zero") }
            var keys: [ProtectionClass: [UInt8]] = [:]
            for cls in ProtectionClass.allCases {
                guard try r.u8("class") == cls.rawValue else { throw reject("class records out of order") }
                keys[cls] = try r.raw(40, "wrapped key")
            }
            wrappedKeys = keys
            classBPublicKey = try r.raw(32, "class B public key")
            self.bytes = bytes
        } catch let error as ByteReader.OutOfBounds {
            throw reject("truncated at \(error.field)")
        }
    }

    /// Reads a backup keybag file.
    public init(contentsOf url: URL) throws {
        try self.init(bytes: try POSIXFile.readAll(url.path))
    }

    /// Wraps class keys under `password`.
    init(
        sourceKeybagID: UUID, classKeys: [ProtectionClass: SymmetricKey],
        classBPrivate: Curve25519.KeyAgreement.PrivateKey,
        password: SecretBytes, kdf: PasscodeKDF
    ) throws {
        let salt = SymmetricKey(size: .init(bitCount: 128)).withUnsafeBytes { Array($0) }
        let (kek, macKey) = try Self.keys(password: password, salt: salt, kdf: kdf)
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(Self.version)
        w.u16(UInt16(Self.totalSize))
        w.raw(sourceKeybagID.bytes)
        w.raw(salt)
        w.u8(kdf.logN); w.u8(kdf.r); w.u8(kdf.p); w.u8(0)
        for cls in ProtectionClass.allCases {
            let key = cls == .completeUnlessOpen ? SymmetricKey(data: classBPrivate.rawRepresentation) : classKeys[cls]!
            w.u8(cls.rawValue)
            w.raw(Array(try AES.KeyWrap.wrap(key, using: kek)))
        }
        w.raw(Array(classBPrivate.publicKey.rawRepresentation))
        w.raw(Array(HMAC<SHA256>.authenticationCode(for: w.bytes, using: macKey)))
        try self.init(bytes: w.bytes)
    }

    static func keys(password: String, salt: [UInt8], kdf: PasscodeKDF) throws -> (kek: SymmetricKey, mac: SymmetricKey)
    {
        try keys(password: SecretBytes(utf8: password), salt: salt, kdf: kdf)
    }

    static func keys(
        password: SecretBytes, salt: [UInt8], kdf: PasscodeKDF
    ) throws -> (kek: SymmetricKey, mac: SymmetricKey) {
        let stretched = try kdf.derive(passcode: password, salt: salt)
        return (
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: stretched, info: Array("DataProtection v1 backup keybag KEK".utf8),
                outputByteCount: 32),
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: stretched, info: Array("DataProtection v1 backup keybag MAC".utf8),
                outputByteCount: 32)
        )
    }

    /// Checks the password and unwraps the class keys.
    /// - Throws: ``KeybagError/wrongPasscode(failedAttempts:)`` (with 0 attempts: backup
    ///   passwords are not counted) when the password is wrong or the file was modified.
    public func unlock(password: String) throws -> BackupClassKeys {
        let (kek, macKey) = try Self.keys(password: password, salt: salt, kdf: kdf)
        guard
            HMAC<SHA256>.isValidAuthenticationCode(
                Array(bytes[Self.bodySize...]), authenticating: bytes[0..<Self.bodySize], using: macKey)
        else {
            throw KeybagError.wrongBackupPassword
        }
        var keys: [ProtectionClass: SymmetricKey] = [:]
        for (cls, wrapped) in wrappedKeys { keys[cls] = try AES.KeyWrap.unwrap(wrapped, using: kek) }
        let bPrivate = try keys[.completeUnlessOpen]!.withUnsafeBytes {
            try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: $0)
        }
        guard Array(bPrivate.publicKey.rawRepresentation) == classBPublicKey else {
            throw KeybagError.corruptKeybag("backup keybag: class B key pair does not match")
        }
        keys[.completeUnlessOpen] = nil
        return BackupClassKeys(sourceKeybagID: sourceKeybagID, keys: keys, classBPrivate: bPrivate)
    }
}

/// The class keys of another device, unlocked from a ``BackupKeybag``; hand them to
/// ``Keybag/adoptFileKey(_:from:)`` to rewrap that device's file keys for this one.
public struct BackupClassKeys: Sendable {
    /// The keybag the file keys name.
    public let sourceKeybagID: UUID
    let keys: [ProtectionClass: SymmetricKey]
    let classBPrivate: Curve25519.KeyAgreement.PrivateKey

    /// The key that authenticates the source device's backups (FORMAT.md §5.1), from its class D
    /// key: whoever holds the backup password can check — and make — that device's backups.
    public var backupAuthenticationKey: SymmetricKey {
        BackupAuthenticationKey.derive(classD: keys[.noProtection]!, keybagID: sourceKeybagID)
    }

    /// Unwraps a file key that the source keybag wrapped.
    func unwrap(_ wrapped: WrappedFileKey) throws -> SymmetricKey {
        guard wrapped.keybagID == sourceKeybagID else {
            throw KeybagError.foreignKeybag(expected: sourceKeybagID, found: wrapped.keybagID)
        }
        guard !wrapped.thisDeviceOnly else { throw KeybagError.thisDeviceOnly }
        do {
            if wrapped.protectionClass == .completeUnlessOpen {
                guard let ephemeral = wrapped.ephemeralPublicKey else {
                    throw KeybagError.keyUnwrapFailed(.completeUnlessOpen)
                }
                return try ClassBKeyAgreement.unwrap(
                    wrapped.wrappedKey, ephemeralPublic: ephemeral, classPrivate: classBPrivate)
            }
            return try AES.KeyWrap.unwrap(wrapped.wrappedKey, using: keys[wrapped.protectionClass]!)
        } catch let error as KeybagError {
            throw error
        } catch {
            throw KeybagError.keyUnwrapFailed(wrapped.protectionClass)
        }
    }
}

/// The key a device authenticates its backups with (FORMAT.md §5.1):
/// `HKDF(class D key, salt: keybag UUID, info: "DataProtection v1 backup authentication")`.
///
/// Class D is available in every lock state, so backups taken while locked are authenticated;
/// the device secret wraps it, so only this device — or, on another device, the holder of the
/// backup password (the backup keybag carries class D) — can compute it. The class B public
/// key, which anyone reading a repository sees, is no help.
package enum BackupAuthenticationKey {
    static let label = "DataProtection v1 backup authentication"

    package static func derive(classD: SymmetricKey, keybagID: UUID) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(
            inputKeyMaterial: classD, salt: keybagID.bytes, info: Array(label.utf8), outputByteCount: 32)
    }
}
