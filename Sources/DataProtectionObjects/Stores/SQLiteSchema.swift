import DataProtection
import DataProtectionSystem
import Foundation
import GRDB

/// How a model maps onto SQLite tables (see docs/FORMAT.md §9):
///
/// - one table per root entity, named after it, holding its sub-entities' rows too:
///   `Z_PK INTEGER PRIMARY KEY` (the object's key, never 0), `Z_ENT` (which entity the row is),
///   `Z_OPT` (the version optimistic locking compares), one column per attribute, and one
///   key column per to-one relationship (plus `<name>_ENT` when the destination has
///   sub-entities);
/// - one join table `Z_<Entity>_<relationship>` (`Z_1`, `Z_2`) per many-to-many relationship
///   or to-many without inverse; a to-many whose inverse is a to-one is read through that
///   key column, so the two can never disagree;
/// - indexes from the model, and one on every key column;
/// - `Z_METADATA` (store identifier, model hash, model) and `Z_PRIMARYKEY` (the last key given
///   out per root table).
struct SQLiteSchema {
    let model: ObjectModel
    /// Per root entity: its table's columns, and per entity where its properties are.
    private(set) var tables: [String: TableLayout] = [:]
    private(set) var layouts: [String: EntityLayout] = [:]

    struct Column: Equatable {
        let name: String
        let sqlType: String
        let defaultSQL: String?
    }

    struct TableLayout {
        let root: String
        var columns: [Column]   // after Z_PK, Z_ENT, Z_OPT
        var columnIndex: [String: Int]
    }

    struct EntityLayout {
        /// Column name per attribute (entity order).
        let attributeColumns: [String]
        /// Column name per to-one, and its entity column when the destination is polymorphic.
        let toOneColumns: [String]
        let toOneEntityColumns: [String?]
        /// Positions in the table's column list.
        let attributePositions: [Int]
        let toOnePositions: [Int]
        let toOneEntityPositions: [Int?]
    }

    init(model: ObjectModel) {
        self.model = model
        for entity in model.entities where entity.root == entity.name {
            let family = model.entities.filter { $0.root == entity.name }
            var columns: [Column] = []
            var index: [String: Int] = [:]
            var owners: [String: String] = [:]   // column → declaring entity
            func add(_ column: Column, owner: String) -> String {
                if let existing = owners[column.name], existing == owner { return column.name }
                var name = column.name
                if owners[name] != nil { name = "\(owner)_\(column.name)" }
                owners[name] = owner
                index[name] = columns.count
                columns.append(Column(name: name, sqlType: column.sqlType, defaultSQL: column.defaultSQL))
                return name
            }
            var perEntity: [String: (attributes: [String], toOne: [String], toOneEntity: [String?])] = [:]
            for member in family {
                var attributeColumns: [String] = []
                for attribute in member.attributes {
                    let owner =
                        member.lineage.last {
                            model.entitiesByName[$0]!.declaration.attributes.contains { $0.name == attribute.name }
                        } ?? member.name
                    attributeColumns.append(
                        add(
                            Column(
                                name: attribute.name, sqlType: attribute.type.sqlType,
                                defaultSQL: attribute.defaultValue.map(Self.literal)), owner: owner))
                }
                var toOneColumns: [String] = [], entityColumns: [String?] = []
                for relationship in member.toOneRelationships {
                    let owner = member.relationshipOwners[relationship.name] ?? member.name
                    toOneColumns.append(
                        add(Column(name: relationship.name, sqlType: "INTEGER", defaultSQL: nil), owner: owner))
                    if member.destination(of: relationship).subentityNames.count > 1 {
                        entityColumns.append(
                            add(
                                Column(name: relationship.name + "_ENT", sqlType: "INTEGER", defaultSQL: nil),
                                owner: owner))
                    } else {
                        entityColumns.append(nil)
                    }
                }
                perEntity[member.name] = (attributeColumns, toOneColumns, entityColumns)
            }
            tables[entity.name] = TableLayout(root: entity.name, columns: columns, columnIndex: index)
            for (name, p) in perEntity {
                layouts[name] = EntityLayout(
                    attributeColumns: p.attributes, toOneColumns: p.toOne, toOneEntityColumns: p.toOneEntity,
                    attributePositions: p.attributes.map { index[$0]! },
                    toOnePositions: p.toOne.map { index[$0]! },
                    toOneEntityPositions: p.toOneEntity.map { $0.map { index[$0]! } })
            }
        }
    }

