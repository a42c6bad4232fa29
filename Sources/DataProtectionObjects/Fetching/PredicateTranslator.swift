import Foundation

/// Translates Foundation's `#Predicate` into an ``ObjectPredicate`` the stores run (as SQL, or
/// in memory). Supported: `==`, `!=`, `<`, `<=`, `>`, `>=`, `&&`, `||`, `!`, `contains` on
/// strings, `starts(with:)`, `[values].contains(x)` (IN), `(a...b).contains(x)` (BETWEEN) and
/// `(a..<b).contains(x)`, optional chaining through to-one relationships
/// (`$0.conversation?.title == "Team"`), and `contains(where:)` over a to-many relationship
/// (ANY). Anything else is refused with ``ObjectGraphError/unsupportedPredicate(_:)``.
///
/// Foundation on Linux offers no case-insensitive string functions in `#Predicate`; use
/// ``ObjectPredicate/string(_:_:_:caseInsensitive:)`` through ``FetchDescriptor/condition``.
public enum PredicateTranslator {
    public static func translate<T: PersistentModel>(_ predicate: Predicate<T>) throws -> ObjectPredicate {
        var translator = Translator()
        translator.bases[predicate.variable.key] = []
        guard let expression = predicate.expression as? any ObjectPredicateTranslatable else {
            throw ObjectGraphError.unsupportedPredicate("\(type(of: predicate.expression))")
        }
        return try translator.predicate(expression)
    }
}

/// The result of translating one node of a `#Predicate` expression.
public enum TranslatedNode {
    case predicate(ObjectPredicate)
    case path([String], isToMany: Bool)
    case operand(PredicateOperand)
    case list([PredicateOperand])
    case range(PredicateOperand, PredicateOperand, closed: Bool)
}

/// Walks a `#Predicate` expression tree.
public struct Translator {
    var bases: [PredicateExpressions.VariableID: [String]] = [:]

    mutating func node(_ expression: Any) throws -> TranslatedNode {
        guard let expression = expression as? any ObjectPredicateTranslatable else {
            throw ObjectGraphError.unsupportedPredicate("\(type(of: expression)) cannot be translated")
        }
        return try expression.translate(&self)
    }

    mutating func predicate(_ expression: Any) throws -> ObjectPredicate {
        switch try node(expression) {
        case .predicate(let p): return p
        case .path(let path, false): return .comparison(.property(path), .equal, .value(.boolean(true)))
        case .operand(.value(.boolean(let b))): return .constant(b)
        default: throw ObjectGraphError.unsupportedPredicate("\(type(of: expression)) is not a condition")
        }
    }

    mutating func operand(_ expression: Any) throws -> PredicateOperand {
        switch try node(expression) {
        case .operand(let o): return o
        case .path(let path, false): return .property(path)
        default:
            throw ObjectGraphError.unsupportedPredicate("\(type(of: expression)) is not a value or a to-one key path")
        }
    }

    static func constant(_ value: Any) throws -> TranslatedNode {
        if let id = value as? ObjectID { return .operand(.object(id)) }
        if let model = value as? any PersistentModel { return .operand(.object(model.managedObject.objectID)) }
        if let convertible = value as? any AttributeValueConvertible {
            return .operand(.value(convertible.attributeValue))
        }
        if let list = value as? [any AttributeValueConvertible] { return .list(list.map { .value($0.attributeValue) }) }
        if let list = value as? [any PersistentModel] { return .list(list.map { .object($0.managedObject.objectID) }) }
        if let optional = value as? any OptionalModel { return .operand(.object(optional.wrappedObjectID)) }
        throw ObjectGraphError.unsupportedPredicate("a constant of type \(type(of: value))")
    }
}

protocol OptionalModel { var wrappedObjectID: ObjectID? { get } }
extension Optional: OptionalModel where Wrapped == ObjectID {
    var wrappedObjectID: ObjectID? { self }
}

/// A `#Predicate` expression node the translator understands.
public protocol ObjectPredicateTranslatable {
    func translate(_ translator: inout Translator) throws -> TranslatedNode
}

extension PredicateExpressions.Variable: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        guard let base = translator.bases[key] else {
            throw ObjectGraphError.unsupportedPredicate("a variable from an outer scope")
        }
        return .path(base, isToMany: false)
    }
}

