import Foundation

/// An operand of a predicate: a property (a key path through to-one relationships, as names),
/// a constant value, or an object (for comparing a to-one relationship).
public enum PredicateOperand: Sendable, Hashable {
    case property([String])
    case value(AttributeValue)
    case object(ObjectID?)
}

/// How two operands compare.
public enum ComparisonOperator: String, Sendable, Hashable {
    case equal = "==", notEqual = "!=", less = "<", lessOrEqual = "<=", greater = ">", greaterOrEqual = ">="
}

/// A string test, like NSPredicate's `BEGINSWITH`, `CONTAINS`, `ENDSWITH` and `==`.
public enum StringOperation: String, Sendable, Hashable {
    case beginsWith, contains, endsWith, equals
}

/// A fetch predicate both stores understand: the SQLite store translates it to SQL, the
/// in-memory store evaluates it. Foundation's `#Predicate` is translated to it
/// (``FetchDescriptor/init(predicate:sortBy:)``); what `#Predicate` cannot say on Linux
/// (case-insensitive matching, ends-with) is written with the builders:
///
/// ```swift
/// let recent: ObjectPredicate = .compare("sentAt", .greater, .date(since))
/// let greeting: ObjectPredicate = .string("text", .beginsWith, "hello", caseInsensitive: true)
/// let inTitled: ObjectPredicate = .compare("conversation.title", .equal, .string("Team"))
/// let withPhoto: ObjectPredicate = .any("attachments", .compare("kind", .equal, .string("photo")))
/// let predicate = recent && (greeting || !inTitled)
/// ```
///
/// Comparisons follow SQL: a missing value (`nil`) makes `<`, `<=`, `>`, `>=` and string tests
/// unknown, and NOT of unknown is unknown (not matched). `==` and `!=` treat `nil` as a value,
/// as Swift does.
public indirect enum ObjectPredicate: Sendable, Hashable {
    case constant(Bool)
    case and([ObjectPredicate])
    case or([ObjectPredicate])
    case not(ObjectPredicate)
    case comparison(PredicateOperand, ComparisonOperator, PredicateOperand)
    case string(PredicateOperand, StringOperation, PredicateOperand, caseInsensitive: Bool)
    /// The operand is one of the values.
    case oneOf(PredicateOperand, [PredicateOperand])
    /// lower ≤ operand ≤ upper.
    case between(PredicateOperand, PredicateOperand, PredicateOperand)
    /// Some destination of the to-many relationship (a path: `"conversation.messages"` works
    /// too) satisfies the predicate, which is written relative to the destination entity.
    case any(String, ObjectPredicate)

    /// `property op value`, the property written as a dotted key path (`"conversation.title"`).
    public static func compare(_ property: String, _ op: ComparisonOperator, _ value: AttributeValue) -> ObjectPredicate
    {
        .comparison(.property(property.split(separator: ".").map(String.init)), op, .value(value))
    }

    /// A string test on a property (dotted key path).
    public static func string(
        _ property: String, _ operation: StringOperation, _ value: String, caseInsensitive: Bool = false
    ) -> ObjectPredicate {
        .string(
            .property(property.split(separator: ".").map(String.init)), operation, .value(.string(value)),
            caseInsensitive: caseInsensitive)
    }

    /// `property IN values`.
    public static func `in`(_ property: String, _ values: [AttributeValue]) -> ObjectPredicate {
        .oneOf(.property(property.split(separator: ".").map(String.init)), values.map(PredicateOperand.value))
    }

    /// `property BETWEEN lower AND upper` (both included).
    public static func between(_ property: String, _ lower: AttributeValue, _ upper: AttributeValue) -> ObjectPredicate
    {
        .between(.property(property.split(separator: ".").map(String.init)), .value(lower), .value(upper))
    }

    /// The to-one relationship (dotted path) points to `object` (or to nothing, for `nil`).
    public static func relationship(_ property: String, is object: ObjectID?) -> ObjectPredicate {
        .comparison(.property(property.split(separator: ".").map(String.init)), .equal, .object(object))
    }

    public static func && (lhs: ObjectPredicate, rhs: ObjectPredicate) -> ObjectPredicate { .and([lhs, rhs]) }
    public static func || (lhs: ObjectPredicate, rhs: ObjectPredicate) -> ObjectPredicate { .or([lhs, rhs]) }
    public static prefix func ! (operand: ObjectPredicate) -> ObjectPredicate { .not(operand) }
}

/// A sort key: a property (dotted key path through to-one relationships) and a direction.
public struct SortKey: Sendable, Hashable {
    public var path: [String]
    public var ascending: Bool
    public init(_ property: String, ascending: Bool = true) {
        self.path = property.split(separator: ".").map(String.init)
        self.ascending = ascending
    }
    init(path: [String], ascending: Bool) {
        self.path = path
        self.ascending = ascending
    }
}

// MARK: - Evaluation in memory

/// What the in-memory evaluation reads objects through.
protocol ObjectValueSource {
    func attribute(_ index: Int, of id: ObjectID) throws -> AttributeValue
    func toOne(_ index: Int, of id: ObjectID) throws -> ObjectID?
    func toMany(_ relationship: RelationshipDescription, of id: ObjectID) throws -> [ObjectID]
}

/// A resolved operand's value.
enum PredicateTerm: Equatable {
    case value(AttributeValue)
    case object(ObjectID?)

    var isNull: Bool {
        switch self {
        case .value(let v): v.isNull
        case .object(let o): o == nil
        }
    }
}

