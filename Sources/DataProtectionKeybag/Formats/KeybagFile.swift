import Crypto
import DataProtectionSystem
import Foundation
import SystemPackage

/// One class key as stored in the keybag: wrapped with AES key wrap (RFC 3394).
struct ClassKeyRecord: Sendable, Equatable {
    /// How the record's wrapping key is derived.
    enum WrapType: UInt8, Sendable {
        /// From the device secret alone (class D; A, B, C while no passcode is set).
        case deviceSecret = 1
        /// From the passcode (scrypt) tangled with the device secret.
        case passcodeAndDeviceSecret = 2
    }
    var protectionClass: ProtectionClass
    var wrapType: WrapType
    /// 40 bytes: the 32-byte class key (class B: the X25519 private key) wrapped.
    var wrappedKey: [UInt8]
    /// Class B: the X25519 public key (32 bytes), usable while locked. Others: 32 zero bytes.
    var publicKey: [UInt8]
}

/// What a keybag of a TPM-bound device records about its TPM (FORMAT.md §2, version 2).
struct KeybagTPMFields: Sendable, Equatable {
    /// The persistent handle of the object sealing the passcode secret (0 while no passcode is set).
    var passcodeObject: UInt32
    /// The NV index of the attempt counter (a TPM monotonic counter).
    var counterIndex: UInt32
    /// The NV index (ordinary, 8 bytes) holding the counter's value at the last correct passcode:
    /// the TPM's own copy of ``counterBase``, which no keybag put back can change.
    var baseIndex: UInt32
    /// The counter's value at the last correct passcode: failed attempts = counter − base.
    var counterBase: UInt64
    /// The highest counter value this keybag has recorded; lower than the TPM's = a rollback.
    var counterSeen: UInt64
    /// SHA-256 of `ROOT/device.tpm` (``TPMBindingRecord``), so that file is authenticated too.
    var bindingDigest: [UInt8]
}

