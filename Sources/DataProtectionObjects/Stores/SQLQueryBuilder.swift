import Foundation
import GRDB

/// Builds the SQL of a fetch: `FROM` the root table as `t0`, `LEFT JOIN`s for key paths
/// through to-one relationships, `EXISTS` subqueries for `ANY` over to-many relationships.
struct SQLQueryBuilder {
    let schema: SQLiteSchema
    private(set) var arguments: [DatabaseValue] = []
    private var aliasCounter = 0
    /// Joins per (alias, relationship) → alias, and the join clauses in order.
    private var joinAliases: [String: String] = [:]
    private(set) var joinClauses: [String] = []

    init(schema: SQLiteSchema) { self.schema = schema }

    private mutating func newAlias() -> String {
        aliasCounter += 1
        return "t\(aliasCounter)"
    }

    enum ColumnKind { case attribute(AttributeType), toOne(Entity) }

    /// The SQL expression for a key path from `entity` (at `alias`). Decimal columns (exact
    /// text) are cast to REAL `forComparison`; otherwise the stored column is given as it is.
    mutating func column(
        _ path: [String], entity: Entity, alias: String, forComparison: Bool = true
    ) throws -> (sql: String, kind: ColumnKind) {
        if path.isEmpty { return ("\(alias).Z_PK", .toOne(entity)) }   // the object itself
        var current = entity, currentAlias = alias
        for (position, name) in path.enumerated() {
            let layout = schema.layouts[current.name]!
            let last = position == path.count - 1
            if last, let i = current.attributeIndex[name] {
                let type = current.attributes[i].type
                let sql = "\(currentAlias).\(SQLiteSchema.quote(layout.attributeColumns[i]))"
                return (type == .decimal && forComparison ? "CAST(\(sql) AS REAL)" : sql, .attribute(type))
            }
            guard let i = current.toOneIndex[name] else {
                throw ObjectGraphError.unknownProperty(entity: current.name, property: name)
            }
            let keyColumn = "\(currentAlias).\(SQLiteSchema.quote(layout.toOneColumns[i]))"
            let destination = current.destination(of: current.toOneRelationships[i])
            if last { return (keyColumn, .toOne(destination)) }
            let joinKey = "\(currentAlias).\(name)"
            if let existing = joinAliases[joinKey] {
                currentAlias = existing
            } else {
                let joined = newAlias()
                joinAliases[joinKey] = joined
                joinClauses.append(
                    "LEFT JOIN \(SQLiteSchema.quote(destination.root)) AS \(joined) ON \(joined).Z_PK = \(keyColumn)")
                currentAlias = joined
            }
            current = destination
        }
        throw ObjectGraphError.unsupportedPredicate("empty key path")
    }

    /// The condition selecting rows of `entity` (and its sub-entities, when asked) in its root table.
    func entityCondition(_ entity: Entity, includesSubentities: Bool, alias: String) -> String? {
        let family = schema.model.entities.filter { $0.root == entity.root }
        let wanted = includesSubentities ? family.filter { entity.includes($0) } : [entity]
        if wanted.count == family.count { return nil }
        return "\(alias).Z_ENT IN (\(wanted.map { String($0.code) }.joined(separator: ",")))"
    }

    private mutating func operand(
        _ operand: PredicateOperand, entity: Entity, alias: String, as kind: ColumnKind?
    ) throws -> String {
        switch operand {
        case .property(let path): return try column(path, entity: entity, alias: alias).sql
        case .value(let value):
            if case .attribute(.decimal)? = kind, case .decimal(let d) = value {
                arguments.append(NSDecimalNumber(decimal: d).doubleValue.databaseValue)
            } else {
                arguments.append(SQLiteObjectStore.databaseValue(value, forStorage: false))
            }
            return "?"
        case .object(let id):
            arguments.append(id.map { $0.primaryKey.databaseValue } ?? .null)
            return "?"
        }
    }

    private mutating func kind(of operand: PredicateOperand, entity: Entity, alias: String) throws -> ColumnKind? {
        guard case .property(let path) = operand else { return nil }
        var copy = self
        return try copy.column(path, entity: entity, alias: alias).kind
    }

