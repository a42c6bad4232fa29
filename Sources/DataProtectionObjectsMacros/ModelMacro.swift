import SwiftSyntax
import SwiftSyntaxBuilder
import SwiftSyntaxMacros

/// `@Model`: makes a class a `PersistentModel` — a backing object, the entity description,
/// key-path names, and accessors on every stored property.
public struct ModelMacro: MemberMacro, MemberAttributeMacro, ExtensionMacro {
    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self) else {
            throw MacroError("@Model applies to classes")
        }
        let name = classDecl.name.text
        let access =
            classDecl.modifiers.contains { $0.name.text == "public" || $0.name.text == "open" } ? "public " : ""
        let properties = try StoredProperty.all(in: classDecl.memberBlock.members)
        let attributes = properties.filter { if case .attribute = $0.kind { true } else { false } }
        let relationships = properties.filter { if case .attribute = $0.kind { false } else { true } }
        let isFinal = classDecl.modifiers.contains { $0.name.text == "final" }
        // The extension role adds PersistentModel only where it is missing: none to add means the
        // superclass is a model already, and this class is a sub-entity of it.
        let superclass =
            protocols.isEmpty ? classDecl.inheritanceClause?.inheritedTypes.first?.type.trimmedDescription : nil
        if superclass != nil, let property = properties.first(where: { $0.initializer != nil }) {
            throw MacroError(
                "\(property.name): properties of a @Model subclass cannot have initial values; set them in init")
        }
        let hasIndexMacro = classDecl.memberBlock.members.contains {
            $0.decl.as(MacroExpansionDeclSyntax.self)?.macroName.text == "Index"
        }
        let keyPathCases =
            (properties.map { "if keyPath == \\\(name).\($0.name) as AnyKeyPath { return \"\($0.name)\" }" }
            + (superclass == nil ? ["if keyPath == \\\(name).persistentModelID as AnyKeyPath { return \"\" }"] : []))
            .joined(separator: "\n        ")
        let indexes =
            superclass == nil || hasIndexMacro
            ? "_dpIndexes().map { DataProtectionObjects.IndexDescription($0.compactMap { propertyName(for: $0) }) }"
            : "[]"
        let entity = """
            DataProtectionObjects.EntityDescription(
                    \(literal(name)),\(superclass.map { " parent: \(literal($0))," } ?? "")
                    attributes: [\(attributes.map { $0.descriptionExpression(className: name) }.joined(separator: ",\n            "))],
                    relationships: [\(relationships.map { $0.descriptionExpression(className: name) }.joined(separator: ",\n            "))],
                    indexes: \(indexes))
            """
        if superclass != nil {
            return [
                """
                \(raw: access)required init(managedObject: DataProtectionObjects.ManagedObject) {
                    super.init(managedObject: managedObject)
                }
                """,
                """
                \(raw: access)override class var entityDescription: DataProtectionObjects.EntityDescription {
                    \(raw: entity)
                }
                """,
                """
                \(raw: access)override class func propertyName(for keyPath: AnyKeyPath) -> String? {
                    \(raw: keyPathCases)
                    return super.propertyName(for: keyPath)
                }
                """,
            ]
        }
        // A class that may have subclasses keeps its backing visible to them and dispatches its
        // entity dynamically.
        let member = isFinal ? "private " : access.isEmpty ? "" : access
        let kind = isFinal ? "static" : "class"
        return [
            "\(raw: member)var _dpBacking: DataProtectionObjects.ManagedObject? = nil",
            "\(raw: member)var _dpContext: DataProtectionObjects.ObjectContext? = nil",
            """
            \(raw: access)var managedObject: DataProtectionObjects.ManagedObject {
                DataProtectionObjects.ManagedObject._backing(&_dpBacking, context: &_dpContext, entityName: \(raw: isFinal ? literal(name) : "_typeName(type(of: self), qualified: false)"), classIsFinal: \(raw: isFinal ? "true" : "false"), model: self)
            }
            """,
            """
            \(raw: access)required init(managedObject: DataProtectionObjects.ManagedObject) {
                self._dpBacking = managedObject
                self._dpContext = managedObject.context
            }
            """,
            """
            \(raw: access)\(raw: kind) var entityDescription: DataProtectionObjects.EntityDescription {
                \(raw: entity)
            }
            """,
            """
            \(raw: access)\(raw: kind) func propertyName(for keyPath: AnyKeyPath) -> String? {
                \(raw: keyPathCases)
                return nil
            }
            """,
        ]
    }

    private static func literal(_ text: String) -> String { "\"" + text + "\"" }

    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingAttributesFor member: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AttributeSyntax] {
        guard let variable = member.as(VariableDeclSyntax.self), (try? StoredProperty(variable)) != nil else {
            return []
        }
        return ["@_PersistedProperty"]
    }

    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        // A subclass of a model conforms through its superclass already.
        protocols.isEmpty
            ? [] : [try ExtensionDeclSyntax("extension \(type.trimmed): DataProtectionObjects.PersistentModel {}")]
    }
}

