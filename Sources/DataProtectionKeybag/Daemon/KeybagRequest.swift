import Crypto
import DataProtectionIPC
import DataProtectionSystem
import Foundation

/// One keybag operation on keybagd's wire (FORMAT.md §8), defined once for both ends: its
/// opcode, how its request and its answer are laid out, and what the daemon does with it.
///
/// The client sends it with ``KeybagdConnection/send(_:)``; the daemon finds its type by
/// opcode in ``KeybagRequests/byOpcode`` and calls ``answer(_:_:keybag:)``. Adding an operation
/// is one type here plus its two implementations: in ``EmbeddedKeybag`` and in
/// ``KeybagdClient`` (see CONTRIBUTING.md).
package protocol KeybagRequest: Sendable {
    associatedtype Response: Sendable
    static var op: KeybagWire.Op { get }
    func encode(_ w: inout ByteWriter)
    init(_ r: inout ByteReader) throws
    static func encode(_ response: Response, _ w: inout ByteWriter)
    static func decode(_ r: inout ByteReader) throws -> Response
    /// What the daemon does: the call on its embedded keybag.
    func perform(on keybag: EmbeddedKeybag) async throws -> Response
}

extension KeybagRequest {
    /// The daemon's side: reads the request, performs it, writes the answer.
    package static func answer(_ r: inout ByteReader, _ w: inout ByteWriter, keybag: EmbeddedKeybag) async throws {
        let request = try Self(&r)
        guard r.remaining == 0 else { throw KeybagWire.ProtocolError("trailing bytes in a request") }
        encode(try await request.perform(on: keybag), &w)
    }
}

/// Requests without a body, and answers without one.
package protocol EmptyKeybagRequest: KeybagRequest {
    init()
}
extension EmptyKeybagRequest {
    package func encode(_ w: inout ByteWriter) {}
    package init(_ r: inout ByteReader) throws { self.init() }
}
extension KeybagRequest where Response == Void {
    package static func encode(_ response: Void, _ w: inout ByteWriter) {}
    package static func decode(_ r: inout ByteReader) throws {}
}
extension KeybagRequest where Response == Bool {
    package static func encode(_ response: Bool, _ w: inout ByteWriter) { w.u8(response ? 1 : 0) }
    package static func decode(_ r: inout ByteReader) throws -> Bool { try r.u8("flag") == 1 }
}
/// Requests whose body is one protection class.
package protocol ClassKeybagRequest: KeybagRequest {
    var protectionClass: ProtectionClass { get }
    init(protectionClass: ProtectionClass)
}
extension ClassKeybagRequest {
    package func encode(_ w: inout ByteWriter) { w.u8(protectionClass.rawValue) }
    package init(_ r: inout ByteReader) throws { self.init(protectionClass: try KeybagWire.protectionClass(&r)) }
}

/// Requests whose body is one secret string (a passcode or a password), read into
/// ``SecretBytes`` on the daemon's side and never into a `String`.
package protocol SecretKeybagRequest: KeybagRequest where Response == Void {
    var secret: SecretBytes { get }
    init(secret: SecretBytes)
}
extension SecretKeybagRequest {
    package func encode(_ w: inout ByteWriter) { KeybagWire.secretString(&w, secret) }
    package init(_ r: inout ByteReader) throws { self.init(secret: try KeybagWire.secretString(&r, "passcode")) }
}

