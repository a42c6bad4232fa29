import SwiftSyntax

/// A stored `var` of a `@Model` class, read from its syntax.
struct StoredProperty {
    enum Kind {
        case attribute(type: String)
        case toOne(destination: String)
        case toMany(destination: String)
    }

    let name: String
    let kind: Kind
    let initializer: ExprSyntax?
    let indexed: Bool
    let deleteRule: String?
    let inverse: String?

    /// The types stored as attributes; any other type names a model (a relationship).
    static let attributeTypes: Set<String> = [
        "Int", "Int16", "Int32", "Int64", "Double", "Decimal", "String", "Bool", "Date", "Data", "UUID", "URL",
        "Foundation.Date", "Foundation.Data", "Foundation.UUID", "Foundation.URL", "Foundation.Decimal",
    ]

    /// The persisted properties of a class body: stored `var`s that are not static, not
    /// `@Transient`, and have no accessors of their own.
    static func all(in members: MemberBlockItemListSyntax) throws -> [StoredProperty] {
        try members.compactMap { item in
            guard let variable = item.decl.as(VariableDeclSyntax.self) else { return nil }
            return try StoredProperty(variable)
        }
    }

    init?(_ variable: VariableDeclSyntax) throws {
        guard variable.bindingSpecifier.tokenKind == .keyword(.var),
            !variable.modifiers.contains(where: { ["static", "class", "lazy"].contains($0.name.text) }),
            !variable.attributes.contains(where: { Self.attributeName($0) == "Transient" }),
            variable.bindings.count == 1, let binding = variable.bindings.first,
            binding.accessorBlock == nil,
            let identifier = binding.pattern.as(IdentifierPatternSyntax.self)
        else { return nil }
        guard let typeSyntax = binding.typeAnnotation?.type else {
            throw MacroError("\(identifier.identifier.text): a persisted property needs an explicit type")
        }
        name = identifier.identifier.text
        initializer = binding.initializer?.value
        let attribute = variable.attributes.first { Self.attributeName($0) == "Attribute" }
        indexed = attribute.map { $0.description.contains("indexed") } ?? false
        let relationship = variable.attributes.compactMap { $0.as(AttributeSyntax.self) }.first {
            $0.attributeName.trimmedDescription == "Relationship"
        }
        var deleteRule: String?
        var inverse: String?
        if case .argumentList(let arguments)? = relationship?.arguments {
            for argument in arguments {
                switch argument.label?.text {
                case "deleteRule": deleteRule = argument.expression.trimmedDescription
                case "inverse":
                    guard let keyPath = argument.expression.as(KeyPathExprSyntax.self),
                        let last = keyPath.components.last?.component.as(KeyPathPropertyComponentSyntax.self)
                    else {
                        throw MacroError(
                            "\(identifier.identifier.text): inverse: takes a key path such as \\Conversation.messages")
                    }
                    inverse = last.declName.baseName.text
                default: break
                }
            }
        }
        self.deleteRule = deleteRule
        self.inverse = inverse
        kind = try Self.kind(of: typeSyntax, property: identifier.identifier.text, relationship: relationship != nil)
    }

    private static func kind(of type: TypeSyntax, property: String, relationship: Bool) throws -> Kind {
        let text = type.trimmedDescription
        if let array = type.as(ArrayTypeSyntax.self) {
            let element = array.element.trimmedDescription
            guard !attributeTypes.contains(element) else {
                throw MacroError("\(property): arrays of values are not attributes; store them as Data or in an entity")
            }
            return .toMany(destination: element)
        }
        var wrapped: String?
        if let optional = type.as(OptionalTypeSyntax.self) { wrapped = optional.wrappedType.trimmedDescription }
        if let iuo = type.as(ImplicitlyUnwrappedOptionalTypeSyntax.self) {
            wrapped = iuo.wrappedType.trimmedDescription
        }
        if let base = wrapped {
            if attributeTypes.contains(base) && !relationship { return .attribute(type: text) }
            return .toOne(destination: base)
        }
        if attributeTypes.contains(text) && !relationship { return .attribute(type: text) }
        throw MacroError(
            "\(property): a to-one relationship must be optional (\(text)?), as in SwiftData; or the type \(text) is not an attribute type"
        )
    }

    static func attributeName(_ element: AttributeListSyntax.Element) -> String? {
        element.as(AttributeSyntax.self)?.attributeName.trimmedDescription
    }

    /// The expression describing the property in the entity.
    func descriptionExpression(className: String) -> String {
        switch kind {
        case .attribute(let type):
            let defaultArgument = initializer.map { ", default: .some(\($0.trimmedDescription))" } ?? ""
            return
                "DataProtectionObjects.AttributeDescription.for(\"\(name)\", (\(type)).self\(defaultArgument), indexed: \(indexed))"
        case .toOne(let destination), .toMany(let destination):
            var toMany = false
            if case .toMany = kind { toMany = true }
            let inverseArgument = inverse.map { "\"\($0)\"" } ?? "nil"
            return
                "DataProtectionObjects.RelationshipDescription(\"\(name)\", to: \"\(destination)\", inverse: \(inverseArgument), toMany: \(toMany), deleteRule: \(deleteRule ?? ".nullify"), indexed: \(indexed))"
        }
    }
}

struct MacroError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
