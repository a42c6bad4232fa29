import Crypto
import DataProtectionIPC
import DataProtectionSystem
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// keybagd's protocol, version 1 (docs/FORMAT.md §8): length-prefixed binary frames over a
/// Unix stream socket.
///
///     frame    = length u32 (1…65536) | payload
///     request  = version u8 (1) | opcode u8 | body
///     response = version u8 (1) | status u8 (0 ok, 1 error, 2 event) | body
///
/// Integers are big-endian; strings are u16 length + UTF-8; keys are 32 raw bytes. A frame that
/// is too long, too short, of another version or that does not parse closes that connection.
package enum KeybagWire {
    package static let version: UInt8 = 1

    package enum Op: UInt8, Sendable {
        case hello = 1, status = 2, unlock = 3, lock = 4, isAvailable = 5, canCreate = 6, generation = 7
        case wrapNewFileKey = 8, unwrapFileKey = 9, rewrapFileKey = 10, wrap = 11, subscribe = 12
        case lockState = 13, isProtectedDataAvailable = 14, gracePeriod = 15, setGracePeriod = 16
        case setPasscode = 17, changePasscode = 18, removePasscode = 19, setBackupPassword = 20
        case erase = 21, setEraseAfterTenFailures = 22
        /// Tests only: moves a daemon started with `--manual-clock` forward.
        case advanceClock = 23
        case backupAuthenticationKey = 24
        case setMinimumPasscodeLength = 25
    }

    package enum Status: UInt8, Sendable { case ok = 0, error = 1, event = 2 }

    /// Events pushed to subscribers.
    package enum Event: Sendable, Equatable {
        case protectedData(ProtectedDataEvent)
        case discarded(ProtectionClass)
    }

    /// A protocol error closes that connection (the IPC layer's error).
    package typealias ProtocolError = IPCError

    // MARK: - Frames (the IPC layer's framing)

    package static var maxFrame: Int { IPCFrame.maxLength }

    /// Writes one frame; `EPIPE` and friends come back as errors (SIGPIPE must be ignored).
    package static func writeFrame(_ fd: Int32, _ payload: [UInt8]) throws { try IPCFrame.write(fd, payload) }

    /// Reads one frame; `nil` at a clean end of stream.
    package static func readFrame(_ fd: Int32) throws -> [UInt8]? { try IPCFrame.read(fd) }

    // MARK: - Fields

    package static func string(_ w: inout ByteWriter, _ s: String) {
        let bytes = Array(s.utf8.prefix(4096))
        w.u16(UInt16(bytes.count))
        w.raw(bytes)
    }

    package static func string(_ r: inout ByteReader, _ field: String) throws -> String {
        let n = Int(try r.u16(field))
        guard let s = String(bytes: try r.raw(n, field), encoding: .utf8) else {
            throw ProtocolError("\(field) is not UTF-8")
        }
        return s
    }

    /// A string field that carries a secret (a passcode): read into ``SecretBytes``, never into
    /// a `String` or an `Array`.
    package static func secretString(_ r: inout ByteReader, _ field: String) throws -> SecretBytes {
        let n = Int(try r.u16(field))
        let secret = try r.secret(n, field)
        guard secret.isUTF8 else { throw ProtocolError("\(field) is not UTF-8") }
        return secret
    }

    /// Writes a secret string field from ``SecretBytes`` (the writer is wiped by its owner).
    package static func secretString(_ w: inout ByteWriter, _ secret: SecretBytes) {
        secret.withUnsafeBytes { bytes in
            let count = min(bytes.count, 4096)
            w.u16(UInt16(count))
            w.raw(bytes.prefix(count))
        }
    }

    /// Sends a frame whose first 4 bytes were left for its length: one buffer, no copy of the
    /// payload — responses carrying keys are wiped right after.
    package static func sendFramed(_ fd: Int32, _ writer: inout ByteWriter) throws {
        writer.patchU32(UInt32(writer.bytes.count - 4), at: 0)
        try IPCFrame.sendAll(fd, writer.bytes)
    }

    package static func protectionClass(_ r: inout ByteReader) throws -> ProtectionClass {
        guard let c = ProtectionClass(rawValue: try r.u8("class")) else { throw ProtocolError("unknown class") }
        return c
    }

    package static func key(_ w: inout ByteWriter, _ key: SymmetricKey) { key.withUnsafeBytes { w.raw($0) } }

    package static func key(_ r: inout ByteReader) throws -> SymmetricKey { SymmetricKey(data: try r.raw(32, "key")) }

    package static func uuid(_ w: inout ByteWriter, _ id: UUID) { w.raw(id.bytes) }

    package static func uuid(_ r: inout ByteReader) throws -> UUID { UUID(bytes: try r.raw(16, "uuid")) }

    package static func double(_ w: inout ByteWriter, _ d: Double) { w.u64(d.bitPattern) }

    package static func double(_ r: inout ByteReader, _ field: String) throws -> Double {
        Double(bitPattern: try r.u64(field))
    }

    static let lockStates: [LockState] = [.beforeFirstUnlock, .locked, .unlocked]

    package static func lockState(_ w: inout ByteWriter, _ s: LockState) { w.u8(UInt8(lockStates.firstIndex(of: s)!)) }

    package static func lockState(_ r: inout ByteReader) throws -> LockState {
        let i = Int(try r.u8("lock state"))
        guard i < lockStates.count else { throw ProtocolError("unknown lock state") }
        return lockStates[i]
    }

    package static func wrapped(_ w: inout ByteWriter, _ k: WrappedFileKey) {
        w.u8(k.protectionClass.rawValue)
        w.u8(k.thisDeviceOnly ? 1 : 0)
        uuid(&w, k.keybagID)
        w.u16(UInt16(k.wrappedKey.count))
        w.raw(k.wrappedKey)
        w.u16(UInt16(k.ephemeralPublicKey?.count ?? 0))
        w.raw(k.ephemeralPublicKey ?? [])
    }

    package static func wrapped(_ r: inout ByteReader) throws -> WrappedFileKey {
        let cls = try protectionClass(&r)
        let flags = try r.u8("flags")
        let id = try uuid(&r)
        let wrappedKey = try r.raw(Int(try r.u16("wrapped key length")), "wrapped key")
        let ephemeralCount = Int(try r.u16("ephemeral key length"))
        let ephemeral = ephemeralCount == 0 ? nil : try r.raw(ephemeralCount, "ephemeral key")
        guard wrappedKey.count <= 256, flags <= 1 else { throw ProtocolError("bad wrapped key") }
        return WrappedFileKey(
            protectionClass: cls, keybagID: id, wrappedKey: wrappedKey, ephemeralPublicKey: ephemeral,
            thisDeviceOnly: flags == 1)
    }

    package static func status(_ w: inout ByteWriter, _ s: KeybagStatus) {
        string(&w, s.root)
        uuid(&w, s.keybagID)
        lockState(&w, s.lockState)
        w.u8((s.passcodeSet ? 1 : 0) | (s.eraseAfterTenFailures ? 2 : 0))
        w.u32(UInt32(clamping: s.failedAttempts))
        double(&w, s.delayRemaining ?? -1)
        double(&w, s.gracePeriod)
        double(&w, s.graceRemaining ?? -1)
        w.raw([s.kdf.logN, s.kdf.r, s.kdf.p])
        w.u8(s.available.reduce(0) { $0 | (1 << ($1.rawValue - 1)) })
        // Since the TPM binding: where the device secret is, the TPM's lockout state, the last rollback.
        switch s.deviceSecret {
        case .file: w.u8(0); w.u32(0)
        case .tpm(let pcrs): w.u8(1); w.u32(pcrs?.mask ?? 0)
        }
        if let l = s.tpmLockout {
            w.u8(1); w.u8((l.inLockout ? 1 : 0) | (l.lockoutAuthorizationSet ? 2 : 0))
            w.u32(l.failedTries); w.u32(l.maxTries); w.u32(l.recoveryInterval); w.u32(l.lockoutRecovery)
        } else {
            w.u8(0)
        }
        string(&w, s.tpmProblem ?? "")
        w.u64(UInt64(bitPattern: s.lastRollback.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) } ?? 0))
        w.u8(UInt8(clamping: s.minimumPasscodeLength))   // since the passcode policy
    }

    package static func status(_ r: inout ByteReader) throws -> KeybagStatus {
        let root = try string(&r, "root")
        let id = try uuid(&r)
        let state = try lockState(&r)
        let flags = try r.u8("flags")
        let failed = Int(try r.u32("failed attempts"))
        let delay = try double(&r, "delay")
        let grace = try double(&r, "grace period")
        let graceLeft = try double(&r, "grace remaining")
        let kdf = try r.raw(3, "kdf")
        let mask = try r.u8("available")
        var status = KeybagStatus(
            root: root, keybagID: id, lockState: state, passcodeSet: flags & 1 != 0, failedAttempts: failed,
            delayRemaining: delay < 0 ? nil : delay, gracePeriod: grace,
            graceRemaining: graceLeft < 0 ? nil : graceLeft,
            eraseAfterTenFailures: flags & 2 != 0, kdf: PasscodeKDF(logN: kdf[0], r: kdf[1], p: kdf[2]),
            available: ProtectionClass.allCases.filter { mask & (1 << ($0.rawValue - 1)) != 0 })
        let storage = try r.u8("secret storage")
        let pcrMask = try r.u32("PCR mask")
        guard storage <= 1, pcrMask <= 0xFF_FFFF else { throw ProtocolError("bad device-secret storage") }
        status.deviceSecret = storage == 0 ? .file : .tpm(pcrs: pcrMask == 0 ? nil : TPMPCRSelection(mask: pcrMask))
        if try r.u8("lockout present") == 1 {
            let flags = try r.u8("lockout flags")
            status.tpmLockout = TPMLockoutState(
                inLockout: flags & 1 != 0, lockoutAuthorizationSet: flags & 2 != 0,
                failedTries: try r.u32("failed tries"), maxTries: try r.u32("max tries"),
                recoveryInterval: try r.u32("recovery"), lockoutRecovery: try r.u32("lockout recovery"))
        }
        let problem = try string(&r, "TPM problem")
        status.tpmProblem = problem.isEmpty ? nil : problem
        let rollback = Int64(bitPattern: try r.u64("last rollback"))
        status.lastRollback = rollback == 0 ? nil : Date(timeIntervalSince1970: TimeInterval(rollback) / 1000)
        let minimumLength = Int(try r.u8("minimum passcode length"))
        guard PasscodePolicy.minimumLengthRange.contains(minimumLength) else {
            throw ProtocolError("bad minimum passcode length")
        }
        status.minimumPasscodeLength = minimumLength
        return status
    }

    package static func event(_ w: inout ByteWriter, _ e: Event) {
        switch e {
        case .protectedData(.willBecomeUnavailable): w.u8(1)
        case .protectedData(.didBecomeAvailable): w.u8(2)
        case .discarded(let cls): w.u8(3); w.u8(cls.rawValue)
        }
    }

    package static func event(_ r: inout ByteReader) throws -> Event {
        switch try r.u8("event") {
        case 1: return .protectedData(.willBecomeUnavailable)
        case 2: return .protectedData(.didBecomeAvailable)
        case 3: return .discarded(try protectionClass(&r))
        default: throw ProtocolError("unknown event")
        }
    }

    // MARK: - Errors

    package static func error(_ w: inout ByteWriter, _ e: KeybagError) {
        switch e {
        case .notInitialized(let root): w.u8(1); string(&w, root)
        case .alreadyInitialized(let root): w.u8(2); string(&w, root)
        case .corruptKeybag(let why): w.u8(3); string(&w, why)
        case .badDeviceSecret(let why): w.u8(4); string(&w, why)
        case .wrongPasscode(let n): w.u8(5); w.u32(UInt32(clamping: n))
        case .passcodeDelayed(let after, let n): w.u8(6); double(&w, after); w.u32(UInt32(clamping: n))
        case .noPasscodeSet: w.u8(7)
        case .passcodeAlreadySet: w.u8(8)
        case .emptyPasscode: w.u8(9)
        case .deviceLocked(let state): w.u8(10); lockState(&w, state)
        case .classUnavailable(let cls, let state): w.u8(11); w.u8(cls.rawValue); lockState(&w, state)
        case .keyUnwrapFailed(let cls): w.u8(12); w.u8(cls.rawValue)
        case .foreignKeybag(let expected, let found): w.u8(13); uuid(&w, expected); uuid(&w, found)
        case .erased: w.u8(14)
        case .unsupportedProtectionType(let t): w.u8(15); string(&w, t)
        case .thisDeviceOnly: w.u8(16)
        case .io(let path, let reason): w.u8(17); string(&w, path); string(&w, reason)
        case .daemon(let why): w.u8(18); string(&w, why)
        case .invalidArgument(let why): w.u8(19); string(&w, why)
        case .notPermitted(let what): w.u8(20); string(&w, what)
        case .tpm(let why): w.u8(21); string(&w, why)
        case .tpmLockout(let failures, let interval):
            w.u8(22); w.u32(UInt32(clamping: failures)); w.u32(UInt32(clamping: interval))
        case .wrongBackupPassword: w.u8(23)
        case .newerKeybagFormat(let version, let readable):
            w.u8(24); w.u16(version); w.u8(UInt8(clamping: readable.count)); for v in readable.prefix(255) { w.u16(v) }
        case .passcodeTooShort(let minimum): w.u8(25); w.u8(UInt8(clamping: minimum))
        }
    }

    package static func error(_ r: inout ByteReader) throws -> KeybagError {
        switch try r.u8("error") {
        case 1: return .notInitialized(root: try string(&r, "root"))
        case 2: return .alreadyInitialized(root: try string(&r, "root"))
        case 3: return .corruptKeybag(try string(&r, "why"))
        case 4: return .badDeviceSecret(try string(&r, "why"))
        case 5: return .wrongPasscode(failedAttempts: Int(try r.u32("n")))
        case 6: return .passcodeDelayed(retryAfter: try double(&r, "after"), failedAttempts: Int(try r.u32("n")))
        case 7: return .noPasscodeSet
        case 8: return .passcodeAlreadySet
        case 9: return .emptyPasscode
        case 10: return .deviceLocked(try lockState(&r))
        case 11: return .classUnavailable(try protectionClass(&r), try lockState(&r))
        case 12: return .keyUnwrapFailed(try protectionClass(&r))
        case 13: return .foreignKeybag(expected: try uuid(&r), found: try uuid(&r))
        case 14: return .erased
        case 15: return .unsupportedProtectionType(try string(&r, "type"))
        case 16: return .thisDeviceOnly
        case 17: return .io(path: try string(&r, "path"), reason: try string(&r, "reason"))
        case 18: return .daemon(try string(&r, "why"))
        case 19: return .invalidArgument(try string(&r, "why"))
        case 20: return .notPermitted(try string(&r, "what"))
        case 21: return .tpm(try string(&r, "why"))
        case 22:
            return .tpmLockout(failedTries: Int(try r.u32("failures")), recoveryInterval: Int(try r.u32("interval")))
        case 23: return .wrongBackupPassword
        case 24:
            let version = try r.u16("version")
            let count = Int(try r.u8("count"))
            return .newerKeybagFormat(version: version, readable: try (0..<count).map { _ in try r.u16("readable") })
        case 25: return .passcodeTooShort(minimumLength: Int(try r.u8("minimum length")))
        default: throw ProtocolError("unknown error")
        }
    }
}

extension UnsafeRawBufferPointer {
    fileprivate func bigEndianUInt32() -> UInt32 {
        UInt32(self[0]) << 24 | UInt32(self[1]) << 16 | UInt32(self[2]) << 8 | UInt32(self[3])
    }
}