/// Every request the daemon answers, by opcode.
package enum KeybagRequests {
    package static let all: [any KeybagRequest.Type] = [
        Hello.self, Status.self, Unlock.self, Lock.self, IsAvailable.self, CanCreate.self, Generation.self,
        WrapNewFileKey.self, UnwrapFileKey.self, RewrapFileKey.self, Wrap.self, LockStateRequest.self,
        IsProtectedDataAvailable.self, GracePeriod.self, SetGracePeriod.self, SetPasscode.self, ChangePasscode.self,
        RemovePasscode.self, SetBackupPassword.self, Erase.self, SetEraseAfterTenFailures.self,
        BackupAuthenticationKey.self,
        SetMinimumPasscodeLength.self,
    ]
    package static let byOpcode: [KeybagWire.Op: any KeybagRequest.Type] = Dictionary(
        uniqueKeysWithValues: all.map { ($0.op, $0) })

    package struct Hello: EmptyKeybagRequest {
        package static let op = KeybagWire.Op.hello
        package init() {}
        package static func encode(_ response: (id: UUID, root: String), _ w: inout ByteWriter) {
            KeybagWire.uuid(&w, response.id)
            KeybagWire.string(&w, response.root)
        }
        package static func decode(_ r: inout ByteReader) throws -> (id: UUID, root: String) {
            (try KeybagWire.uuid(&r), try KeybagWire.string(&r, "root"))
        }
        package func perform(on keybag: EmbeddedKeybag) async throws -> (id: UUID, root: String) {
            (keybag.id, keybag.root)
        }
    }

    package struct Status: EmptyKeybagRequest {
        package static let op = KeybagWire.Op.status
        package init() {}
        package static func encode(_ response: KeybagStatus, _ w: inout ByteWriter) { KeybagWire.status(&w, response) }
        package static func decode(_ r: inout ByteReader) throws -> KeybagStatus { try KeybagWire.status(&r) }
        package func perform(on keybag: EmbeddedKeybag) async throws -> KeybagStatus { await keybag.status }
    }

    package struct LockStateRequest: EmptyKeybagRequest {
        package static let op = KeybagWire.Op.lockState
        package init() {}
        package static func encode(_ response: LockState, _ w: inout ByteWriter) { KeybagWire.lockState(&w, response) }
        package static func decode(_ r: inout ByteReader) throws -> LockState { try KeybagWire.lockState(&r) }
        package func perform(on keybag: EmbeddedKeybag) async throws -> LockState { await keybag.lockState }
    }

    package struct IsProtectedDataAvailable: EmptyKeybagRequest {
        package typealias Response = Bool
        package static let op = KeybagWire.Op.isProtectedDataAvailable
        package init() {}
        package func perform(on keybag: EmbeddedKeybag) async throws -> Bool { await keybag.isProtectedDataAvailable }
    }

    package struct IsAvailable: ClassKeybagRequest {
        package typealias Response = Bool
        package static let op = KeybagWire.Op.isAvailable
        package let protectionClass: ProtectionClass
        package init(protectionClass: ProtectionClass) { self.protectionClass = protectionClass }
        package func perform(on keybag: EmbeddedKeybag) async throws -> Bool {
            await keybag.isAvailable(protectionClass)
        }
    }

    package struct CanCreate: ClassKeybagRequest {
        package typealias Response = Bool
        package static let op = KeybagWire.Op.canCreate
        package let protectionClass: ProtectionClass
        package init(protectionClass: ProtectionClass) { self.protectionClass = protectionClass }
        package func perform(on keybag: EmbeddedKeybag) async throws -> Bool { await keybag.canCreate(protectionClass) }
    }

    package struct Generation: ClassKeybagRequest {
        package static let op = KeybagWire.Op.generation
        package let protectionClass: ProtectionClass
        package init(protectionClass: ProtectionClass) { self.protectionClass = protectionClass }
        package static func encode(_ response: Int, _ w: inout ByteWriter) { w.u64(UInt64(response)) }
        package static func decode(_ r: inout ByteReader) throws -> Int { Int(try r.u64("generation")) }
        package func perform(on keybag: EmbeddedKeybag) async throws -> Int {
            try await keybag.generation(of: protectionClass)
        }
    }

    package struct GracePeriod: EmptyKeybagRequest {
        package static let op = KeybagWire.Op.gracePeriod
        package init() {}
        package static func encode(_ response: TimeInterval, _ w: inout ByteWriter) { KeybagWire.double(&w, response) }
        package static func decode(_ r: inout ByteReader) throws -> TimeInterval {
            try KeybagWire.double(&r, "seconds")
        }
        package func perform(on keybag: EmbeddedKeybag) async throws -> TimeInterval { await keybag.gracePeriod }
    }

    package struct SetGracePeriod: KeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.setGracePeriod
        package let seconds: TimeInterval
        package init(seconds: TimeInterval) { self.seconds = seconds }
        package func encode(_ w: inout ByteWriter) { KeybagWire.double(&w, seconds) }
        package init(_ r: inout ByteReader) throws { seconds = try KeybagWire.double(&r, "seconds") }
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.setGracePeriod(seconds) }
    }

    package struct SetEraseAfterTenFailures: KeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.setEraseAfterTenFailures
        package let on: Bool
        package init(on: Bool) { self.on = on }
        package func encode(_ w: inout ByteWriter) { w.u8(on ? 1 : 0) }
        package init(_ r: inout ByteReader) throws { on = try r.u8("on") == 1 }
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.setEraseAfterTenFailures(on) }
    }

    package struct SetMinimumPasscodeLength: KeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.setMinimumPasscodeLength
        package let length: Int
        package init(length: Int) { self.length = length }
        package func encode(_ w: inout ByteWriter) { w.u8(UInt8(clamping: length)) }
        package init(_ r: inout ByteReader) throws { length = Int(try r.u8("length")) }
        package func perform(on keybag: EmbeddedKeybag) async throws {
            try await keybag.setMinimumPasscodeLength(length)
        }
    }

    package struct Unlock: SecretKeybagRequest {
        package static let op = KeybagWire.Op.unlock
        package let secret: SecretBytes
        package init(secret: SecretBytes) { self.secret = secret }
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.unlock(passcode: secret) }
    }

    package struct Lock: EmptyKeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.lock
        package init() {}
        package func perform(on keybag: EmbeddedKeybag) async throws { await keybag.lock() }
    }

    package struct SetPasscode: SecretKeybagRequest {
        package static let op = KeybagWire.Op.setPasscode
        package let secret: SecretBytes
        package init(secret: SecretBytes) { self.secret = secret }
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.setPasscode(secret) }
    }

    package struct ChangePasscode: KeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.changePasscode
        package let old: SecretBytes, new: SecretBytes
        package init(old: SecretBytes, new: SecretBytes) { self.old = old; self.new = new }
        package func encode(_ w: inout ByteWriter) {
            KeybagWire.secretString(&w, old); KeybagWire.secretString(&w, new)
        }
        package init(_ r: inout ByteReader) throws {
            old = try KeybagWire.secretString(&r, "old")
            new = try KeybagWire.secretString(&r, "new")
        }
        package func perform(on keybag: EmbeddedKeybag) async throws {
            try await keybag.changePasscode(from: old, to: new)
        }
    }

    package struct RemovePasscode: SecretKeybagRequest {
        package static let op = KeybagWire.Op.removePasscode
        package let secret: SecretBytes
        package init(secret: SecretBytes) { self.secret = secret }
        package func perform(on keybag: EmbeddedKeybag) async throws {
            try await keybag.removePasscode(current: secret)
        }
    }

    package struct SetBackupPassword: SecretKeybagRequest {
        package static let op = KeybagWire.Op.setBackupPassword
        package let secret: SecretBytes
        package init(secret: SecretBytes) { self.secret = secret }
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.setBackupPassword(secret) }
    }

    package struct Erase: EmptyKeybagRequest {
        package typealias Response = Void
        package static let op = KeybagWire.Op.erase
        package init() {}
        package func perform(on keybag: EmbeddedKeybag) async throws { try await keybag.erase() }
    }

    package struct WrapNewFileKey: KeybagRequest {
        package static let op = KeybagWire.Op.wrapNewFileKey
        package let protectionClass: ProtectionClass, thisDeviceOnly: Bool
        package init(protectionClass: ProtectionClass, thisDeviceOnly: Bool) {
            self.protectionClass = protectionClass
            self.thisDeviceOnly = thisDeviceOnly
        }
        package func encode(_ w: inout ByteWriter) { w.u8(protectionClass.rawValue); w.u8(thisDeviceOnly ? 1 : 0) }
        package init(_ r: inout ByteReader) throws {
            protectionClass = try KeybagWire.protectionClass(&r)
            thisDeviceOnly = try r.u8("this device only") == 1
        }
        package static func encode(_ response: (key: SymmetricKey, wrapped: WrappedFileKey), _ w: inout ByteWriter) {
            KeybagWire.key(&w, response.key)
            KeybagWire.wrapped(&w, response.wrapped)
        }
        package static func decode(_ r: inout ByteReader) throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
            (try r.peekingKey(), try KeybagWire.wrapped(&r))
        }
        package func perform(on keybag: EmbeddedKeybag) async throws -> (key: SymmetricKey, wrapped: WrappedFileKey) {
            try await keybag.wrapNewFileKey(for: protectionClass, thisDeviceOnly: thisDeviceOnly)
        }
    }

    package struct UnwrapFileKey: KeybagRequest {
        package static let op = KeybagWire.Op.unwrapFileKey
        package let wrapped: WrappedFileKey
        package init(wrapped: WrappedFileKey) { self.wrapped = wrapped }
        package func encode(_ w: inout ByteWriter) { KeybagWire.wrapped(&w, wrapped) }
        package init(_ r: inout ByteReader) throws { wrapped = try KeybagWire.wrapped(&r) }
        package static func encode(_ response: (key: SymmetricKey, generation: Int), _ w: inout ByteWriter) {
            KeybagWire.key(&w, response.key)
            w.u64(UInt64(response.generation))
        }
        package static func decode(_ r: inout ByteReader) throws -> (key: SymmetricKey, generation: Int) {
            (try r.peekingKey(), Int(try r.u64("generation")))
        }
        package func perform(on keybag: EmbeddedKeybag) async throws -> (key: SymmetricKey, generation: Int) {
            try await keybag.unwrapFileKeyWithGeneration(wrapped)
        }
    }

    package struct RewrapFileKey: KeybagRequest {
        package static let op = KeybagWire.Op.rewrapFileKey
        package let wrapped: WrappedFileKey, protectionClass: ProtectionClass
        package init(wrapped: WrappedFileKey, protectionClass: ProtectionClass) {
            self.wrapped = wrapped
            self.protectionClass = protectionClass
        }
        package func encode(_ w: inout ByteWriter) { KeybagWire.wrapped(&w, wrapped); w.u8(protectionClass.rawValue) }
        package init(_ r: inout ByteReader) throws {
            wrapped = try KeybagWire.wrapped(&r)
            protectionClass = try KeybagWire.protectionClass(&r)
        }
        package static func encode(_ response: WrappedFileKey, _ w: inout ByteWriter) {
            KeybagWire.wrapped(&w, response)
        }
        package static func decode(_ r: inout ByteReader) throws -> WrappedFileKey { try KeybagWire.wrapped(&r) }
        package func perform(on keybag: EmbeddedKeybag) async throws -> WrappedFileKey {
            try await keybag.rewrapFileKey(wrapped, to: protectionClass)
        }
    }

    package struct Wrap: KeybagRequest {
        package static let op = KeybagWire.Op.wrap
        package let key: SymmetricKey, protectionClass: ProtectionClass, thisDeviceOnly: Bool
        package init(key: SymmetricKey, protectionClass: ProtectionClass, thisDeviceOnly: Bool) {
            self.key = key
            self.protectionClass = protectionClass
            self.thisDeviceOnly = thisDeviceOnly
        }
        package func encode(_ w: inout ByteWriter) {
            KeybagWire.key(&w, key)
            w.u8(protectionClass.rawValue)
            w.u8(thisDeviceOnly ? 1 : 0)
        }
        package init(_ r: inout ByteReader) throws {
            key = try r.peekingKey()
            protectionClass = try KeybagWire.protectionClass(&r)
            thisDeviceOnly = try r.u8("this device only") == 1
        }
        package static func encode(_ response: WrappedFileKey, _ w: inout ByteWriter) {
            KeybagWire.wrapped(&w, response)
        }
        package static func decode(_ r: inout ByteReader) throws -> WrappedFileKey { try KeybagWire.wrapped(&r) }
        package func perform(on keybag: EmbeddedKeybag) async throws -> WrappedFileKey {
            try await keybag.wrap(key, for: protectionClass, thisDeviceOnly: thisDeviceOnly)
        }
    }

    package struct BackupAuthenticationKey: EmptyKeybagRequest {
        package static let op = KeybagWire.Op.backupAuthenticationKey
        package init() {}
        package static func encode(_ response: SymmetricKey, _ w: inout ByteWriter) { KeybagWire.key(&w, response) }
        package static func decode(_ r: inout ByteReader) throws -> SymmetricKey { try r.peekingKey() }
        package func perform(on keybag: EmbeddedKeybag) async throws -> SymmetricKey {
            try await keybag.backupAuthenticationKey()
        }
    }
}
