import Crypto
import Foundation

/// How a device's secret is bound to a TPM 2.0
/// (``Keybag/create(root:passcode:kdf:gracePeriod:eraseAfterTenFailures:tpm:clock:)``,
/// ``Keybag/enrollTPM(passcode:_:)``).
///
/// The TPM then holds the device secret (sealed, no authorization: class D and the keybag's
/// integrity work before the first unlock) and a second secret that it releases only for an
/// authorization value derived from the passcode, so the TPM checks every passcode attempt and
/// counts each wrong one in its dictionary-attack protection. Failed attempts are also counted
/// by a TPM monotonic counter, which no file copied back can lower. FORMAT.md §2c has the layout.
public struct TPMBinding: Sendable, Equatable {
    /// PCRs of the SHA-256 bank the objects are bound to (systemd-cryptenroll's `--tpm2-pcrs`),
    /// or `nil` for none. With PCRs the device opens only while they hold the values they had at
    /// enrollment: a firmware, boot loader or Secure Boot change then makes the device unopenable.
    public var pcrs: TPMPCRSelection?
    /// The TCTI that reaches the TPM (``defaultTCTI`` unless given).
    public var tcti: String

    public init(pcrs: TPMPCRSelection? = nil, tcti: String? = nil) {
        self.pcrs = pcrs
        self.tcti = tcti ?? Self.defaultTCTI
    }

    /// The environment variable naming the TCTI, as `TPM2TOOLS_TCTI` does for tpm2-tools.
    public static let tctiEnvironmentVariable = "DATAPROTECTION_TPM_TCTI"

    /// `$DATAPROTECTION_TPM_TCTI`, or the kernel's resource manager `device:/dev/tpmrm0`.
    public static var defaultTCTI: String {
        ProcessInfo.processInfo.environment[tctiEnvironmentVariable].flatMap { $0.isEmpty ? nil : $0 }
            ?? "device:/dev/tpmrm0"
    }

    /// Why TPM operations cannot run in this process (the TPM Software Stack's libraries, loaded
    /// at run time, are missing), or `nil` when they can. Everything but the TPM works without them.
    public static var unsupportedReason: String? {
        TPMSoftwareStack.unavailableReason.map {
            "the TPM Software Stack is not installed (\($0)); install Debian's \(TPMSoftwareStack.debianPackages.joined(separator: ", "))"
        }
    }

    /// Whether a TPM answers on `tcti` (it is opened and asked for its lockout state).
    public static func isAvailable(tcti: String = defaultTCTI) -> Bool {
        (try? TPMDevice(tcti: tcti).lockoutState()) != nil
    }
}

/// This library's use of a TPM: sealing the device and passcode secrets in persistent objects,
/// the attempt counter, the lockout state, and removing all of it. One connection per operation.
struct TPMDevice: Sendable {
    let tcti: String

    /// Persistent handles this library picks from (inside the owner's 0x81000000–0x817FFFFF range).
    static let persistentRange: ClosedRange<UInt32> = 0x8100_4000...0x8100_7FFF
    /// NV indices for attempt counters (the owner's 0x01800000–0x01BFFFFF range).
    static let counterRange: ClosedRange<UInt32> = 0x0180_4000...0x0180_7FFF

    func connect() throws -> TPMConnection { try TPMConnection(tcti: tcti) }

    /// Seals `secret` with no authorization (and not subject to lockout: class D must open while
    /// the TPM locks out passcode attempts), bound to `pcrs` if given.
    func sealDeviceSecret(_ secret: [UInt8], pcrs: TPMPCRSelection?) throws -> TPMBindingRecord {
        let tpm = try connect()
        let primary = try tpm.createStoragePrimary()
        defer { tpm.flush(primary) }
        let handle = try freeHandle(tpm, in: Self.persistentRange)
        let policy = try pcrs.map { try tpm.policyDigest(pcrs: $0, authValue: false) }
        try tpm.createPersistentSealedObject(
            parent: primary, secret: secret, authValue: [], policy: policy,
            dictionaryAttackProtected: false, at: handle)
        return TPMBindingRecord(deviceObject: handle, pcrs: pcrs)
    }