extension PredicateExpressions.KeyPath: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        guard case .path(let base, false) = try translator.node(root) else {
            throw ObjectGraphError.unsupportedPredicate("a key path on something other than an object")
        }
        guard let model = Root.Output.self as? any PersistentModel.Type else {
            throw ObjectGraphError.unsupportedPredicate("key path \(keyPath) (only stored properties of models)")
        }
        guard let name = model.propertyName(for: keyPath) else {
            throw ObjectGraphError.unsupportedPredicate("\(keyPath) is not a stored property of \(model)")
        }
        if name.isEmpty { return .path(base, isToMany: false) }   // persistentModelID: the object itself
        let isToMany = model.entityDescription.relationships.first { $0.name == name }?.isToMany ?? false
        return .path(base + [name], isToMany: isToMany)
    }
}

extension PredicateExpressions.Value: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode { try Translator.constant(value) }
}

extension PredicateExpressions.NilLiteral: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode { .operand(.value(.null)) }
}

extension PredicateExpressions.Conjunction: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(.and([try translator.predicate(lhs), try translator.predicate(rhs)]))
    }
}

extension PredicateExpressions.Disjunction: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(.or([try translator.predicate(lhs), try translator.predicate(rhs)]))
    }
}

extension PredicateExpressions.Negation: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(.not(try translator.predicate(wrapped)))
    }
}

extension PredicateExpressions.Equal: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(.comparison(try translator.operand(lhs), .equal, try translator.operand(rhs)))
    }
}

extension PredicateExpressions.NotEqual: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(.comparison(try translator.operand(lhs), .notEqual, try translator.operand(rhs)))
    }
}

extension PredicateExpressions.Comparison: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        let op: ComparisonOperator =
            switch self.op {
            case .lessThan: .less
            case .lessThanOrEqual: .lessOrEqual
            case .greaterThan: .greater
            case .greaterThanOrEqual: .greaterOrEqual
            @unknown default: throw ObjectGraphError.unsupportedPredicate("comparison \(self.op)")
            }
        return .predicate(.comparison(try translator.operand(lhs), op, try translator.operand(rhs)))
    }
}

extension PredicateExpressions.CollectionContainsCollection: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(
            .string(try translator.operand(base), .contains, try translator.operand(other), caseInsensitive: false))
    }
}

extension PredicateExpressions.SequenceStartsWith: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .predicate(
            .string(try translator.operand(base), .beginsWith, try translator.operand(prefix), caseInsensitive: false))
    }
}

extension PredicateExpressions.SequenceContains: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        let element = try translator.operand(self.element)
        switch try translator.node(sequence) {
        case .list(let values): return .predicate(.oneOf(element, values))
        case .path(let path, true):
            // `conversation.participants.contains(account)`: ANY participant == account.
            guard case .object = element else {
                throw ObjectGraphError.unsupportedPredicate("contains() on a to-many needs an object")
            }
            return .predicate(.any(path.joined(separator: "."), .comparison(.property([]), .equal, element)))
        default: throw ObjectGraphError.unsupportedPredicate("contains() on \(type(of: sequence))")
        }
    }
}

extension PredicateExpressions.SequenceContainsWhere: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        guard case .path(let path, true) = try translator.node(sequence) else {
            throw ObjectGraphError.unsupportedPredicate("contains(where:) works on to-many relationships")
        }
        var inner = Translator()
        inner.bases[variable.key] = []
        return .predicate(.any(path.joined(separator: "."), try inner.predicate(test)))
    }
}

extension PredicateExpressions.RangeExpressionContains: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        let value = try translator.operand(element)
        guard case .range(let lower, let upper, let closed) = try translator.node(range) else {
            throw ObjectGraphError.unsupportedPredicate("contains() on \(type(of: range))")
        }
        if closed { return .predicate(.between(value, lower, upper)) }
        return .predicate(.and([.comparison(value, .greaterOrEqual, lower), .comparison(value, .less, upper)]))
    }
}

extension PredicateExpressions.ClosedRange: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .range(try translator.operand(lower), try translator.operand(upper), closed: true)
    }
}

extension PredicateExpressions.Range: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        .range(try translator.operand(lower), try translator.operand(upper), closed: false)
    }
}

extension PredicateExpressions.OptionalFlatMap: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode {
        guard case .path(let base, false) = try translator.node(wrapped) else {
            throw ObjectGraphError.unsupportedPredicate(
                "optional chaining on something other than a to-one relationship")
        }
        translator.bases[variable.key] = base
        return try translator.node(transform)
    }
}

extension PredicateExpressions.ForcedUnwrap: ObjectPredicateTranslatable {
    public func translate(_ translator: inout Translator) throws -> TranslatedNode { try translator.node(inner) }
}