/// `@_PersistedProperty`: the accessors of one stored property, reading and writing the backing object.
public struct PersistedPropertyMacro: AccessorMacro {
    public static func expansion(
        of node: AttributeSyntax, providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        guard let variable = declaration.as(VariableDeclSyntax.self), let property = try StoredProperty(variable) else {
            return []
        }
        let name = property.name
        let className = context.lexicalContext.lazy.compactMap { $0.as(ClassDeclSyntax.self) }.first?.name.text ?? ""
        var accessors: [AccessorDeclSyntax] = []
        switch property.kind {
        case .attribute(let type):
            if property.initializer != nil {
                accessors.append(
                    """
                    @storageRestrictions(accesses: _dpBacking)
                    init(initialValue) {
                        DataProtectionObjects.ManagedObject._backing(&_dpBacking, context: nil, entityName: \(literal: className))
                            ._setInitialValue(initialValue.attributeValue, forKey: \(literal: name))
                    }
                    """)
            }
            accessors.append("get { _attribute(\(literal: name), as: (\(raw: type)).self) }")
            accessors.append("set { _setAttribute(\(literal: name), newValue) }")
        case .toOne(let destination):
            if property.initializer != nil {
                accessors.append("@storageRestrictions(accesses: _dpBacking) init(initialValue) { }")
            }
            accessors.append("get { _toOne(\(literal: name), as: \(raw: destination).self) }")
            accessors.append("set { _setToOne(\(literal: name), newValue) }")
        case .toMany(let destination):
            if property.initializer != nil {
                accessors.append("@storageRestrictions(accesses: _dpBacking) init(initialValue) { }")
            }
            accessors.append("get { _toMany(\(literal: name), as: \(raw: destination).self) }")
            accessors.append("set { _setToMany(\(literal: name), newValue) }")
        }
        return accessors
    }
}

/// `@Attribute`, `@Relationship`, `@Transient`: markers read by `@Model`; they add nothing.
public struct MarkerMacro: PeerMacro {
    public static func expansion(
        of node: AttributeSyntax, providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] { [] }
}

/// `#Index<Message>([\.sentAt], [\.conversation, \.sentAt])`: the model's indexes.
public struct IndexMacro: DeclarationMacro {
    public static func expansion(
        of node: some FreestandingMacroExpansionSyntax,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let root = node.genericArgumentClause?.arguments.first?.argument.trimmedDescription else {
            throw MacroError("#Index needs the model type: #Index<Message>([\\.sentAt])")
        }
        let lists = node.arguments.map { "\($0.expression.trimmed) as [PartialKeyPath<\(root)>]" }
        return ["static func _dpIndexes() -> [[AnyKeyPath]] { [\(raw: lists.joined(separator: ", "))] }"]
    }
}