    func unsealDeviceSecret(_ record: TPMBindingRecord) throws -> SecretBytes {
        let tpm = try connect()
        let primary = try tpm.createStoragePrimary()
        defer { tpm.flush(primary) }
        return try tpm.unseal(persistent: record.deviceObject, parent: primary, authValue: [], pcrs: record.pcrs)
    }

    /// Seals `secret` under `authValue`, subject to the TPM's dictionary-attack protection.
    func sealPasscodeSecret(_ secret: [UInt8], authValue: [UInt8], pcrs: TPMPCRSelection?) throws -> UInt32 {
        let tpm = try connect()
        let primary = try tpm.createStoragePrimary()
        defer { tpm.flush(primary) }
        let handle = try freeHandle(tpm, in: Self.persistentRange)
        let policy = try pcrs.map { try tpm.policyDigest(pcrs: $0, authValue: true) }
        try tpm.createPersistentSealedObject(
            parent: primary, secret: secret, authValue: authValue, policy: policy,
            dictionaryAttackProtected: true, at: handle)
        return handle
    }

    /// The passcode secret, or `nil` when the TPM rejected `authValue` (and counted it).
    func unsealPasscodeSecret(at handle: UInt32, authValue: [UInt8], pcrs: TPMPCRSelection?) throws -> SecretBytes? {
        let tpm = try connect()
        let primary = try tpm.createStoragePrimary()
        defer { tpm.flush(primary) }
        do {
            return try tpm.unseal(persistent: handle, parent: primary, authValue: authValue, pcrs: pcrs)
        } catch let error as TPMError where error.kind == .authorizationFailed {
            return nil
        }
    }

    /// Defines a new attempt counter and returns its index.
    func defineCounter(authValue: [UInt8]) throws -> UInt32 {
        let tpm = try connect()
        let index = try freeHandle(tpm, in: Self.counterRange)
        try tpm.defineCounter(at: index, authValue: authValue)
        return index
    }

    /// Defines the index that records the counter's value at the last correct passcode.
    func defineBase(authValue: [UInt8], value: UInt64) throws -> UInt32 {
        let tpm = try connect()
        let index = try freeHandle(tpm, in: Self.counterRange)
        try tpm.defineNumber(at: index, authValue: authValue, value: value)
        return index
    }

    func readBase(at index: UInt32, authValue: [UInt8]) throws -> UInt64 {
        try connect().readNumber(at: index, authValue: authValue)
    }

    func writeBase(_ value: UInt64, at index: UInt32, authValue: [UInt8]) throws {
        try connect().writeNumber(value, at: index, authValue: authValue)
    }

    func readCounter(at index: UInt32, authValue: [UInt8]) throws -> UInt64 {
        try connect().readCounter(at: index, authValue: authValue)
    }

    func incrementCounter(at index: UInt32, authValue: [UInt8]) throws {
        try connect().incrementCounter(at: index, authValue: authValue)
    }

    func lockoutState() throws -> TPMLockoutState {
        try connect().dictionaryAttackState()
    }

    /// Evicts the persistent objects and undefines the counter (each one missing already is fine).
    /// Every step is tried; the first failure is thrown after the rest.
    func remove(objects: [UInt32], counter: UInt32?, base: UInt32? = nil) throws {
        let tpm = try connect()
        var firstError: Error?
        for handle in objects where handle != 0 {
            do { try tpm.evict(persistent: handle) } catch { firstError = firstError ?? error }
        }
        for index in [counter, base].compactMap({ $0 }) where index != 0 {
            do { try tpm.undefine(index: index) } catch { firstError = firstError ?? error }
        }
        if let firstError { throw firstError }
    }

    /// A handle of `range` nothing uses, chosen at random (two roots on one TPM must not collide).
    private func freeHandle(_ tpm: TPMConnection, in range: ClosedRange<UInt32>) throws -> UInt32 {
        for _ in 0..<64 {
            let candidate = UInt32.random(in: range)
            if !(try tpm.handlesInUse(from: candidate, count: 1).contains(candidate)) { return candidate }
        }
        throw TPMError(kind: .noSpace, call: "no free handle in 0x\(String(range.lowerBound, radix: 16))…", code: 0)
    }
}
