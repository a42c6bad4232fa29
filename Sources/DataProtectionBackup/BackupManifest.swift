import DataProtection
import DataProtectionSystem
import Foundation
import GRDB
import GRDBSQLite

/// One item of a backup, as the manifest records it.
///
/// `path` and `linkTarget` are ``LosslessPath`` strings: the manifest stores their bytes as
/// BLOBs, so names that are not UTF-8 survive a backup and a restore unchanged. Reading an
/// entry validates every field (FORMAT.md §5): a crafted manifest gives an error, never a trap.
public struct ManifestEntry: Sendable, Equatable, FetchableRecord, PersistableRecord {
    public enum Kind: String, Sendable, Codable { case directory, file, symlink }

    public static let databaseTableName = "entry"

    /// Relative to the backed-up directory, `/`-separated, never absolute, never with `..`.
    public var path: String
    public var kind: Kind
    /// Permission bits (0…0o7777 as backed up; restore never applies set-id or sticky bits).
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
    /// A directory's default class for new files (`user.dataprotection.class`), or `nil` for none
    /// (format 3; format-2 manifests never record one).
    public var defaultClass: Int?
    /// The object is a chunk list (FORMAT.md §5.2): the file's bytes are its chunks, in packs
    /// (format 4; earlier manifests store every file whole).
    public var chunked: Bool
    /// An encrypted database of a class (its key in the protected file beside it, `-dpkey`),
    /// stored and restored as it is: its pages are already ciphertext (format 4).
    public var encryptedDatabase: Bool

    public init(
        path: String, kind: Kind, mode: Int, mtime: Double, size: Int64, protectionClass: Int? = nil,
        sha256: String? = nil, linkTarget: String? = nil, thisDeviceOnly: Bool = false, sealed: Bool = false,
        defaultClass: Int? = nil, chunked: Bool = false, encryptedDatabase: Bool = false
    ) {
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
        self.defaultClass = defaultClass
        self.chunked = chunked
        self.encryptedDatabase = encryptedDatabase
    }

    public var fileClass: ProtectionClass? { protectionClass.flatMap { ProtectionClass(rawValue: UInt8($0)) } }

    /// The largest modification time accepted: year 5138 (|mtime| ≤ 10^11 s).
    static let mtimeLimit = 1e11
    /// The largest file size accepted (1 PiB).
    static let sizeLimit: Int64 = 1 << 50

    public func encode(to container: inout PersistenceContainer) {
        container["path"] = Data(LosslessPath.bytes(of: path))
        container["kind"] = kind.rawValue
        container["mode"] = mode
        container["mtime"] = mtime
        container["size"] = size
        container["protectionClass"] = protectionClass
        container["sha256"] = sha256
        container["linkTarget"] = linkTarget.map { Data(LosslessPath.bytes(of: $0)) }
        container["thisDeviceOnly"] = thisDeviceOnly
        container["sealed"] = sealed
        container["defaultClass"] = defaultClass
        container["chunked"] = chunked
        container["encryptedDatabase"] = encryptedDatabase
    }

