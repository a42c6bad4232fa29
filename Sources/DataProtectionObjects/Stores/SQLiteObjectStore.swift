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
    private let metadata: StoreMetadata
    private let entitiesByCode: [String: [Int64: Entity]]
    /// Built once: the select list of each root table (fault firing uses it on every query).
    private let selectLists: [String: String]

    static let lowercaseFunction = "dp_lower"
    static let endsWithFunction = "dp_ends_with"

    /// Opens (creating, or migrating) an encrypted store at `url` whose key is wrapped under
    /// `protection` (or the directory's default class).
    public static func open(at url: URL, keybag: Keybag, protection: ProtectionClass? = nil, model: ObjectModel,
                            configuration: Configuration = Configuration()) async throws -> SQLiteObjectStore {
        let database = try await ProtectedDatabase.open(at: url, keybag: keybag, protection: protection, mode: .pool,
                                                       configuration: prepared(configuration))
        return try SQLiteObjectStore(model: model, path: url.path, writer: try database.writer, protectedDatabase: database)
    }

    /// Opens (creating, or migrating) a store on a plain — unencrypted — SQLite file.
    public convenience init(path: String, model: ObjectModel, configuration: Configuration = Configuration()) throws {
        try self.init(model: model, path: path, writer: try DatabasePool(path: path, configuration: Self.prepared(configuration)),
                      protectedDatabase: nil)
    }

    private static func prepared(_ configuration: Configuration) -> Configuration {
        var configuration = configuration
        configuration.prepareDatabase { db in   // added to the caller's own setup, which runs first
            db.add(function: DatabaseFunction(lowercaseFunction, argumentCount: 1, pure: true) { values in
                String.fromDatabaseValue(values[0]).map { $0.lowercased() }
            })
            db.add(function: DatabaseFunction(endsWithFunction, argumentCount: 2, pure: true) { values in
                guard let text = String.fromDatabaseValue(values[0]), let suffix = String.fromDatabaseValue(values[1]) else { return nil }
                let t = Array(text.utf8), s = Array(suffix.utf8)
                return t.count >= s.count && t.suffix(s.count).elementsEqual(s)
            })
        }
        return configuration
    }

    private init(model: ObjectModel, path: String, writer: any DatabaseWriter, protectedDatabase: ProtectedDatabase?) throws {
        self.model = model
        self.path = path
        self.writer = writer
        self.protectedDatabase = protectedDatabase
        self.schema = SQLiteSchema(model: model)
        var codes: [String: [Int64: Entity]] = [:]
        for entity in model.entities { codes[entity.root, default: [:]][entity.code] = entity }
        self.entitiesByCode = codes
        self.selectLists = schema.tables.mapValues { table in
            (["Z_PK", "Z_ENT", "Z_OPT"] + table.columns.map { SQLiteSchema.quote($0.name) }).map { "t0.\($0)" }.joined(separator: ", ")
        }
        self.metadata = try Self.prepareSchema(writer: writer, schema: schema, path: path, protectedDatabase: protectedDatabase)
    }

    /// Creates the tables of a new store, or migrates an existing one to the model.
    private static func prepareSchema(writer: any DatabaseWriter, schema: SQLiteSchema, path: String,
                                      protectedDatabase: ProtectedDatabase?) throws -> StoreMetadata {
        do {
            return try writer.write { db -> StoreMetadata in
                try db.execute(sql: "CREATE TABLE IF NOT EXISTS Z_METADATA (Z_KEY TEXT PRIMARY KEY, Z_VALUE BLOB NOT NULL)")
                try db.execute(sql: "CREATE TABLE IF NOT EXISTS Z_PRIMARYKEY (Z_NAME TEXT PRIMARY KEY, Z_MAX INTEGER NOT NULL)")
                let stored = try Dictionary(uniqueKeysWithValues: Row.fetchAll(db, sql: "SELECT Z_KEY, Z_VALUE FROM Z_METADATA")
                    .map { ($0[0] as String, $0[1] as Data) })
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                let modelJSON = try encoder.encode(schema.model.descriptions)
                func save(_ identifier: String) throws {
                    for (key, value) in [("storeIdentifier", Data(identifier.utf8)), ("modelVersionHash", Data(schema.model.versionHash.utf8)),
                                         ("model", modelJSON), ("format", Data("1".utf8))] {
                        try db.execute(sql: "INSERT OR REPLACE INTO Z_METADATA (Z_KEY, Z_VALUE) VALUES (?, ?)", arguments: [key, value])
                    }
                }
                guard let identifier = stored["storeIdentifier"].flatMap({ String(data: $0, encoding: .utf8) }) else {
                    guard stored.isEmpty else { throw ObjectGraphError.damagedStore(store: path, detail: "metadata without a store identifier") }
                    for statement in schema.createStatements() { try db.execute(sql: statement) }
                    let identifier = UUID().uuidString
                    try save(identifier)
                    return StoreMetadata(storeIdentifier: UUID(uuidString: identifier)!, modelVersionHash: schema.model.versionHash, storeType: "SQLite")
                }
                guard let uuid = UUID(uuidString: identifier), stored["format"] == Data("1".utf8) else {
                    throw ObjectGraphError.damagedStore(store: path, detail: "unknown store format")
                }
                let storedHash = stored["modelVersionHash"].flatMap { String(data: $0, encoding: .utf8) }
                if storedHash != schema.model.versionHash {
                    guard let json = stored["model"], let descriptions = try? JSONDecoder().decode([EntityDescription].self, from: json),
                          let old = try? ObjectModel(descriptions) else {
                        throw ObjectGraphError.damagedStore(store: path, detail: "the stored model cannot be read")
                    }
                    switch schema.migration(from: old) {
                    case .failure(.incompatibleModel(_, let reason)): throw ObjectGraphError.incompatibleModel(store: path, reason: reason)
                    case .failure(let error): throw error
                    case .success(let statements): for statement in statements { try db.execute(sql: statement) }
                    }
                    try save(identifier)
                }
                return StoreMetadata(storeIdentifier: uuid, modelVersionHash: schema.model.versionHash, storeType: "SQLite")
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

    private static func explain(_ error: any Error, protectedDatabase: ProtectedDatabase?, writing: Bool) -> any Error {
        if error is ObjectGraphError { return error }
        if let protectedDatabase { return protectedDatabase.explain(error, writing: writing) }
        return error
    }

    func read<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try writer.read(body) } catch { throw Self.explain(error, protectedDatabase: protectedDatabase, writing: false) }
    }

    func write<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try writer.write(body) } catch { throw Self.explain(error, protectedDatabase: protectedDatabase, writing: true) }
    }

    // MARK: Values

    /// How an attribute value is bound: for storage (decimals as exact text) or for comparison.
    static func databaseValue(_ value: AttributeValue, forStorage: Bool) -> DatabaseValue {
        switch value {
        case .null: .null
        case .integer(let v): v.databaseValue
        case .boolean(let v): (v ? 1 : 0 as Int64).databaseValue
        case .double(let v): v.databaseValue
        case .date(let v): v.timeIntervalSinceReferenceDate.databaseValue
        case .decimal(let v): forStorage ? v.description.databaseValue : NSDecimalNumber(decimal: v).doubleValue.databaseValue
        case .string(let v): v.databaseValue
        case .url(let v): v.absoluteString.databaseValue
        case .data(let v): v.databaseValue
        case .uuid(let v): withUnsafeBytes(of: v.uuid) { Data($0) }.databaseValue
        }
    }

    private func attributeValue(_ value: DatabaseValue, type: AttributeType) throws -> AttributeValue {
        switch (value.storage, type) {
        case (.null, _): return .null
        case (.int64(let v), .integer16), (.int64(let v), .integer32), (.int64(let v), .integer64): return .integer(v)
        case (.int64(let v), .boolean): return .boolean(v != 0)
        case (.double(let v), .double): return .double(v)
        case (.int64(let v), .double): return .double(Double(v))
        case (.double(let v), .date): return .date(Date(timeIntervalSinceReferenceDate: v))
        case (.int64(let v), .date): return .date(Date(timeIntervalSinceReferenceDate: Double(v)))
        case (.string(let v), .decimal): if let d = Decimal(string: v, locale: Locale(identifier: "en_US_POSIX")) { return .decimal(d) }
        case (.double(let v), .decimal): return .decimal(Decimal(v))
        case (.int64(let v), .decimal): return .decimal(Decimal(v))
        case (.string(let v), .string): return .string(v)
        case (.string(let v), .uri): if let url = URL(string: v) { return .url(url) }
        case (.blob(let v), .binaryData): return .data(v)
        case (.blob(let v), .uuid) where v.count == 16:
            return .uuid(v.withUnsafeBytes { UUID(uuid: $0.loadUnaligned(as: uuid_t.self)) })
        default: break
        }
        throw ObjectGraphError.damagedStore(store: path, detail: "a column holds \(value) where a \(type) was expected")
    }

    // MARK: Reading

    /// Every column of a root table, as `t0.…`: what a row of an object is read with.
    private func selectList(_ root: String) -> String { selectLists[root] ?? "t0.Z_PK" }

    private func decodeNode(_ row: Row, root: String) throws -> StoreNode {
        let key: Int64 = row[0]
        let code: Int64 = row[1]
        guard let entity = entitiesByCode[root]?[code] else {
            throw ObjectGraphError.damagedStore(store: path, detail: "row \(key) of \(root) has unknown entity code \(code)")
        }
        let layout = schema.layouts[entity.name]!
        var values: [AttributeValue] = []
        values.reserveCapacity(entity.attributes.count)
        for (i, attribute) in entity.attributes.enumerated() {
            values.append(try attributeValue(row[layout.attributePositions[i] + 3], type: attribute.type))
        }
        var toOne: [ObjectID?] = []
        toOne.reserveCapacity(entity.toOneRelationships.count)
        for (i, relationship) in entity.toOneRelationships.enumerated() {
            guard let target: Int64 = row[layout.toOnePositions[i] + 3] else { toOne.append(nil); continue }
            var destination = entity.destination(of: relationship)
            if let position = layout.toOneEntityPositions[i], let code: Int64 = row[position + 3],
               let concrete = entitiesByCode[destination.root]?[code] {
                destination = concrete
            }
            toOne.append(ObjectID(entity: destination, primaryKey: target))
        }
        return StoreNode(objectID: ObjectID(entity: entity, primaryKey: key), values: values, toOne: toOne, version: row[2])
    }

    /// Refuses entities of another model (their tables may not exist here).
    private func check(_ entity: Entity) throws {
        guard model.entitiesByName[entity.name] === entity else {
            throw ObjectGraphError.unknownEntity("\(entity.name) (an entity of another model than this store's)")
        }
    }

    public func node(for objectID: ObjectID) throws -> StoreNode {
        try check(objectID.entity)
        let root = objectID.entity.root
        return try read { db in
            let statement = try db.cachedStatement(sql: "SELECT \(selectList(root)) FROM \(SQLiteSchema.quote(root)) AS t0 WHERE t0.Z_PK = ?")
            guard let row = try Row.fetchOne(statement, arguments: [objectID.primaryKey]) else {
                throw ObjectGraphError.objectDeleted(objectID.description)
            }
            return try decodeNode(row, root: root)
        }
    }

    /// Rows of many objects of one root entity at once (batch fault firing).
    public func nodes(for objectIDs: [ObjectID]) throws -> [StoreNode] {
        guard let root = objectIDs.first?.entity.root else { return [] }
        for id in objectIDs { try check(id.entity) }
        return try read { db in
            var nodes: [StoreNode] = []
            nodes.reserveCapacity(objectIDs.count)
            for chunk in stride(from: 0, to: objectIDs.count, by: 500).map({ objectIDs[$0..<min($0 + 500, objectIDs.count)] }) {
                let sql = "SELECT \(selectList(root)) FROM \(SQLiteSchema.quote(root)) AS t0 WHERE t0.Z_PK IN (\(Array(repeating: "?", count: chunk.count).joined(separator: ",")))"
                let statement = try db.cachedStatement(sql: sql)
                let rows = try Row.fetchCursor(statement, arguments: StatementArguments(chunk.map(\.primaryKey)))
                while let row = try rows.next() { nodes.append(try decodeNode(row, root: root)) }
            }
            return nodes
        }
    }

    public func destinations(of relationship: RelationshipDescription, for objectID: ObjectID) throws -> [ObjectID] {
        try check(objectID.entity)
        let entity = objectID.entity
        let destination = entity.destination(of: relationship)
        let table = SQLiteSchema.quote(destination.root)
        let builder = SQLQueryBuilder(schema: schema)
        let filter = builder.entityCondition(destination, includesSubentities: true, alias: "d").map { " AND " + $0 } ?? ""
        let sql: String
        if let inverse = entity.inverseToOne(of: relationship) {
            let column = schema.layouts[destination.name]!.toOneColumns[destination.toOneIndex[inverse.name]!]
            sql = "SELECT d.Z_PK, d.Z_ENT FROM \(table) AS d WHERE d.\(SQLiteSchema.quote(column)) = ?\(filter) ORDER BY d.Z_PK"
        } else if let join = entity.joinTable(for: relationship) {
            let (mine, theirs) = join.sourceIsFirst ? ("Z_1", "Z_2") : ("Z_2", "Z_1")
            sql = "SELECT d.Z_PK, d.Z_ENT FROM \(SQLiteSchema.quote(join.name)) AS j JOIN \(table) AS d ON d.Z_PK = j.\(theirs) WHERE j.\(mine) = ?\(filter) ORDER BY d.Z_PK"
        } else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: relationship.name)
        }
        let codes = entitiesByCode[destination.root] ?? [:]
        return try read { db in
            let rows = try Row.fetchCursor(db.cachedStatement(sql: sql), arguments: [objectID.primaryKey])
            var ids: [ObjectID] = []
            while let row = try rows.next() {
                let code: Int64 = row[1]
                ids.append(ObjectID(entity: codes[code] ?? destination, primaryKey: row[0]))
            }
            return ids
        }
    }

    public func execute(_ request: StoreFetchRequest) throws -> StoreFetchResult {
        try check(request.entity)
        let entity = request.entity
        // A root table holding one entity needs no Z_ENT to make IDs.
        let monomorphic = (entitiesByCode[entity.root]?.count ?? 0) == 1
        var builder = SQLQueryBuilder(schema: schema)
        var conditions: [String] = []
        if let filter = builder.entityCondition(entity, includesSubentities: request.includesSubentities, alias: "t0") { conditions.append(filter) }
        if let predicate = request.predicate { conditions.append(try builder.condition(predicate, entity: entity, alias: "t0")) }
        var order: [String] = []
        for key in request.sortKeys {
            order.append(try builder.column(key.path, entity: entity, alias: "t0").sql + (key.ascending ? " ASC" : " DESC"))
        }
        order.append("t0.Z_PK ASC")
        var selection: String
        var dictionaryColumns: [(String, AttributeType)] = []
        switch request.resultType {
        case .objects where request.includesPropertyValues: selection = selectList(entity.root)
        case .objects, .objectIDs, .count: selection = monomorphic ? "t0.Z_PK" : "t0.Z_PK, t0.Z_ENT"
        case .dictionaries(let properties):
            var columns: [String] = []
            for property in properties {
                let column = try builder.column(property.split(separator: ".").map(String.init), entity: entity, alias: "t0",
                                                forComparison: false)
                guard case .attribute(let type) = column.kind else {
                    throw ObjectGraphError.unsupportedPredicate("\(property) is a relationship; dictionaries hold attributes")
                }
                columns.append(column.sql)
                dictionaryColumns.append((property, type))
            }
            selection = columns.isEmpty ? "t0.Z_PK" : columns.joined(separator: ", ")
        }
        var sql = "SELECT \(selection) FROM \(SQLiteSchema.quote(entity.root)) AS t0 \(builder.joinClauses.joined(separator: " "))"
        if !conditions.isEmpty { sql += " WHERE " + conditions.joined(separator: " AND ") }
        // Keys alone, unsorted and unlimited: let SQLite scan whichever index is smallest and
        // put the keys in order here (a table scan would decrypt every row's page).
        let keysOnly: Bool
        switch request.resultType {
        case .objectIDs: keysOnly = true
        case .objects: keysOnly = !request.includesPropertyValues
        default: keysOnly = false
        }
        let sortKeysHere = keysOnly && request.sortKeys.isEmpty && request.limit == nil && request.offset == 0
        if !sortKeysHere { sql += " ORDER BY " + order.joined(separator: ", ") }
        if request.limit != nil || request.offset > 0 { sql += " LIMIT \(request.limit ?? -1) OFFSET \(request.offset)" }
        let arguments = StatementArguments(builder.arguments)
        if case .count = request.resultType { sql = "SELECT COUNT(*) FROM (\(sql))" }
        let root = entity.root
        let codes = entitiesByCode[root] ?? [:]
        return try read { db in
            let statement = try db.cachedStatement(sql: sql)
            statement.setUncheckedArguments(arguments)
            switch request.resultType {
            case .count:
                return .count(try Int.fetchOne(statement) ?? 0)
            case .objects where request.includesPropertyValues:
                var nodes: [StoreNode] = []
                let rows = try Row.fetchCursor(statement)
                while let row = try rows.next() { nodes.append(try decodeNode(row, root: root)) }
                return .nodes(nodes)
            case .objects, .objectIDs:
                if monomorphic {
                    var keys = try Int64.fetchAll(statement)
                    if sortKeysHere { keys.sort() }
                    return .objectIDs(keys.map { ObjectID(entity: entity, primaryKey: $0) })
                }
                var ids: [ObjectID] = []
                let rows = try Row.fetchCursor(statement)
                while let row = try rows.next() {
                    let code: Int64 = row[1]
                    guard let concrete = codes[code] else {
                        throw ObjectGraphError.damagedStore(store: path, detail: "unknown entity code \(code) in \(root)")
                    }
                    ids.append(ObjectID(entity: concrete, primaryKey: row[0]))
                }
                if sortKeysHere { ids.sort { $0.primaryKey < $1.primaryKey } }
                return .objectIDs(ids)
            case .dictionaries:
                var result: [[String: AttributeValue]] = []
                let rows = try Row.fetchCursor(statement)
                while let row = try rows.next() {
                    var dictionary: [String: AttributeValue] = [:]
                    for (i, (name, type)) in dictionaryColumns.enumerated() { dictionary[name] = try attributeValue(row[i], type: type) }
                    result.append(dictionary)
                }
                return .dictionaries(result)
            }
        }
    }

    // MARK: Writing

    public func obtainPermanentIDs(for entity: Entity, count: Int) throws -> [ObjectID] {
        guard count > 0 else { return [] }
        try check(entity)
        let root = entity.root
        let last: Int64 = try write { db in
            try db.execute(sql: "INSERT OR IGNORE INTO Z_PRIMARYKEY (Z_NAME, Z_MAX) VALUES (?, 0)", arguments: [root])
            return try Int64.fetchOne(db, sql: """
                UPDATE Z_PRIMARYKEY SET Z_MAX = max(Z_MAX, (SELECT coalesce(max(Z_PK), 0) FROM \(SQLiteSchema.quote(root)))) + ?
                WHERE Z_NAME = ? RETURNING Z_MAX
                """, arguments: [count, root])!
        }
        let first = last - Int64(count) + 1
        return (0..<Int64(count)).map { ObjectID(entity: entity, primaryKey: first + $0) }
    }

    private func rowArguments(_ change: StoreObjectChange) -> [DatabaseValue] {
        let entity = change.objectID.entity
        let table = schema.tables[entity.root]!
        let layout = schema.layouts[entity.name]!
        var columns = [DatabaseValue](repeating: .null, count: table.columns.count)
        for (i, value) in change.values.enumerated() {
            columns[layout.attributePositions[i]] = Self.databaseValue(value, forStorage: true)
        }
        for (i, target) in change.toOne.enumerated() {
            columns[layout.toOnePositions[i]] = target.map { $0.primaryKey.databaseValue } ?? .null
            if let position = layout.toOneEntityPositions[i] { columns[position] = target.map { $0.entity.code.databaseValue } ?? .null }
        }
        return columns
    }

    public func execute(_ request: SaveChangesRequest) throws {
        for change in request.inserted + request.updated + request.deleted { try check(change.objectID.entity) }
        for change in request.relationChanges { try check(change.source.entity) }
        try write { db in
            var conflicts: [String] = []
            for change in request.inserted {
                let root = change.objectID.entity.root
                let table = schema.tables[root]!
                let statement = try db.cachedStatement(sql: "INSERT INTO \(SQLiteSchema.quote(root)) (Z_PK, Z_ENT, Z_OPT\(table.columns.map { ", " + SQLiteSchema.quote($0.name) }.joined())) VALUES (?, ?, ?\(String(repeating: ", ?", count: table.columns.count)))")
                statement.setUncheckedArguments(StatementArguments([change.objectID.primaryKey.databaseValue, change.objectID.entity.code.databaseValue,
                                                                    change.newVersion.databaseValue] + rowArguments(change)))
                try statement.execute()
            }
            for change in request.updated {
                let root = change.objectID.entity.root
                let table = schema.tables[root]!
                let check = change.expectedVersion == nil ? "" : " AND Z_OPT = ?"
                let statement = try db.cachedStatement(sql: "UPDATE \(SQLiteSchema.quote(root)) SET Z_OPT = ?\(table.columns.map { ", \(SQLiteSchema.quote($0.name)) = ?" }.joined()) WHERE Z_PK = ?\(check)")
                var arguments = [change.newVersion.databaseValue] + rowArguments(change) + [change.objectID.primaryKey.databaseValue]
                if let expected = change.expectedVersion { arguments.append(expected.databaseValue) }
                statement.setUncheckedArguments(StatementArguments(arguments))
                try statement.execute()
                if db.changesCount != 1 { conflicts.append(change.objectID.description) }
            }
            for change in request.deleted {
                let entity = change.objectID.entity
                let check = change.expectedVersion == nil ? "" : " AND Z_OPT = ?"
                let statement = try db.cachedStatement(sql: "DELETE FROM \(SQLiteSchema.quote(entity.root)) WHERE Z_PK = ?\(check)")
                var arguments = [change.objectID.primaryKey.databaseValue]
                if let expected = change.expectedVersion { arguments.append(expected.databaseValue) }
                statement.setUncheckedArguments(StatementArguments(arguments))
                try statement.execute()
                if db.changesCount != 1, change.expectedVersion != nil { conflicts.append(change.objectID.description) }
                for relationship in entity.relationships {
                    guard let join = entity.joinTable(for: relationship) else { continue }
                    try db.execute(sql: "DELETE FROM \(SQLiteSchema.quote(join.name)) WHERE \(join.sourceIsFirst ? "Z_1" : "Z_2") = ?",
                                   arguments: [change.objectID.primaryKey])
                }
            }
            guard conflicts.isEmpty else { throw ObjectGraphError.conflict(objects: conflicts) }
            for change in request.relationChanges {
                let entity = change.source.entity
                guard let relationship = entity.relationship(named: change.relationship), let join = entity.joinTable(for: relationship) else { continue }
                let table = SQLiteSchema.quote(join.name)
                let (mine, theirs) = join.sourceIsFirst ? ("Z_1", "Z_2") : ("Z_2", "Z_1")
                let remove = try db.cachedStatement(sql: "DELETE FROM \(table) WHERE \(mine) = ? AND \(theirs) = ?")
                for target in change.removed { try remove.execute(arguments: [change.source.primaryKey, target.primaryKey]) }
                let add = try db.cachedStatement(sql: "INSERT OR IGNORE INTO \(table) (\(mine), \(theirs)) VALUES (?, ?)")
                for target in change.added { try add.execute(arguments: [change.source.primaryKey, target.primaryKey]) }
            }
        }
    }
}
