import DataProtection
import Foundation

/// The key of a class-managed database, kept next to it in `<database>-dpkey`: a protected file
/// (docs/FORMAT.md §3) of the database's class whose content is this 48- or 80-byte record
/// (docs/FORMAT.md §7.4):
///
///     "DPSQLKEY" | version u16 = 1 | compatibility u8 | flags u8 | page size u32 | key 32 [| previous key 32]
///
/// Because it is an ordinary protected file, the class rules, rewrapping (class changes never
/// touch the database), backups and restores of files all apply to it unchanged.
package struct DatabaseKeyFile: Equatable {
    static let magic = Array("DPSQLKEY".utf8)
    static let version: UInt16 = 1
    package static let suffix = "-dpkey"

    var format: SQLCipherFormat
    var key: [UInt8]
    /// The key before an interrupted rekey (flags bit 0): tried when `key` fails on page 1.
    var previousKey: [UInt8]?

    static func url(for database: URL) -> URL {
        URL(fileURLWithPath: database.path + suffix)
    }

    func encoded() -> [UInt8] {
        var out = Self.magic
        out += [UInt8(Self.version >> 8), UInt8(Self.version & 0xFF)]
        out.append(UInt8(format.compatibility))
        out.append(previousKey == nil ? 0 : 1)
        let size = UInt32(format.pageSize)
        out += [UInt8(size >> 24), UInt8(size >> 16 & 0xFF), UInt8(size >> 8 & 0xFF), UInt8(size & 0xFF)]
        out += key
        if let previousKey { out += previousKey }
        return out
    }

    static func parse(_ data: Data, path: String) throws -> DatabaseKeyFile {
        let bytes = [UInt8](data)
        guard bytes.count == 48 || bytes.count == 80, Array(bytes[0..<8]) == magic else {
            throw DatabaseCipherError.damaged(path: path, detail: "not a database key record")
        }
        let version = UInt16(bytes[8]) << 8 | UInt16(bytes[9])
        guard version == Self.version else {
            throw DatabaseCipherError.unsupportedFormat("database key record version \(version)")
        }
        let flags = bytes[11]
        guard flags & ~1 == 0, (flags & 1 == 1) == (bytes.count == 80) else {
            throw DatabaseCipherError.damaged(path: path, detail: "database key record flags \(flags)")
        }
        let pageSize = Int(
            UInt32(bytes[12]) << 24 | UInt32(bytes[13]) << 16 | UInt32(bytes[14]) << 8 | UInt32(bytes[15]))
        let format = try SQLCipherFormat(compatibility: Int(bytes[10])).withPageSize(pageSize)
        return DatabaseKeyFile(
            format: format, key: Array(bytes[16..<48]), previousKey: bytes.count == 80 ? Array(bytes[48..<80]) : nil)
    }
}
