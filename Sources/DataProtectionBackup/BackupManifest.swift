import DataProtection
import Foundation
import GRDB
import GRDBSQLite

/// One item of a backup, as the manifest records it.
public struct ManifestEntry: Sendable, Equatable, Codable, FetchableRecord, PersistableRecord {
    public enum Kind: String, Sendable, Codable { case directory, file, symlink }

    public static let databaseTableName = "entry"

    /// Relative to the backed-up directory, `/`-separated, never absolute, never with `..`.
    public var path: String
    public var kind: Kind
    /// Permission bits.
    public var mode: Int
    /// Modification time, seconds since 1970.
    public var mtime: Double
    /// Size of the file that was backed up.
    public var size: Int64
    /// The protection class of a protected file (`nil`: plain file, directory, link).
    public var protectionClass: Int?
    /// SHA-256 of the stored bytes, hex: the object's name.
    public var sha256: String?
    /// A symbolic link's target.
    public var linkTarget: String?
    /// A protected file bound to the device that wrote it: not restorable elsewhere.
    public var thisDeviceOnly: Bool
    /// A plain file stored sealed (as a class-B protected object); restored as plain.
    public var sealed: Bool

    public init(path: String, kind: Kind, mode: Int, mtime: Double, size: Int64, protectionClass: Int? = nil,
                sha256: String? = nil, linkTarget: String? = nil, thisDeviceOnly: Bool = false, sealed: Bool = false) {
        self.path = path
        self.kind = kind
        self.mode = mode
        self.mtime = mtime
        self.size = size
        self.protectionClass = protectionClass
        self.sha256 = sha256
        self.linkTarget = linkTarget
        self.thisDeviceOnly = thisDeviceOnly
        self.sealed = sealed
    }

    public var fileClass: ProtectionClass? { protectionClass.flatMap { ProtectionClass(rawValue: UInt8($0)) } }
}

/// The manifest of one backup: an SQLite database (through GRDB) with every item and the
/// backup's metadata. Specified in `docs/FORMAT.md` § Backups.
public struct BackupManifest: Sendable {
    /// The sealed manifest in a backup: a class-B protected file holding the SQLite database.
    public static let fileName = "manifest.sealed"
    public static let formatVersion = 1

    let queue: DatabaseQueue

    /// Creates a new manifest at `url`, or in memory when `url` is nil.
    static func create(at url: URL?) throws -> BackupManifest {
        let queue = try url.map { try DatabaseQueue(path: $0.path) } ?? DatabaseQueue()
        try queue.write { db in
            try db.create(table: "meta") { t in
                t.primaryKey("key", .text)
                t.column("value", .text).notNull()
            }
            try db.create(table: ManifestEntry.databaseTableName) { t in
                t.primaryKey("path", .text)
                t.column("kind", .text).notNull()
                t.column("mode", .integer).notNull()
                t.column("mtime", .double).notNull()
                t.column("size", .integer).notNull()
                t.column("protectionClass", .integer)
                t.column("sha256", .text)
                t.column("linkTarget", .text)
                t.column("thisDeviceOnly", .boolean).notNull().defaults(to: false)
                t.column("sealed", .boolean).notNull().defaults(to: false)
            }
            try db.execute(sql: "INSERT INTO meta(key, value) VALUES ('format', ?)", arguments: ["\(formatVersion)"])
        }
        return BackupManifest(queue: queue)
    }

    /// Opens an existing manifest file, read-only.
    public static func open(at url: URL) throws -> BackupManifest {
        var configuration = Configuration()
        configuration.readonly = true
        return try checked(DatabaseQueue(path: url.path, configuration: configuration), url.path)
    }

    /// The database as bytes (`sqlite3_serialize`), to be sealed.
    func serialized() throws -> [UInt8] {
        try queue.inDatabase { db in
            var size: sqlite3_int64 = 0
            guard let bytes = sqlite3_serialize(db.sqliteConnection, "main", &size, 0) else {
                throw BackupError.badBackup(path: "<manifest>", reason: "SQLite could not serialize the manifest")
            }
            defer { sqlite3_free(bytes) }
            return Array(UnsafeBufferPointer(start: bytes, count: Int(size)))
        }
    }

    /// A manifest from bytes (`sqlite3_deserialize` into memory); nothing touches the disk.
    static func deserialize(_ bytes: [UInt8], path: String) throws -> BackupManifest {
        let queue = try DatabaseQueue()
        try queue.inDatabase { db in
            guard let buffer = sqlite3_malloc64(sqlite3_uint64(max(bytes.count, 1))) else {
                throw BackupError.badBackup(path: path, reason: "out of memory")
            }
            bytes.withUnsafeBytes { buffer.copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
            let flags = UInt32(SQLITE_DESERIALIZE_FREEONCLOSE | SQLITE_DESERIALIZE_RESIZEABLE)
            guard sqlite3_deserialize(db.sqliteConnection, "main", buffer.assumingMemoryBound(to: UInt8.self),
                                      sqlite3_int64(bytes.count), sqlite3_int64(bytes.count), flags) == SQLITE_OK else {
                throw BackupError.badBackup(path: path, reason: "the manifest is not an SQLite database")
            }
        }
        return try checked(queue, path)
    }

    private static func checked(_ queue: DatabaseQueue, _ path: String) throws -> BackupManifest {
        let format = try? queue.read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'format'") }
        guard let format, format == "\(formatVersion)" else {
            throw BackupError.badBackup(path: path, reason: "manifest format \(format ?? "?") is not supported")
        }
        return BackupManifest(queue: queue)
    }

    func insert(_ entries: [ManifestEntry], meta: [String: String]) throws {
        try queue.write { db in
            for entry in entries { try entry.insert(db) }
            for (key, value) in meta {
                try db.execute(sql: "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", arguments: [key, value])
            }
        }
    }

    /// Every entry, parents before children.
    public func entries() throws -> [ManifestEntry] {
        try queue.read { db in try ManifestEntry.order(Column("path")).fetchAll(db) }
    }

    /// A metadata value (`source`, `created`, `keybag` …).
    public func meta(_ key: String) throws -> String? {
        try queue.read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [key]) }
    }
}
