import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

// SQLiteObjectStore: reading.
extension SQLiteObjectStore {
    // MARK: - Reading

    /// Every column of a root table, as `t0.…`: what a row of an object is read with.
    func selectList(_ root: String) -> String { selectLists[root] ?? "t0.Z_PK" }

    func decodeNode(_ row: Row, root: String) throws -> StoreNode {
        try decodeNode(row, root: root, plans: rowDecodings[root] ?? [:])
    }

    /// Refuses entities of another model (their tables may not exist here).
    func check(_ entity: Entity) throws {
        guard model.entitiesByName[entity.name] === entity else {
            throw ObjectGraphError.unknownEntity("\(entity.name) (an entity of another model than this store's)")
        }
    }

    public func node(for objectID: ObjectID) throws -> StoreNode {
        try check(objectID.entity)
        let root = objectID.entity.root
        return try read { db in
            let statement = try db.cachedStatement(
                sql: "SELECT \(selectList(root)) FROM \(SQLiteSchema.quote(root)) AS t0 WHERE t0.Z_PK = ?")
            guard let row = try Row.fetchOne(statement, arguments: [objectID.primaryKey]) else {
                throw ObjectGraphError.objectDeleted(objectID.description)
            }
            return try decodeNode(row, root: root)
        }
    }

    /// Rows of many objects of one root entity at once (batch fault firing), by key within
    /// each run of 500 (all by key when the IDs are).
    public func nodes(for objectIDs: [ObjectID]) throws -> [StoreNode] {
        guard let root = objectIDs.first?.entity.root else { return [] }
        for id in objectIDs { try check(id.entity) }
        let plans = rowDecodings[root] ?? [:]
        return try read { db in
            var nodes: [StoreNode] = []
            nodes.reserveCapacity(objectIDs.count)
            for chunk in stride(from: 0, to: objectIDs.count, by: 500).map({
                objectIDs[$0..<min($0 + 500, objectIDs.count)]
            }) {
                let sql =
                    "SELECT \(selectList(root)) FROM \(SQLiteSchema.quote(root)) AS t0 WHERE t0.Z_PK IN (\(Array(repeating: "?", count: chunk.count).joined(separator: ","))) ORDER BY t0.Z_PK"
                try db.cachedStatement(sql: sql).forEachRow(keys: chunk.lazy.map(\.primaryKey)) { row in
                    nodes.append(try decodeNode(row, root: root, plans: plans))
                }
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
        let filter =
            builder.entityCondition(destination, includesSubentities: true, alias: "d").map { " AND " + $0 } ?? ""
        let sql: String
        if let inverse = entity.inverseToOne(of: relationship) {
            let column = schema.layouts[destination.name]!.toOneColumns[destination.toOneIndex[inverse.name]!]
            sql =
                "SELECT d.Z_PK, d.Z_ENT FROM \(table) AS d WHERE d.\(SQLiteSchema.quote(column)) = ?\(filter) ORDER BY d.Z_PK"
        } else if let join = entity.joinTable(for: relationship) {
            let (mine, theirs) = join.sourceIsFirst ? ("Z_1", "Z_2") : ("Z_2", "Z_1")
            sql =
                "SELECT d.Z_PK, d.Z_ENT FROM \(SQLiteSchema.quote(join.name)) AS j JOIN \(table) AS d ON d.Z_PK = j.\(theirs) WHERE j.\(mine) = ?\(filter) ORDER BY d.Z_PK"
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
        if let filter = builder.entityCondition(entity, includesSubentities: request.includesSubentities, alias: "t0") {
            conditions.append(filter)
        }
        if let predicate = request.predicate {
            conditions.append(try builder.condition(predicate, entity: entity, alias: "t0"))
        }
        var order: [String] = []
        for key in request.sortKeys {
            order.append(
                try builder.column(key.path, entity: entity, alias: "t0").sql + (key.ascending ? " ASC" : " DESC"))
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
                let column = try builder.column(
                    property.split(separator: ".").map(String.init), entity: entity, alias: "t0",
                    forComparison: false)
                guard case .attribute(let type) = column.kind else {
                    throw ObjectGraphError.unsupportedPredicate(
                        "\(property) is a relationship; dictionaries hold attributes")
                }
                columns.append(column.sql)
                dictionaryColumns.append((property, type))
            }
            selection = columns.isEmpty ? "t0.Z_PK" : columns.joined(separator: ", ")
        }
        var sql =
            "SELECT \(selection) FROM \(SQLiteSchema.quote(entity.root)) AS t0 \(builder.joinClauses.joined(separator: " "))"
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
        if request.limit != nil || request.offset > 0 {
            sql += " LIMIT \(request.limit ?? -1) OFFSET \(request.offset)"
        }
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
                let plans = rowDecodings[root] ?? [:]
                while let row = try rows.next() { nodes.append(try decodeNode(row, root: root, plans: plans)) }
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
                        throw ObjectGraphError.damagedStore(
                            store: path, detail: "unknown entity code \(code) in \(root)")
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
                    for (i, (name, type)) in dictionaryColumns.enumerated() {
                        dictionary[name] = try attributeValue(row[i], type: type)
                    }
                    result.append(dictionary)
                }
                return .dictionaries(result)
            }
        }
    }
}
