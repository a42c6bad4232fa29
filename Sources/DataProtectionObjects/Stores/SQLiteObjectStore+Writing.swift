import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

// SQLiteObjectStore: writing.
extension SQLiteObjectStore {
    // MARK: - Writing

    public func obtainPermanentIDs(for entity: Entity, count: Int) throws -> [ObjectID] {
        guard count > 0 else { return [] }
        try check(entity)
        let root = entity.root
        let last: Int64 = try write { db in
            try db.execute(sql: "INSERT OR IGNORE INTO Z_PRIMARYKEY (Z_NAME, Z_MAX) VALUES (?, 0)", arguments: [root])
            return try Int64.fetchOne(
                db,
                sql: """
                    UPDATE Z_PRIMARYKEY SET Z_MAX = max(Z_MAX, (SELECT coalesce(max(Z_PK), 0) FROM \(SQLiteSchema.quote(root)))) + ?
                    WHERE Z_NAME = ? RETURNING Z_MAX
                    """, arguments: [count, root])!
        }
        let first = last - Int64(count) + 1
        return (0..<Int64(count)).map { ObjectID(entity: entity, primaryKey: first + $0) }
    }

    func rowArguments(_ change: StoreObjectChange) -> [DatabaseValue] {
        let table = schema.tables[change.objectID.entity.root]!
        var columns = [DatabaseValue](repeating: .null, count: table.columns.count)
        fillRow(change, layout: schema.layouts[change.objectID.entity.name]!, into: &columns, at: 0)
        return columns
    }

    /// Writes a change's column values into `columns` from `start` on (columns it does not
    /// set are left as they are: the caller clears them).
    func fillRow(
        _ change: StoreObjectChange, layout: SQLiteSchema.EntityLayout, into columns: inout [DatabaseValue],
        at start: Int
    ) {
        for (i, value) in change.values.enumerated() {
            columns[start + layout.attributePositions[i]] = Self.databaseValue(value, forStorage: true)
        }
        for (i, target) in change.toOne.enumerated() {
            columns[start + layout.toOnePositions[i]] = target.map { $0.primaryKey.databaseValue } ?? .null
            if let position = layout.toOneEntityPositions[i] {
                columns[start + position] = target.map { $0.entity.code.databaseValue } ?? .null
            }
        }
    }

    /// One prepared INSERT per entity of a save: its statement, its columns, how many arguments.
    private struct InsertPlan {
        var statement: Statement
        var layout: SQLiteSchema.EntityLayout
        var width: Int
    }

    public func execute(_ request: SaveChangesRequest) throws {
        // Each entity once (a save of 100,000 objects has a handful).
        var checked = Set<ObjectIdentifier>()
        for change in [request.inserted, request.updated, request.deleted].joined()
        where checked.insert(ObjectIdentifier(change.objectID.entity)).inserted {
            try check(change.objectID.entity)
        }
        for change in request.relationChanges where checked.insert(ObjectIdentifier(change.source.entity)).inserted {
            try check(change.source.entity)
        }
        try write { db in
            var conflicts: [String] = []
            var plans: [ObjectIdentifier: InsertPlan] = [:]
            for change in request.inserted {
                let entity = change.objectID.entity
                let plan: InsertPlan
                if let prepared = plans[ObjectIdentifier(entity)] {
                    plan = prepared
                } else {
                    let table = schema.tables[entity.root]!
                    let sql =
                        "INSERT INTO \(SQLiteSchema.quote(entity.root)) (Z_PK, Z_ENT, Z_OPT\(table.columns.map { ", " + SQLiteSchema.quote($0.name) }.joined())) VALUES (?, ?, ?\(String(repeating: ", ?", count: table.columns.count)))"
                    plan = InsertPlan(
                        statement: try db.cachedStatement(sql: sql), layout: schema.layouts[entity.name]!,
                        width: 3 + table.columns.count)
                    // Arguments set once, so that `execute()` runs with the values bound per row.
                    plan.statement.setUncheckedArguments(
                        StatementArguments(repeatElement(DatabaseValue.null, count: plan.width)))
                    plans[ObjectIdentifier(entity)] = plan
                }
                var arguments = [DatabaseValue](repeating: .null, count: plan.width)
                arguments[0] = change.objectID.primaryKey.databaseValue
                arguments[1] = entity.code.databaseValue
                arguments[2] = change.newVersion.databaseValue
                fillRow(change, layout: plan.layout, into: &arguments, at: 3)
                try plan.statement.bindDirectly(arguments)
                try plan.statement.execute()
            }
            for change in request.updated {
                let root = change.objectID.entity.root
                let table = schema.tables[root]!
                let check = change.expectedVersion == nil ? "" : " AND Z_OPT = ?"
                let statement = try db.cachedStatement(
                    sql:
                        "UPDATE \(SQLiteSchema.quote(root)) SET Z_OPT = ?\(table.columns.map { ", \(SQLiteSchema.quote($0.name)) = ?" }.joined()) WHERE Z_PK = ?\(check)"
                )
                var arguments =
                    [change.newVersion.databaseValue] + rowArguments(change) + [
                        change.objectID.primaryKey.databaseValue
                    ]
                if let expected = change.expectedVersion { arguments.append(expected.databaseValue) }
                statement.setUncheckedArguments(StatementArguments(arguments))
                try statement.execute()
                if db.changesCount != 1 { conflicts.append(change.objectID.description) }
            }
            for change in request.deleted {
                let entity = change.objectID.entity
                let check = change.expectedVersion == nil ? "" : " AND Z_OPT = ?"
                let statement = try db.cachedStatement(
                    sql: "DELETE FROM \(SQLiteSchema.quote(entity.root)) WHERE Z_PK = ?\(check)")
                var arguments = [change.objectID.primaryKey.databaseValue]
                if let expected = change.expectedVersion { arguments.append(expected.databaseValue) }
                statement.setUncheckedArguments(StatementArguments(arguments))
                try statement.execute()
                if db.changesCount != 1, change.expectedVersion != nil { conflicts.append(change.objectID.description) }
                for relationship in entity.relationships {
                    guard let join = entity.joinTable(for: relationship) else { continue }
                    try db.execute(
                        sql:
                            "DELETE FROM \(SQLiteSchema.quote(join.name)) WHERE \(join.sourceIsFirst ? "Z_1" : "Z_2") = ?",
                        arguments: [change.objectID.primaryKey])
                }
            }
            guard conflicts.isEmpty else { throw ObjectGraphError.conflict(objects: conflicts) }
            for change in request.relationChanges {
                let entity = change.source.entity
                guard let relationship = entity.relationship(named: change.relationship),
                    let join = entity.joinTable(for: relationship)
                else { continue }
                let table = SQLiteSchema.quote(join.name)
                let (mine, theirs) = join.sourceIsFirst ? ("Z_1", "Z_2") : ("Z_2", "Z_1")
                let remove = try db.cachedStatement(sql: "DELETE FROM \(table) WHERE \(mine) = ? AND \(theirs) = ?")
                for target in change.removed {
                    try remove.execute(arguments: [change.source.primaryKey, target.primaryKey])
                }
                let add = try db.cachedStatement(
                    sql: "INSERT OR IGNORE INTO \(table) (\(mine), \(theirs)) VALUES (?, ?)")
                for target in change.added {
                    try add.execute(arguments: [change.source.primaryKey, target.primaryKey])
                }
            }
        }
    }
}
