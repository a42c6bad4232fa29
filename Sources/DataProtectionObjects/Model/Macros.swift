import Foundation

/// Makes a class a persistent model, as SwiftData's `@Model`: every stored `var` becomes an
/// attribute (`Int`, `Int16/32/64`, `Double`, `Decimal`, `String`, `Bool`, `Date`, `Data`,
/// `UUID`, `URL`, or optionals of these) or a relationship (`Other?` to-one, `[Other]`
/// to-many, where `Other` is a model). A property's initial value is its default.
///
/// A `@Model` subclass of a `@Model` class is a sub-entity: stored in its superclass's table,
/// and returned (as its own class) by fetches of the superclass. Its properties have no initial
/// values; its `init` calls `super.init` first, then sets them.
///
/// ```swift
/// @Model final class Conversation {
///     var title: String
///     var createdAt: Date = Date()
///     @Relationship(deleteRule: .cascade, inverse: \Message.conversation) var messages: [Message] = []
///     init(title: String) { self.title = title }
/// }
/// ```
@attached(
    member, names: named(_dpBacking), named(_dpContext), named(managedObject), named(init(managedObject:)),
    named(entityDescription), named(propertyName(for:)))
@attached(memberAttribute)
@attached(extension, conformances: PersistentModel)
public macro Model() = #externalMacro(module: "DataProtectionObjectsMacros", type: "ModelMacro")

@attached(accessor, names: named(init), named(get), named(set))
public macro _PersistedProperty() =
    #externalMacro(module: "DataProtectionObjectsMacros", type: "PersistedPropertyMacro")

/// Options of a persisted attribute.
public enum AttributeOption: Sendable {
    /// A single-column index on the attribute.
    case indexed
}

/// Marks an attribute's options: `@Attribute(.indexed) var sentAt: Date`.
@attached(peer)
public macro Attribute(_ options: AttributeOption...) =
    #externalMacro(module: "DataProtectionObjectsMacros", type: "MarkerMacro")

/// A relationship's delete rule and inverse: `@Relationship(deleteRule: .cascade, inverse: \Message.conversation)`.
/// Declaring the inverse on one side is enough.
@attached(peer)
public macro Relationship(deleteRule: DeleteRule = .nullify, inverse: AnyKeyPath? = nil) =
    #externalMacro(module: "DataProtectionObjectsMacros", type: "MarkerMacro")

/// A stored property that is not persisted.
@attached(peer)
public macro Transient() = #externalMacro(module: "DataProtectionObjectsMacros", type: "MarkerMacro")

/// The model's indexes, single or compound: `#Index<Message>([\.sentAt], [\.conversation, \.sentAt])`.
@freestanding(declaration, names: named(_dpIndexes))
public macro Index<T>(_ indexes: [PartialKeyPath<T>]...) =
    #externalMacro(module: "DataProtectionObjectsMacros", type: "IndexMacro")

extension PersistentModel {
    /// The indexes `#Index` declares (none by default).
    public static func _dpIndexes() -> [[AnyKeyPath]] { [] }
}