    /// All join tables of the model.
    var joinTables: Set<String> {
        var names = Set<String>()
        for entity in model.entities {
            for relationship in entity.relationships {
                if let join = entity.joinTable(for: relationship) { names.insert(join.name) }
            }
        }
        return names
    }

    /// Index name → (table, columns).
    var indexes: [String: (table: String, columns: [String])] {
        var result: [String: (String, [String])] = [:]
        for entity in model.entities {
            let layout = layouts[entity.name]!
            func column(_ property: String) -> String {
                if let i = entity.attributeIndex[property] { return layout.attributeColumns[i] }
                return layout.toOneColumns[entity.toOneIndex[property]!]
            }
            for index in entity.indexes {
                let columns = index.properties.map(column)
                result["Z_\(entity.root)_" + columns.joined(separator: "_")] = (entity.root, columns)
            }
            for (i, _) in entity.toOneRelationships.enumerated() {
                result["Z_\(entity.root)_\(layout.toOneColumns[i])"] = (entity.root, [layout.toOneColumns[i]])
            }
            result["Z_\(entity.root)_Z_ENT"] = (entity.root, ["Z_ENT"])
        }
        return result
    }

    static func quote(_ name: String) -> String { "\"\(name)\"" }

    /// An SQL literal for a default value.
    static func literal(_ value: AttributeValue) -> String {
        switch SQLiteObjectStore.databaseValue(value, forStorage: true).storage {
        case .null: return "NULL"
        case .int64(let v): return "\(v)"
        case .double(let v): return "\(v)"
        case .string(let s): return "'" + s.replacingOccurrences(of: "'", with: "''") + "'"
        case .blob(let d): return "x'" + Array(d).hex + "'"
        }
    }

    func createStatements() -> [String] {
        var sql: [String] = []
        for (root, table) in tables.sorted(by: { $0.key < $1.key }) {
            let columns =
                ["Z_PK INTEGER PRIMARY KEY", "Z_ENT INTEGER NOT NULL", "Z_OPT INTEGER NOT NULL"]
                + table.columns.map {
                    "\(Self.quote($0.name)) \($0.sqlType)" + ($0.defaultSQL.map { " DEFAULT \($0)" } ?? "")
                }
            sql.append("CREATE TABLE \(Self.quote(root)) (\(columns.joined(separator: ", ")))")
        }
        for join in joinTables.sorted() {
            sql.append(
                "CREATE TABLE \(Self.quote(join)) (Z_1 INTEGER NOT NULL, Z_2 INTEGER NOT NULL, PRIMARY KEY (Z_1, Z_2)) WITHOUT ROWID"
            )
            sql.append("CREATE INDEX \(Self.quote(join + "_Z_2")) ON \(Self.quote(join)) (Z_2, Z_1)")
        }
        for (name, index) in indexes.sorted(by: { $0.key < $1.key }) {
            sql.append(
                "CREATE INDEX \(Self.quote(name)) ON \(Self.quote(index.table)) (\(index.columns.map(Self.quote).joined(separator: ", ")))"
            )
        }
        return sql
    }

