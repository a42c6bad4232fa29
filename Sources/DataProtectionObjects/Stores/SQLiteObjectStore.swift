import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

/// The object store on an SQLite database — encrypted under a protection class when opened
/// with a keybag — the way LINE put SQLCipher under CoreData with an `NSIncrementalStore`.
/// The table layout is in docs/FORMAT.md §9.
///
/// ```swift
/// let store = try await SQLiteObjectStore.open(at: url, keybag: keybag, protection: .complete, model: model)
/// let context = ObjectContext(store: store)
/// ```
///
/// A class-A store follows the lock: once the grace period ends, every call fails with
/// ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``; after the next
/// unlock the same store (and its contexts) work again.
///
/// Opening applies a lightweight migration when the model only grew (new entities, new
/// optional or defaulted attributes, new relationships, new indexes) and refuses any other
/// change with ``ObjectGraphError/incompatibleModel(store:reason:)``, changing nothing.
public final class SQLiteObjectStore: PersistentStore {
    public let model: ObjectModel
    /// The database file.
    public let path: String
    /// The encrypted database under it, when opened with a keybag.
    public let protectedDatabase: ProtectedDatabase?
    /// The GRDB connection(s): everything GRDB offers works on it, read-only please.
    public let writer: any DatabaseWriter
    let schema: SQLiteSchema
    let metadata: StoreMetadata
    let entitiesByCode: [String: [Int64: Entity]]
    /// Built once: the select list of each root table (fault firing uses it on every query).
    let selectLists: [String: String]
    /// Built once: how each entity's rows are read, by root table and entity code.
    let rowDecodings: [String: [Int64: RowDecoding]]

    static let lowercaseFunction = "dp_lower"
    static let endsWithFunction = "dp_ends_with"

    /// Opens (creating, or migrating) an encrypted store at `url` whose key is wrapped under
    /// `protection` (or the directory's default class).
    public static func open(
        at url: URL, keybag: Keybag, protection: ProtectionClass? = nil, model: ObjectModel,
        configuration: Configuration = Configuration()
    ) async throws -> SQLiteObjectStore {
        let database = try await ProtectedDatabase.open(
            at: url, keybag: keybag, protection: protection, mode: .pool,
            configuration: prepared(configuration))
        return try SQLiteObjectStore(
            model: model, path: url.path, writer: try database.writer, protectedDatabase: database)
    }

    /// Opens (creating, or migrating) a store on a plain — unencrypted — SQLite file.
    public convenience init(path: String, model: ObjectModel, configuration: Configuration = Configuration()) throws {
        try self.init(
            model: model, path: path, writer: try DatabasePool(path: path, configuration: Self.prepared(configuration)),
            protectedDatabase: nil)
    }

    static func prepared(_ configuration: Configuration) -> Configuration {
        var configuration = configuration
        configuration.prepareDatabase { db in   // added to the caller's own setup, which runs first
            db.add(
                function: DatabaseFunction(lowercaseFunction, argumentCount: 1, pure: true) { values in
                    String.fromDatabaseValue(values[0]).map { $0.lowercased() }
                })
            db.add(
                function: DatabaseFunction(endsWithFunction, argumentCount: 2, pure: true) { values in
                    guard let text = String.fromDatabaseValue(values[0]),
                        let suffix = String.fromDatabaseValue(values[1])
                    else { return nil }
                    let t = Array(text.utf8), s = Array(suffix.utf8)
                    return t.count >= s.count && t.suffix(s.count).elementsEqual(s)
                })
        }
        return configuration
    }

    private init(
        model: ObjectModel, path: String, writer: any DatabaseWriter, protectedDatabase: ProtectedDatabase?
    ) throws {
        self.model = model
        self.path = path
        self.writer = writer
        self.protectedDatabase = protectedDatabase
        self.schema = SQLiteSchema(model: model)
        var codes: [String: [Int64: Entity]] = [:]
        for entity in model.entities { codes[entity.root, default: [:]][entity.code] = entity }
        self.entitiesByCode = codes
        self.rowDecodings = RowDecoding.all(model: model, schema: schema, entitiesByCode: codes)
        self.selectLists = schema.tables.mapValues { table in
            (["Z_PK", "Z_ENT", "Z_OPT"] + table.columns.map { SQLiteSchema.quote($0.name) }).map { "t0.\($0)" }.joined(
                separator: ", ")
        }
        self.metadata = try Self.prepareSchema(
            writer: writer, schema: schema, path: path, protectedDatabase: protectedDatabase)
    }