/// The keybag file, `ROOT/keybag`: a fixed-size binary record authenticated with
/// HMAC-SHA256 under a key derived from the device secret. Specified in `docs/FORMAT.md`
/// § Keybag; any difference from that layout, or a MAC that does not verify, is rejected.
///
/// Version 2 (written since the TPM binding) appends a generation, the TPM fields and the time
/// of the last rollback detected; version 1 files are read and rewritten as version 2. Version 3
/// is version 2 with a minimum passcode length other than the default (byte 33): it is written
/// only while such a policy is set, so a keybag with the default policy stays readable by the
/// releases that read version 2.
struct KeybagFile: Sendable, Equatable {
    static let fileName = "keybag"
    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x4B, 0x42, 0x0D, 0x0A, 0x1A]   // \x89 D P K B \r \n \x1a
    /// The newest version this build reads and writes.
    static let version: UInt16 = 3
    /// The versions this build reads.
    static let readableVersions: [UInt16] = [1, 2, 3]
    static let recordSize = 76
    static let bodySizeV1 = 88 + 4 * recordSize   // 392
    static let totalSizeV1 = bodySizeV1 + 32   // 424
    static let extensionSize = 80
    static let bodySize = bodySizeV1 + extensionSize   // 472
    static let totalSize = bodySize + 32   // 504
    static let macLabel = "DataProtection v1 keybag MAC"

    var uuid: UUID
    var passcodeSet: Bool
    var eraseAfterTenFailures: Bool
    var kdf: PasscodeKDF
    var salt: [UInt8]
    var failedAttempts: UInt32
    /// Wall-clock time of the last failed attempt, milliseconds since 1970 (0 = none).
    var lastFailureMillis: Int64
    /// Keyed tag of the last wrong passcode, so repeating it does not count again (zeros = none).
    var lastFailedTag: [UInt8]
    var gracePeriodMillis: UInt32
    /// A, B, C, D in that order.
    var records: [ClassKeyRecord]
    /// Incremented on every write: a process that sees it go down knows the file was rolled back.
    var generation: UInt64 = 0
    /// Set when the device secret is sealed by a TPM.
    var tpm: KeybagTPMFields? = nil
    /// When a rollback of this file was last detected (milliseconds since 1970; 0 = never).
    var lastRollbackMillis: Int64 = 0
    /// The shortest passcode a set or change accepts, in characters; 0 = the default
    /// (``PasscodePolicy/defaultMinimumLength``). Anything else makes the file version 3.
    var minimumPasscodeLength: UInt8 = 0

    /// The version this keybag is written as: 2 unless a non-default passcode policy needs 3.
    var writtenVersion: UInt16 { minimumPasscodeLength == 0 ? 2 : 3 }

    func record(_ cls: ProtectionClass) -> ClassKeyRecord { records[Int(cls.rawValue) - 1] }

    /// This keybag with a new scrypt salt and no failed attempts: what a new passcode, or a new
    /// device secret, starts from.
    func withNewSalt(_ salt: [UInt8]) -> KeybagFile {
        var updated = self
        updated.salt = salt
        updated.failedAttempts = 0
        updated.lastFailureMillis = 0
        updated.lastFailedTag = [UInt8](repeating: 0, count: 16)
        return updated
    }

    /// The keybag's ID from the clear header of `ROOT/keybag` (magic, version, size, then the
    /// UUID), without the device secret: to tell which keybag a daemon serves. `nil` when there
    /// is no readable keybag there.
    package static func identifier(atRoot root: String) -> UUID? {
        guard let fd = try? POSIXFile.openRegularFile(root + "/" + fileName) else { return nil }
        defer { try? fd.close() }
        guard let head = try? POSIXFile.read(fd, count: magic.count + 4 + 16, at: 0, path: root),
            head.count == magic.count + 4 + 16,
            Array(head.prefix(magic.count)) == magic
        else { return nil }
        return UUID(bytes: Array(head.suffix(16)))
    }

    func encoded(macKey: SymmetricKey) -> [UInt8] {
        var w = ByteWriter()
        w.raw(Self.magic)
        w.u16(writtenVersion)
        w.u16(UInt16(Self.totalSize))
        w.raw(uuid.bytes)
        w.u8((passcodeSet ? 1 : 0) | (eraseAfterTenFailures ? 2 : 0))
        w.u8(1)   // KDF: scrypt
        w.u8(kdf.logN); w.u8(kdf.r); w.u8(kdf.p)
        w.u8(minimumPasscodeLength)   // version 3; 0 in version 2
        w.zeros(2)
        w.raw(salt)
        w.u32(failedAttempts)
        w.u64(UInt64(bitPattern: lastFailureMillis))
        w.raw(lastFailedTag)
        w.u32(gracePeriodMillis)
        w.zeros(4)
        for record in records {
            w.u8(record.protectionClass.rawValue)
            w.u8(record.wrapType.rawValue)
            w.zeros(2)
            w.raw(record.wrappedKey)
            w.raw(record.publicKey)
        }
        w.u64(generation)
        w.u8(tpm == nil ? 0 : 1)
        w.zeros(3)
        w.u32(tpm?.passcodeObject ?? 0)
        w.u32(tpm?.counterIndex ?? 0)
        w.u32(tpm?.baseIndex ?? 0)
        w.u64(tpm?.counterBase ?? 0)
        w.u64(tpm?.counterSeen ?? 0)
        w.u64(UInt64(bitPattern: lastRollbackMillis))
        w.raw(tpm?.bindingDigest ?? [UInt8](repeating: 0, count: 32))
        let mac = HMAC<SHA256>.authenticationCode(for: w.bytes, using: macKey)
        w.raw(Array(mac))
        return w.bytes
    }

    /// Parses and authenticates a keybag. Never traps; every defect is a `corruptKeybag` error, a newer version
    /// `newerKeybagFormat`.
    static func decode(_ bytes: [UInt8], macKey: SymmetricKey) throws -> KeybagFile {
        func reject(_ why: String) -> KeybagError { .corruptKeybag(why) }
        // The MAC first (FORMAT.md §2): no field is read from unauthenticated bytes. Only the
        // file's size is needed to find it (each version has its own size).
        // Unauthenticated bytes choose only the wording of the error, never what is trusted: a
        // version above ours is a claim, named as one (a newer DataProtection, or a modification).
        let claimedVersion: UInt16? =
            bytes.count >= 10 && Array(bytes[0..<8]) == magic ? UInt16(bytes[8]) << 8 | UInt16(bytes[9]) : nil
        let newerClaim = claimedVersion.flatMap { $0 > Self.version ? $0 : nil }
        guard bytes.count == totalSize || bytes.count == totalSizeV1 else {
            if let newerClaim {
                throw KeybagError.newerKeybagFormat(version: newerClaim, readable: Self.readableVersions)
            }
            if claimedVersion == 0 { throw reject("keybag format version 0 is not a version") }
            throw reject(
                "wrong length (\(bytes.count) bytes, expected \(totalSize)): truncated, extended, or not a keybag")
        }
        let bodySize = bytes.count - 32
        guard
            HMAC<SHA256>.isValidAuthenticationCode(
                Array(bytes[bodySize...]), authenticating: bytes[0..<bodySize], using: macKey)
        else {
            if let newerClaim {
                throw reject(
                    "authentication failed: the keybag was modified, or belongs to another device secret, or a newer "
                        + "DataProtection wrote it (it claims format version \(newerClaim); this one reads versions 1 to \(Self.version))"
                )
            }
            throw reject("authentication failed: the keybag was modified, or belongs to another device secret")
        }
        guard Array(bytes[0..<8]) == magic else { throw reject("not a DataProtection keybag (bad magic)") }
        var r = ByteReader(bytes)
        do {
            _ = try r.raw(8, "magic")
            let version = try r.u16("version")
            guard Self.readableVersions.contains(version) else {
                throw reject(
                    "keybag format version \(version) is not supported (this build reads versions 1 to \(Self.version))"
                )
            }
            let expectedSize = version == 1 ? totalSizeV1 : totalSize
            let length = try r.u16("length")
            guard Int(length) == expectedSize, bytes.count == expectedSize else {
                throw reject(
                    "length field \(length) and size \(bytes.count), expected \(expectedSize) for version \(version)")
            }
            let uuid = UUID(bytes: try r.raw(16, "uuid"))
            let flags = try r.u8("flags")
            guard flags & ~3 == 0 else { throw reject("unknown flags \(flags)") }
            guard try r.u8("kdf") == 1 else { throw reject("unknown KDF") }
            let kdf = PasscodeKDF(logN: try r.u8("logN"), r: try r.u8("r"), p: try r.u8("p"))
            guard kdf.isPlausible else { throw reject("implausible KDF parameters \(kdf)") }
            let minimumLength = try r.u8("minimum passcode length")
            if version == 3 {
                guard PasscodePolicy.minimumLengthRange.contains(Int(minimumLength)),
                    Int(minimumLength) != PasscodePolicy.defaultMinimumLength
                else {
                    throw reject(
                        "minimum passcode length \(minimumLength) is outside \(PasscodePolicy.minimumLengthRange) or the default"
                    )
                }
            } else if minimumLength != 0 {
                throw reject("reserved bytes not zero")
            }
            guard try r.raw(2, "reserved") == [0, 0] else { throw reject("reserved bytes not zero") }
            let salt = try r.raw(16, "salt")
            let failed = try r.u32("failed attempts")
            let lastFailure = Int64(bitPattern: try r.u64("last failure"))
            let tag = try r.raw(16, "last failed tag")
            let grace = try r.u32("grace")
            guard try r.raw(4, "reserved") == [0, 0, 0, 0] else { throw reject("reserved bytes not zero") }
            var records: [ClassKeyRecord] = []
            for cls in ProtectionClass.allCases {
                guard try r.u8("class") == cls.rawValue else { throw reject("class records out of order") }
                guard let wrap = ClassKeyRecord.WrapType(rawValue: try r.u8("wrap type")) else {
                    throw reject("unknown wrap type")
                }
                guard try r.raw(2, "reserved") == [0, 0] else { throw reject("reserved bytes not zero") }
                let wrapped = try r.raw(40, "wrapped key")
                let pub = try r.raw(32, "public key")
                records.append(
                    ClassKeyRecord(protectionClass: cls, wrapType: wrap, wrappedKey: wrapped, publicKey: pub))
            }
            let passcodeSet = flags & 1 != 0
            guard records[3].wrapType == .deviceSecret,
                records[0..<3].allSatisfy({ $0.wrapType == (passcodeSet ? .passcodeAndDeviceSecret : .deviceSecret) })
            else { throw reject("class records disagree with the passcode flag") }
            var file = KeybagFile(
                uuid: uuid, passcodeSet: passcodeSet, eraseAfterTenFailures: flags & 2 != 0, kdf: kdf,
                salt: salt, failedAttempts: failed, lastFailureMillis: lastFailure, lastFailedTag: tag,
                gracePeriodMillis: grace, records: records)
            file.minimumPasscodeLength = minimumLength
            guard version >= 2 else { return file }
            file.generation = try r.u64("generation")
            let storage = try r.u8("secret storage")
            guard storage <= 1 else { throw reject("unknown device-secret storage \(storage)") }
            guard try r.raw(3, "reserved") == [0, 0, 0] else { throw reject("reserved bytes not zero") }
            let passcodeObject = try r.u32("passcode object")
            let counterIndex = try r.u32("counter index")
            let baseIndex = try r.u32("base index")
            let base = try r.u64("counter base")
            let seen = try r.u64("counter seen")
            file.lastRollbackMillis = Int64(bitPattern: try r.u64("last rollback"))
            let digest = try r.raw(32, "binding digest")
            if storage == 1 {
                guard passcodeSet == (passcodeObject != 0), counterIndex != 0, baseIndex != 0, base <= seen else {
                    throw reject("TPM fields disagree with the passcode flag")
                }
                file.tpm = KeybagTPMFields(
                    passcodeObject: passcodeObject, counterIndex: counterIndex, baseIndex: baseIndex, counterBase: base,
                    counterSeen: seen, bindingDigest: digest)
            } else {
                guard passcodeObject == 0, counterIndex == 0, baseIndex == 0, base == 0, seen == 0,
                    digest.allSatisfy({ $0 == 0 })
                else {
                    throw reject("TPM fields set in a keybag whose device secret is a file")
                }
            }
            return file
        } catch let error as ByteReader.OutOfBounds {
            throw reject("truncated at \(error.field)")
        }
    }
}