    /// Decodes and validates a row; every defect is ``BackupError/badBackup(path:reason:)``.
    public init(row: Row) throws {
        func bad(_ why: String) -> BackupError { .badBackup(path: "manifest", reason: why) }
        // GRDB's row subscript traps on a missing column: check first.
        for column in [
            "path", "kind", "mode", "mtime", "size", "protectionClass", "sha256", "linkTarget", "thisDeviceOnly",
            "sealed", "defaultClass",
            "chunked", "encryptedDatabase",
        ]
        where !row.hasColumn(column) {
            throw bad("column \(column) is missing")
        }
        func blob(_ column: String) throws -> [UInt8]? {
            switch (row[column] as DatabaseValue).storage {
            case .null: return nil
            case .blob(let data): return [UInt8](data)
            default: throw bad("column \(column) is not a byte string")
            }
        }
        func integer(_ column: String) throws -> Int64? {
            switch (row[column] as DatabaseValue).storage {
            case .null: return nil
            case .int64(let value): return value
            default: throw bad("column \(column) is not an integer")
            }
        }
        func text(_ column: String) throws -> String? {
            switch (row[column] as DatabaseValue).storage {
            case .null: return nil
            case .string(let value): return value
            default: throw bad("column \(column) is not text")
            }
        }
        guard let pathBytes = try blob("path"), !pathBytes.isEmpty else { throw bad("an entry has no path") }
        let path = LosslessPath.string(fromBytes: pathBytes)
        func badEntry(_ why: String) -> BackupError { bad("entry \(LosslessPath.display(path)): \(why)") }
        guard !pathBytes.contains(0) else { throw badEntry("the name contains a NUL byte") }
        guard let kindName = try text("kind"), let kind = Kind(rawValue: kindName) else {
            throw badEntry("unknown kind")
        }
        guard let mode = try integer("mode"), (0...0o7777).contains(mode) else { throw badEntry("mode out of range") }
        let mtime: Double
        switch (row["mtime"] as DatabaseValue).storage {
        case .double(let value): mtime = value
        case .int64(let value): mtime = Double(value)
        default: throw badEntry("modification time is not a number")
        }
        guard mtime.isFinite, abs(mtime) <= Self.mtimeLimit else { throw badEntry("modification time out of range") }
        guard let size = try integer("size"), (0...Self.sizeLimit).contains(size) else {
            throw badEntry("size out of range")
        }
        let protectionClass = try integer("protectionClass")
        if let protectionClass, !(1...4).contains(protectionClass) {
            throw badEntry("protection class \(protectionClass) does not exist")
        }
        let sha256 = try text("sha256")
        if let sha256,
            sha256.utf8.count != 64
                || !sha256.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
        {
            throw badEntry("malformed object name")
        }
        let targetBytes = try blob("linkTarget")
        if let targetBytes, targetBytes.isEmpty || targetBytes.contains(0) { throw badEntry("malformed link target") }
        let defaultClass = try integer("defaultClass")
        if let defaultClass {
            guard (1...4).contains(defaultClass) else { throw badEntry("default class \(defaultClass) does not exist") }
            guard kind == .directory else { throw badEntry("a default class on something that is not a directory") }
        }
        let deviceOnly = try integer("thisDeviceOnly") ?? 0, sealed = try integer("sealed") ?? 0
        let chunked = try integer("chunked") ?? 0, database = try integer("encryptedDatabase") ?? 0
        guard [deviceOnly, sealed, chunked, database].allSatisfy({ (0...1).contains($0) }) else {
            throw badEntry("flag out of range")
        }
        switch kind {
        case .file:
            guard sha256 != nil else { throw badEntry("a file without an object") }
            // A plain file is stored sealed, or as it is when it is an encrypted database;
            // anything else stored as it is must be a protected file.
            guard [sealed == 1, protectionClass != nil, database == 1].filter({ $0 }).count == 1 else {
                throw badEntry("a file must be one of sealed, protected or an encrypted database")
            }
            guard chunked == 0 || sealed == 0 else { throw badEntry("a sealed file in chunks") }
            guard database == 0 || chunked == 1 else { throw badEntry("an encrypted database not in chunks") }
            guard targetBytes == nil else { throw badEntry("a file with a link target") }
        case .directory:
            guard sha256 == nil, targetBytes == nil, protectionClass == nil, sealed == 0, chunked == 0, database == 0
            else {
                throw badEntry("a directory with file fields")
            }
        case .symlink:
            guard targetBytes != nil, sha256 == nil, protectionClass == nil, sealed == 0, chunked == 0, database == 0
            else {
                throw badEntry("a link without a target")
            }
        }
        self.init(
            path: path, kind: kind, mode: Int(mode), mtime: mtime, size: size,
            protectionClass: protectionClass.map(Int.init),
            sha256: sha256, linkTarget: targetBytes.map { LosslessPath.string(fromBytes: $0) },
            thisDeviceOnly: deviceOnly == 1, sealed: sealed == 1, defaultClass: defaultClass.map(Int.init),
            chunked: chunked == 1, encryptedDatabase: database == 1)
    }
}

/// The manifest of one backup: an SQLite database (through GRDB) with every item and the
/// backup's metadata. Specified in `docs/FORMAT.md` § Backups.
public struct BackupManifest: Sendable {
    /// The sealed manifest in a backup: a class-B protected file holding the SQLite database.
    public static let fileName = "manifest.sealed"
    /// 4: big files in chunks (`entry.chunked`, FORMAT.md §5.2) and encrypted databases stored as
    /// they are (`entry.encryptedDatabase`);
    /// 3: directories' default classes (`entry.defaultClass`, meta `defaultClass` for SOURCE itself);
    /// 2: paths and link targets as bytes (BLOB); backups authenticated (FORMAT.md §5). Both are read.
    public static let formatVersion = 4
    static let readableFormats = [2, 3, 4]

    let queue: DatabaseQueue
    /// The format this manifest was written in.
    let format: Int