    /// Creates the tables of a new store, or migrates an existing one to the model.
    static func prepareSchema(
        writer: any DatabaseWriter, schema: SQLiteSchema, path: String,
        protectedDatabase: ProtectedDatabase?
    ) throws -> StoreMetadata {
        do {
            return try writer.write { db -> StoreMetadata in
                try db.execute(
                    sql: "CREATE TABLE IF NOT EXISTS Z_METADATA (Z_KEY TEXT PRIMARY KEY, Z_VALUE BLOB NOT NULL)")
                try db.execute(
                    sql: "CREATE TABLE IF NOT EXISTS Z_PRIMARYKEY (Z_NAME TEXT PRIMARY KEY, Z_MAX INTEGER NOT NULL)")
                let stored = try Dictionary(
                    uniqueKeysWithValues: Row.fetchAll(db, sql: "SELECT Z_KEY, Z_VALUE FROM Z_METADATA")
                        .map { ($0[0] as String, $0[1] as Data) })
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                let modelJSON = try encoder.encode(schema.model.descriptions)
                func save(_ identifier: String) throws {
                    for (key, value) in [
                        ("storeIdentifier", Data(identifier.utf8)),
                        ("modelVersionHash", Data(schema.model.versionHash.utf8)),
                        ("model", modelJSON), ("format", Data("1".utf8)),
                    ] {
                        try db.execute(
                            sql: "INSERT OR REPLACE INTO Z_METADATA (Z_KEY, Z_VALUE) VALUES (?, ?)",
                            arguments: [key, value])
                    }
                }
                guard let identifier = stored["storeIdentifier"].flatMap({ String(data: $0, encoding: .utf8) }) else {
                    guard stored.isEmpty else {
                        throw ObjectGraphError.damagedStore(store: path, detail: "metadata without a store identifier")
                    }
                    for statement in schema.createStatements() { try db.execute(sql: statement) }
                    let identifier = UUID().uuidString
                    try save(identifier)
                    return StoreMetadata(
                        storeIdentifier: UUID(uuidString: identifier)!, modelVersionHash: schema.model.versionHash,
                        storeType: "SQLite")
                }
                guard let uuid = UUID(uuidString: identifier), stored["format"] == Data("1".utf8) else {
                    throw ObjectGraphError.damagedStore(store: path, detail: "unknown store format")
                }
                let storedHash = stored["modelVersionHash"].flatMap { String(data: $0, encoding: .utf8) }
                if storedHash != schema.model.versionHash {
                    guard let json = stored["model"],
                        let descriptions = try? JSONDecoder().decode([EntityDescription].self, from: json),
                        let old = try? ObjectModel(descriptions)
                    else {
                        throw ObjectGraphError.damagedStore(store: path, detail: "the stored model cannot be read")
                    }
                    switch schema.migration(from: old) {
                    case .failure(.incompatibleModel(_, let reason)):
                        throw ObjectGraphError.incompatibleModel(store: path, reason: reason)
                    case .failure(let error): throw error
                    case .success(let statements): for statement in statements { try db.execute(sql: statement) }
                    }
                    try save(identifier)
                }
                return StoreMetadata(
                    storeIdentifier: uuid, modelVersionHash: schema.model.versionHash, storeType: "SQLite")
            }
        } catch {
            throw Self.explain(error, protectedDatabase: protectedDatabase, writing: true)
        }
    }

    public func loadMetadata() throws -> StoreMetadata { metadata }

    /// Returns once the store can be used again after an unlock (its keys come back by
    /// themselves as the unlock event is delivered; this waits for that). Throws the typed
    /// ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` while the
    /// class is unavailable.
    public func restoreAccess() async throws {
        try await protectedDatabase?.restoreAccess()
    }

    /// Closes the database connections.
    public func close() async throws {
        if let protectedDatabase { try await protectedDatabase.close() } else { try writer.close() }
    }

    // MARK: Access

    static func explain(_ error: any Error, protectedDatabase: ProtectedDatabase?, writing: Bool) -> any Error {
        if error is ObjectGraphError { return error }
        if let protectedDatabase { return protectedDatabase.explain(error, writing: writing) }
        return error
    }

    func read<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try writer.read(body) } catch {
            throw Self.explain(error, protectedDatabase: protectedDatabase, writing: false)
        }
    }

    func write<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try writer.write(body) } catch {
            throw Self.explain(error, protectedDatabase: protectedDatabase, writing: true)
        }
    }

}