    /// The statements that bring a store written with `old` to this model, or the reason that
    /// cannot be done without losing data. Allowed: new entities (also new sub-entities), new
    /// attributes that are optional or have a default, new optional to-one and new to-many
    /// relationships, new or removed indexes.
    func migration(from old: ObjectModel) -> Result<[String], ObjectGraphError> {
        let oldSchema = SQLiteSchema(model: old)
        func refuse(_ reason: String) -> Result<[String], ObjectGraphError> {
            .failure(.incompatibleModel(store: "", reason: reason))
        }
        for oldEntity in old.entities {
            guard let entity = model.entitiesByName[oldEntity.name] else {
                return refuse("entity \(oldEntity.name) was removed")
            }
            guard entity.root == oldEntity.root else { return refuse("entity \(entity.name) moved to another parent") }
            for attribute in oldEntity.attributes {
                guard let new = entity.attribute(named: attribute.name) else {
                    return refuse("\(entity.name).\(attribute.name) was removed")
                }
                guard new.type == attribute.type else {
                    return refuse("\(entity.name).\(attribute.name) changed type from \(attribute.type) to \(new.type)")
                }
                guard new.isOptional || !attribute.isOptional else {
                    return refuse("\(entity.name).\(attribute.name) became required")
                }
            }
            for relationship in oldEntity.relationships {
                guard let new = entity.relationship(named: relationship.name) else {
                    return refuse("\(entity.name).\(relationship.name) was removed")
                }
                guard new.destination == relationship.destination, new.isToMany == relationship.isToMany,
                    entity.joinTable(for: new) == oldEntity.joinTable(for: relationship),
                    entity.inverseToOne(of: new)?.name == oldEntity.inverseToOne(of: relationship)?.name
                else {
                    return refuse("\(entity.name).\(relationship.name) changed its destination, kind or inverse")
                }
                guard new.isOptional || !relationship.isOptional else {
                    return refuse("\(entity.name).\(relationship.name) became required")
                }
            }
            for attribute in entity.attributes where oldEntity.attribute(named: attribute.name) == nil {
                guard attribute.isOptional || attribute.defaultValue != nil else {
                    return refuse("new attribute \(entity.name).\(attribute.name) is required and has no default")
                }
            }
            for relationship in entity.toOneRelationships where oldEntity.relationship(named: relationship.name) == nil
            {
                guard relationship.isOptional else {
                    return refuse("new relationship \(entity.name).\(relationship.name) is required")
                }
            }
        }
        // A new sub-entity of an existing table may have required attributes: none of its rows exist yet.
        var sql: [String] = []
        for (root, table) in tables.sorted(by: { $0.key < $1.key }) {
            guard let oldTable = oldSchema.tables[root] else {
                sql += createStatements().filter { $0.hasPrefix("CREATE TABLE \(Self.quote(root)) ") }
                continue
            }
            for column in table.columns where oldTable.columnIndex[column.name] == nil {
                sql.append(
                    "ALTER TABLE \(Self.quote(root)) ADD COLUMN \(Self.quote(column.name)) \(column.sqlType)"
                        + (column.defaultSQL.map { " DEFAULT \($0)" } ?? ""))
            }
            for column in oldTable.columns where table.columnIndex[column.name] == nil {
                return refuse("column \(root).\(column.name) would be dropped")
            }
        }
        for join in joinTables.subtracting(oldSchema.joinTables).sorted() {
            sql.append(
                "CREATE TABLE \(Self.quote(join)) (Z_1 INTEGER NOT NULL, Z_2 INTEGER NOT NULL, PRIMARY KEY (Z_1, Z_2)) WITHOUT ROWID"
            )
            sql.append("CREATE INDEX \(Self.quote(join + "_Z_2")) ON \(Self.quote(join)) (Z_2, Z_1)")
        }
        let oldIndexes = oldSchema.indexes, newIndexes = indexes
        for name in Set(oldIndexes.keys).subtracting(newIndexes.keys).sorted() {
            sql.append("DROP INDEX IF EXISTS \(Self.quote(name))")
        }
        for name in Set(newIndexes.keys).subtracting(oldIndexes.keys).sorted() {
            let index = newIndexes[name]!
            sql.append(
                "CREATE INDEX IF NOT EXISTS \(Self.quote(name)) ON \(Self.quote(index.table)) (\(index.columns.map(Self.quote).joined(separator: ", ")))"
            )
        }
        return .success(sql)
    }
}