    /// Creates a new manifest at `url`, or in memory when `url` is nil.
    static func create(at url: URL?) throws -> BackupManifest {
        let queue = try url.map { try DatabaseQueue(path: $0.path) } ?? DatabaseQueue()
        try queue.write { db in
            try db.create(table: "meta") { t in
                t.primaryKey("key", .text)
                t.column("value", .text).notNull()
            }
            try db.create(table: ManifestEntry.databaseTableName) { t in
                t.primaryKey("path", .blob)
                t.column("kind", .text).notNull()
                t.column("mode", .integer).notNull()
                t.column("mtime", .double).notNull()
                t.column("size", .integer).notNull()
                t.column("protectionClass", .integer)
                t.column("sha256", .text)
                t.column("linkTarget", .blob)
                t.column("thisDeviceOnly", .boolean).notNull().defaults(to: false)
                t.column("sealed", .boolean).notNull().defaults(to: false)
                t.column("defaultClass", .integer)
                t.column("chunked", .boolean).notNull().defaults(to: false)
                t.column("encryptedDatabase", .boolean).notNull().defaults(to: false)
            }
            try db.execute(sql: "INSERT INTO meta(key, value) VALUES ('format', ?)", arguments: ["\(formatVersion)"])
        }
        return BackupManifest(queue: queue, format: formatVersion)
    }

    /// Opens an existing manifest file, read-only.
    public static func open(at url: URL) throws -> BackupManifest {
        var configuration = Configuration()
        configuration.readonly = true
        return try checked(DatabaseQueue(path: url.path, configuration: configuration), url.path)
    }

    /// Opens a manifest on disk for adding entries (the device's partial index).
    static func openForUpdate(at url: URL) throws -> BackupManifest {
        try checked(DatabaseQueue(path: url.path), url.path)
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
            guard
                sqlite3_deserialize(
                    db.sqliteConnection, "main", buffer.assumingMemoryBound(to: UInt8.self),
                    sqlite3_int64(bytes.count), sqlite3_int64(bytes.count), flags) == SQLITE_OK
            else {
                throw BackupError.badBackup(path: path, reason: "the manifest is not an SQLite database")
            }
        }
        return try checked(queue, path)
    }

    private static func checked(_ queue: DatabaseQueue, _ path: String) throws -> BackupManifest {
        let format = try? queue.read { db in
            try String.fetchOne(db, sql: "SELECT CAST(value AS TEXT) FROM meta WHERE key = 'format'")
        }
        guard let format, let number = Int(format), readableFormats.contains(number) else {
            throw BackupError.badBackup(
                path: path,
                reason:
                    "manifest format \(format ?? "?") is not supported by this build (it reads formats \(readableFormats.map(String.init).joined(separator: " and ")))"
            )
        }
        return BackupManifest(queue: queue, format: number)
    }

    /// Adds or replaces entries (by path): the partial index of an interrupted backup.
    func upsert(_ entries: [ManifestEntry]) throws {
        try queue.write { db in for entry in entries { try entry.insert(db, onConflict: .replace) } }
    }

    func insert(_ entries: [ManifestEntry], meta: [String: String]) throws {
        try queue.write { db in
            for entry in entries { try entry.insert(db) }
            for (key, value) in meta {
                try db.execute(sql: "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", arguments: [key, value])
            }
        }
    }

    /// Every entry, parents before children (byte order: a path sorts before its extensions).
    /// - Throws: ``BackupError/badBackup(path:reason:)`` for any entry that fails validation.
    public func entries() throws -> [ManifestEntry] {
        do {
            // Named columns: a manifest whose schema was changed fails here with an SQL error.
            return try queue.read { db in
                try ManifestEntry.fetchAll(
                    db,
                    sql: """
                        SELECT path, kind, mode, mtime, size, protectionClass, sha256, linkTarget, thisDeviceOnly, sealed,
                               \(format >= 3 ? "defaultClass" : "NULL AS defaultClass"),
                               \(format >= 4 ? "chunked, encryptedDatabase" : "0 AS chunked, 0 AS encryptedDatabase")
                        FROM entry ORDER BY CAST(path AS BLOB)
                        """)
            }
        } catch let error as BackupError {
            throw error
        } catch {
            throw BackupError.badBackup(path: "manifest", reason: "the entry table cannot be read (\(error))")
        }
    }

    /// A metadata value (`source`, `created`, `keybag` …).
    public func meta(_ key: String) throws -> String? {
        try queue.read { db in
            try String.fetchOne(db, sql: "SELECT CAST(value AS TEXT) FROM meta WHERE key = ?", arguments: [key])
        }
    }
}