    /// The SQL condition for a predicate on `entity` at `alias`.
    mutating func condition(_ predicate: ObjectPredicate, entity: Entity, alias: String) throws -> String {
        switch predicate {
        case .constant(let v): return v ? "1" : "0"
        case .and(let parts):
            return parts.isEmpty
                ? "1"
                : "(" + (try parts.map { try condition($0, entity: entity, alias: alias) }.joined(separator: " AND "))
                    + ")"
        case .or(let parts):
            return parts.isEmpty
                ? "0"
                : "(" + (try parts.map { try condition($0, entity: entity, alias: alias) }.joined(separator: " OR "))
                    + ")"
        case .not(let inner):
            return "(NOT \(try condition(inner, entity: entity, alias: alias)))"
        case .comparison(let lhs, let op, let rhs):
            let k = try kind(of: lhs, entity: entity, alias: alias) ?? kind(of: rhs, entity: entity, alias: alias)
            let a = try operand(lhs, entity: entity, alias: alias, as: k)
            let b = try operand(rhs, entity: entity, alias: alias, as: k)
            let sqlOp =
                switch op {
                case .equal: "IS"
                case .notEqual: "IS NOT"
                default: op.rawValue
                }
            return "(\(a) \(sqlOp) \(b))"
        case .string(let lhs, let operation, let rhs, let caseInsensitive):
            var a = try operand(lhs, entity: entity, alias: alias, as: nil)
            var b = try operand(rhs, entity: entity, alias: alias, as: nil)
            if caseInsensitive {
                a = "\(SQLiteObjectStore.lowercaseFunction)(\(a))"
                b = "\(SQLiteObjectStore.lowercaseFunction)(\(b))"
            }
            switch operation {
            case .equals: return "(\(a) = \(b))"
            case .contains: return "(instr(\(a), \(b)) > 0)"
            case .beginsWith: return "(instr(\(a), \(b)) = 1)"
            case .endsWith: return "(\(SQLiteObjectStore.endsWithFunction)(\(a), \(b)))"
            }
        case .oneOf(let lhs, let values):
            let k = try kind(of: lhs, entity: entity, alias: alias)
            let a = try operand(lhs, entity: entity, alias: alias, as: k)
            if values.isEmpty { return "(\(a) IS NOT NULL AND 0)" }
            let list = try values.map { try operand($0, entity: entity, alias: alias, as: k) }
            return "(\(a) IN (\(list.joined(separator: ", "))))"
        case .between(let value, let lower, let upper):
            let k = try kind(of: value, entity: entity, alias: alias)
            let v = try operand(value, entity: entity, alias: alias, as: k)
            let l = try operand(lower, entity: entity, alias: alias, as: k)
            let u = try operand(upper, entity: entity, alias: alias, as: k)
            return "(\(v) BETWEEN \(l) AND \(u))"
        case .any(let path, let inner):
            return try anyCondition(path.split(separator: ".").map(String.init), inner, entity: entity, alias: alias)
        }
    }

    /// `EXISTS (SELECT 1 FROM destination …)` for `ANY path.<inner>`.
    private mutating func anyCondition(
        _ path: [String], _ inner: ObjectPredicate, entity: Entity, alias: String
    ) throws -> String {
        guard let name = path.first else { throw ObjectGraphError.unsupportedPredicate("ANY needs a relationship") }
        guard let relationship = entity.relationship(named: name) else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: name)
        }
        let destination = entity.destination(of: relationship)
        var sub = SQLQueryBuilder(schema: schema)
        sub.aliasCounter = aliasCounter + 100
        let d = sub.newAlias()
        var link: String
        var from = "\(SQLiteSchema.quote(destination.root)) AS \(d)"
        if !relationship.isToMany {
            link =
                "\(d).Z_PK = \(alias).\(SQLiteSchema.quote(schema.layouts[entity.name]!.toOneColumns[entity.toOneIndex[name]!]))"
        } else if let inverse = entity.inverseToOne(of: relationship) {
            link =
                "\(d).\(SQLiteSchema.quote(schema.layouts[destination.name]!.toOneColumns[destination.toOneIndex[inverse.name]!])) = \(alias).Z_PK"
        } else if let join = entity.joinTable(for: relationship) {
            let j = sub.newAlias()
            let (mine, theirs) = join.sourceIsFirst ? ("Z_1", "Z_2") : ("Z_2", "Z_1")
            from = "\(SQLiteSchema.quote(join.name)) AS \(j) JOIN " + from + " ON \(d).Z_PK = \(j).\(theirs)"
            link = "\(j).\(mine) = \(alias).Z_PK"
        } else {
            throw ObjectGraphError.unsupportedPredicate("\(entity.name).\(name) cannot be queried")
        }
        if let filter = sub.entityCondition(destination, includesSubentities: true, alias: d) {
            link += " AND " + filter
        }
        let rest = Array(path.dropFirst())
        let body =
            rest.isEmpty
            ? try sub.condition(inner, entity: destination, alias: d)
            : try sub.anyCondition(rest, inner, entity: destination, alias: d)
        aliasCounter = sub.aliasCounter
        arguments += sub.arguments
        return "EXISTS (SELECT 1 FROM \(from) \(sub.joinClauses.joined(separator: " ")) WHERE \(link) AND \(body))"
    }
}
