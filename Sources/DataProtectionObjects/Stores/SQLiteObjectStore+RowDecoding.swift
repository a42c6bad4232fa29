import DataProtection
import Foundation
import GRDB
import GRDBSQLite

// SQLiteObjectStore: how a row of each entity is read, worked out once per store.
extension SQLiteObjectStore {
    /// What reading a row of one entity needs, looked up once when the store opens rather than by
    /// name for every row: the entity, where its columns are, and each to-one's destination (with
    /// the destination root's entities by code, for a row naming a sub-entity). A class: a row
    /// takes one reference, not a copy of every array.
    final class RowDecoding: Sendable {
        let entity: Entity
        let attributeTypes: [AttributeType]
        /// Result columns (after `Z_PK, Z_ENT, Z_OPT`) of each attribute, to-one key and
        /// to-one entity code.
        let attributeColumns: [Int]
        let toOneColumns: [Int]
        let toOneEntityColumns: [Int?]
        let toOneDestinations: [Entity]
        let toOneCodes: [[Int64: Entity]]

        init(entity: Entity, layout: SQLiteSchema.EntityLayout, entitiesByCode: [String: [Int64: Entity]]) {
            self.entity = entity
            attributeTypes = entity.attributes.map(\.type)
            attributeColumns = layout.attributePositions.map { $0 + 3 }
            toOneColumns = layout.toOnePositions.map { $0 + 3 }
            toOneEntityColumns = layout.toOneEntityPositions.map { $0.map { $0 + 3 } }
            toOneDestinations = entity.toOneRelationships.map { entity.destination(of: $0) }
            toOneCodes = toOneDestinations.map { entitiesByCode[$0.root] ?? [:] }
        }

        /// Each root table's rows by entity code.
        static func all(
            model: ObjectModel, schema: SQLiteSchema, entitiesByCode: [String: [Int64: Entity]]
        ) -> [String: [Int64: RowDecoding]] {
            var plans: [String: [Int64: RowDecoding]] = [:]
            for entity in model.entities {
                guard let layout = schema.layouts[entity.name] else { continue }
                plans[entity.root, default: [:]][entity.code] = RowDecoding(
                    entity: entity, layout: layout, entitiesByCode: entitiesByCode)
            }
            return plans
        }
    }

    /// The node a row holds (`Z_PK, Z_ENT, Z_OPT` then the root table's columns), read with the
    /// root's plans.
    func decodeNode(_ row: some ResultColumns, root: String, plans: [Int64: RowDecoding]) throws -> StoreNode {
        let key = row.integer(0) ?? 0
        let code = row.integer(1) ?? 0
        guard let plan = plans[code] else {
            throw ObjectGraphError.damagedStore(
                store: path, detail: "row \(key) of \(root) has unknown entity code \(code)")
        }
        var values: [AttributeValue] = []
        values.reserveCapacity(plan.attributeTypes.count)
        for (i, type) in plan.attributeTypes.enumerated() {
            values.append(try attributeValue(row.value(plan.attributeColumns[i]), type: type))
        }
        var toOne: [ObjectID?] = []
        toOne.reserveCapacity(plan.toOneDestinations.count)
        for (i, destination) in plan.toOneDestinations.enumerated() {
            guard let target = row.integer(plan.toOneColumns[i]) else { toOne.append(nil); continue }
            var concrete = destination
            if let column = plan.toOneEntityColumns[i], let code = row.integer(column),
                let named = plan.toOneCodes[i][code]
            {
                concrete = named
            }
            toOne.append(ObjectID(entity: concrete, primaryKey: target))
        }
        return StoreNode(
            objectID: ObjectID(entity: plan.entity, primaryKey: key), values: values, toOne: toOne,
            version: row.integer(2) ?? 0)
    }
}

/// The columns of one result row, by index from 0.
protocol ResultColumns {
    func value(_ index: Int) -> DatabaseValue
    /// The column as an integer, `nil` when it is NULL (or not an integer).
    func integer(_ index: Int) -> Int64?
}

extension Row: ResultColumns {
    func value(_ index: Int) -> DatabaseValue { self[index] }
    /// `nil` for NULL and for a value that is no integer (a damaged row: never a trap).
    func integer(_ index: Int) -> Int64? { Int64.fromDatabaseValue(self[index]) }
}

/// The row an SQLite statement is on, read with `sqlite3_column_*` (what GRDB's `Row` reads,
/// without its generic decoding per value).
struct StatementColumns: ResultColumns {
    let statement: SQLiteStatement

    func value(_ index: Int) -> DatabaseValue {
        let column = CInt(index)
        switch sqlite3_column_type(statement, column) {
        case SQLITE_INTEGER: return sqlite3_column_int64(statement, column).databaseValue
        case SQLITE_FLOAT: return sqlite3_column_double(statement, column).databaseValue
        case SQLITE_TEXT:
            // As GRDB's `Row` reads text (up to a NUL), so both paths give the same string.
            guard let bytes = sqlite3_column_text(statement, column) else { return "".databaseValue }
            return String(cString: bytes).databaseValue
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, column))
            guard count > 0, let bytes = sqlite3_column_blob(statement, column) else { return Data().databaseValue }
            return Data(bytes: bytes, count: count).databaseValue
        default: return .null
        }
    }

    func integer(_ index: Int) -> Int64? {
        switch sqlite3_column_type(statement, CInt(index)) {
        case SQLITE_INTEGER: sqlite3_column_int64(statement, CInt(index))
        case SQLITE_NULL: nil
        default: Int64.fromDatabaseValue(value(index))   // converted as `Row` would; nil where it cannot be
        }
    }
}
