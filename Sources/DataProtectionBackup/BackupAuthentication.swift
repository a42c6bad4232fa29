import Crypto
import DataProtection
import DataProtectionSystem
import Foundation

/// The record that makes a backup authentic (`ID/authentication`, FORMAT.md §5.1).
///
/// A sealed manifest alone proves nothing: class B files are made with the class B *public*
/// key, which every backup keybag carries in clear. So each finished backup also holds a MAC,
/// under a key derived from the device's class D key, over the backup's identity and the
/// SHA-256 of every file that names its content — the sealed manifest (which names every
/// object by its SHA-256), the object list and the backup keybag. Only the device, or the
/// holder of its backup password, can make or check it, as only the holder of a restic or borg
/// repository's key can.
///
///     magic "\x89DPBA\r\n\x1a" | version u16 = 1 | length u16 = 60 | keybag UUID (16) | tag (32)
///     tag = HMAC-SHA256(key, bytes 0..<28 | "DataProtection v1 backup" | u16 len | ID |
///                       SHA256(manifest.sealed) | SHA256(objects.list) | SHA256(backup-keybag) or 32 zeros)
struct BackupAuthentication: Equatable {
    static let fileName = "authentication"
    static let magic: [UInt8] = [0x89, 0x44, 0x50, 0x42, 0x41, 0x0D, 0x0A, 0x1A]   // \x89 D P B A \r \n \x1a
    static let version: UInt16 = 1
    static let length = 60

    /// The device (keybag) that made the backup and whose key authenticates it.
    var keybagID: UUID
    var tag: [UInt8]

    /// What the tag covers, besides the record's first 28 bytes.
    struct Contents {
        var backupID: String
        var manifestSHA256: [UInt8]
        var objectListSHA256: [UInt8]
        /// `nil` when the backup carries no backup keybag.
        var backupKeybagSHA256: [UInt8]?

        init(backupID: String, manifest: [UInt8], objectList: [UInt8], backupKeybag: [UInt8]?) {
            self.backupID = backupID
            manifestSHA256 = Array(SHA256.hash(data: manifest))
            objectListSHA256 = Array(SHA256.hash(data: objectList))
            backupKeybagSHA256 = backupKeybag.map { Array(SHA256.hash(data: $0)) }
        }
    }

    static func header(keybagID: UUID) -> [UInt8] {
        var w = ByteWriter()
        w.raw(magic)
        w.u16(version)
        w.u16(UInt16(length))
        w.raw(keybagID.bytes)
        return w.bytes
    }

    static func tag(keybagID: UUID, contents: Contents, key: SymmetricKey) -> [UInt8] {
        var statement = ByteWriter()
        statement.raw(header(keybagID: keybagID))
        statement.raw(Array("DataProtection v1 backup".utf8))
        let id = Array(contents.backupID.utf8)
        statement.u16(UInt16(clamping: id.count))
        statement.raw(id)
        statement.raw(contents.manifestSHA256)
        statement.raw(contents.objectListSHA256)
        statement.raw(contents.backupKeybagSHA256 ?? [UInt8](repeating: 0, count: 32))
        return Array(HMAC<SHA256>.authenticationCode(for: statement.bytes, using: key))
    }

    /// The record for a backup `keybagID`'s device just made.
    init(keybagID: UUID, contents: Contents, key: SymmetricKey) {
        self.keybagID = keybagID
        self.tag = Self.tag(keybagID: keybagID, contents: contents, key: key)
    }

    var encoded: [UInt8] { Self.header(keybagID: keybagID) + tag }

    /// Parses a record; the tag is checked by ``check(_:key:)``.
    init(bytes: [UInt8], path: String) throws {
        func reject(_ why: String) -> BackupError { .notAuthentic(path: path, reason: why) }
        guard bytes.count == Self.length, Array(bytes[0..<8]) == Self.magic else {
            throw reject("its authentication record is not one (\(bytes.count) bytes)")
        }
        let version = UInt16(bytes[8]) << 8 | UInt16(bytes[9])
        guard version == Self.version else {
            throw reject("authentication format version \(version) is not supported by this build")
        }
        guard UInt16(bytes[10]) << 8 | UInt16(bytes[11]) == UInt16(Self.length) else {
            throw reject("its authentication record has a wrong length field")
        }
        keybagID = UUID(bytes: Array(bytes[12..<28]))
        tag = Array(bytes[28..<60])
    }

    /// Whether the tag is the one `key` gives for `contents` (constant time).
    func check(_ contents: Contents, key: SymmetricKey) -> Bool {
        let expected = Self.tag(keybagID: keybagID, contents: contents, key: key)
        guard expected.count == tag.count else { return false }
        return zip(expected, tag).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }
}