extension ObjectPredicate {
    /// Evaluates with SQL's three-valued logic: `nil` is unknown.
    func evaluate(on id: ObjectID, source: some ObjectValueSource) throws -> Bool? {
        switch self {
        case .constant(let v): return v
        case .and(let parts):
            return try Self.any(parts, is: false) { try $0.evaluate(on: id, source: source) }.map { !$0 }
        case .or(let parts):
            return try Self.any(parts, is: true) { try $0.evaluate(on: id, source: source) }
        case .not(let inner):
            return try inner.evaluate(on: id, source: source).map { !$0 }
        case .comparison(let lhs, let op, let rhs):
            let a = try lhs.resolve(on: id, source: source), b = try rhs.resolve(on: id, source: source)
            return Self.compare(a, op, b)
        case .string(let lhs, let operation, let rhs, let caseInsensitive):
            guard case .value(.string(var text)) = try lhs.resolve(on: id, source: source),
                case .value(.string(var pattern)) = try rhs.resolve(on: id, source: source)
            else { return nil }
            if caseInsensitive {
                text = text.lowercased()
                pattern = pattern.lowercased()
            }
            let t = Array(text.utf8), p = Array(pattern.utf8)
            switch operation {
            case .beginsWith: return t.starts(with: p)
            case .endsWith: return t.count >= p.count && t.suffix(p.count).elementsEqual(p)
            case .equals: return t == p
            case .contains:
                if p.isEmpty { return true }
                guard t.count >= p.count else { return false }
                for start in 0...(t.count - p.count)
                where t[start] == p[0] && t[start..<(start + p.count)].elementsEqual(p) { return true }
                return false
            }
        case .oneOf(let lhs, let values):
            let a = try lhs.resolve(on: id, source: source)
            if a.isNull { return nil }
            return try Self.any(values, is: true) { value in
                let b = try value.resolve(on: id, source: source)
                // SQL: x IN (…, NULL) is unknown unless x matches another
                return b.isNull ? nil : Self.compare(a, .equal, b)
            }
        case .between(let operand, let lower, let upper):
            let v = try operand.resolve(on: id, source: source)
            let low = Self.compare(v, .greaterOrEqual, try lower.resolve(on: id, source: source))
            let high = Self.compare(v, .lessOrEqual, try upper.resolve(on: id, source: source))
            return Self.both(low, high)
        case .any(let path, let inner):
            let names = path.split(separator: ".").map(String.init)
            var current: [ObjectID] = [id]
            for name in names {
                var next: [ObjectID] = []
                for object in current {
                    guard let r = object.entity.relationship(named: name) else {
                        throw ObjectGraphError.unknownProperty(entity: object.entity.name, property: name)
                    }
                    if r.isToMany {
                        next += try source.toMany(r, of: object)
                    } else if let target = try source.toOne(object.entity.toOneIndex[name]!, of: object) {
                        next.append(target)
                    }
                }
                current = next
            }
            return try Self.any(current, is: true) { try inner.evaluate(on: $0, source: source) }
        }
    }

    /// SQL's fold of OR (`target` true) or, negated, AND (`target` false): whether some element
    /// evaluates to `target`; unknown when none does but some are unknown.
    private static func any<C: Sequence>(
        _ elements: C, is target: Bool, _ test: (C.Element) throws -> Bool?
    ) rethrows -> Bool? {
        var unknown = false
        for element in elements {
            switch try test(element) {
            case target?: return true
            case nil: unknown = true
            default: break
            }
        }
        return unknown ? nil : false
    }

    private static func both(_ a: Bool?, _ b: Bool?) -> Bool? {
        if a == false || b == false { return false }
        if a == nil || b == nil { return nil }
        return true
    }

    static func compare(_ a: PredicateTerm, _ op: ComparisonOperator, _ b: PredicateTerm) -> Bool? {
        switch (a, b) {
        case (.object(let x), .object(let y)):
            switch op {
            case .equal: return x == y
            case .notEqual: return x != y
            default: return nil
            }
        case (.object(let x), .value(let v)), (.value(let v), .object(let x)):
            // Only nil compares with an object.
            guard v.isNull else { return nil }
            switch op {
            case .equal: return x == nil
            case .notEqual: return x != nil
            default: return nil
            }
        case (.value(let x), .value(let y)):
            switch op {
            case .equal:
                return x.isNull || y.isNull ? x.isNull == y.isNull : AttributeValue.compare(x, y) == .orderedSame
            case .notEqual:
                return x.isNull || y.isNull ? x.isNull != y.isNull : AttributeValue.compare(x, y) != .orderedSame
            case .less: return AttributeValue.compare(x, y).map { $0 == .orderedAscending }
            case .lessOrEqual: return AttributeValue.compare(x, y).map { $0 != .orderedDescending }
            case .greater: return AttributeValue.compare(x, y).map { $0 == .orderedDescending }
            case .greaterOrEqual: return AttributeValue.compare(x, y).map { $0 != .orderedAscending }
            }
        }
    }
}

extension PredicateOperand {
    func resolve(on id: ObjectID, source: some ObjectValueSource) throws -> PredicateTerm {
        switch self {
        case .value(let v): return .value(v)
        case .object(let o): return .object(o)
        case .property(let path):
            var current: ObjectID = id
            for (position, name) in path.enumerated() {
                let last = position == path.count - 1
                if let index = current.entity.attributeIndex[name], last {
                    return .value(try source.attribute(index, of: current))
                }
                guard let index = current.entity.toOneIndex[name] else {
                    throw ObjectGraphError.unknownProperty(entity: current.entity.name, property: name)
                }
                let target = try source.toOne(index, of: current)
                if last { return .object(target) }
                guard let target else {
                    // A nil to-one along the path gives nil, like optional chaining.
                    return .value(.null)
                }
                current = target
            }
            return .object(current)
        }
    }
}
