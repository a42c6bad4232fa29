import Foundation

/// An attribute of an entity: its name, type, whether it may be missing, and its default.
///
/// ```swift
/// AttributeDescription("sentAt", .date)
/// AttributeDescription("subject", .string, optional: true)
/// AttributeDescription("unread", .integer32, default: .integer(0))
/// ```
public struct AttributeDescription: Sendable, Hashable, Codable {
    public var name: String
    public var type: AttributeType
    public var isOptional: Bool
    /// The value a new object starts with (and rows get when the attribute is added by a
    /// lightweight migration).
    public var defaultValue: AttributeValue?
    /// Whether a single-column index is created for the attribute.
    public var isIndexed: Bool

    public init(
        _ name: String, _ type: AttributeType, optional: Bool = false, default defaultValue: AttributeValue? = nil,
        indexed: Bool = false
    ) {
        self.name = name
        self.type = type
        self.isOptional = optional
        self.defaultValue = defaultValue
        self.isIndexed = indexed
    }

    enum CodingKeys: String, CodingKey { case name, type, isOptional, hasDefault, isIndexed }
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            try c.decode(String.self, forKey: .name), try c.decode(AttributeType.self, forKey: .type),
            optional: try c.decode(Bool.self, forKey: .isOptional), indexed: try c.decode(Bool.self, forKey: .isIndexed)
        )
        // the value itself is not needed to compare schemas
        if try c.decode(Bool.self, forKey: .hasDefault) { defaultValue = .null }
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(name, forKey: .name)
        try c.encode(type, forKey: .type)
        try c.encode(isOptional, forKey: .isOptional)
        try c.encode(defaultValue != nil, forKey: .hasDefault)
        try c.encode(isIndexed, forKey: .isIndexed)
    }
}

/// What happens to the destination objects when the source object is deleted.
public enum DeleteRule: String, Sendable, Hashable, Codable {
    /// The destinations stay; their inverse relationship to the deleted object is cleared.
    case nullify
    /// The destinations are deleted too.
    case cascade
    /// The save fails while the relationship still has a destination.
    case deny
}

/// A relationship of an entity to one or many objects of another entity.
///
/// ```swift
/// RelationshipDescription("messages", to: "Message", inverse: "conversation", toMany: true, deleteRule: .cascade)
/// RelationshipDescription("conversation", to: "Conversation", inverse: "messages")
/// ```
public struct RelationshipDescription: Sendable, Hashable, Codable {
    public var name: String
    public var destination: String
    public var inverse: String?
    public var isToMany: Bool
    /// For a to-one: whether it may be nil. A to-many may always be empty.
    public var isOptional: Bool
    public var deleteRule: DeleteRule
    /// Whether a single-column index is created for the key column (to-one only).
    public var isIndexed: Bool

    public init(
        _ name: String, to destination: String, inverse: String? = nil, toMany: Bool = false, optional: Bool = true,
        deleteRule: DeleteRule = .nullify, indexed: Bool = false
    ) {
        self.name = name
        self.destination = destination
        self.inverse = inverse
        self.isToMany = toMany
        self.isOptional = optional
        self.deleteRule = deleteRule
        self.isIndexed = indexed
    }
}

/// An index over one or more properties (attributes or to-one relationships) of an entity.
public struct IndexDescription: Sendable, Hashable, Codable {
    public var properties: [String]
    public init(_ properties: [String]) { self.properties = properties }
}

/// An entity: a kind of object with attributes and relationships, like `NSEntityDescription`.
/// An entity with a `parent` is a sub-entity: it has its parent's properties too, is stored in
/// its root entity's table, and a fetch of the parent returns it.
///
/// ```swift
/// EntityDescription("Message", attributes: [AttributeDescription("text", .string)],
///                   relationships: [RelationshipDescription("conversation", to: "Conversation", inverse: "messages")],
///                   indexes: [IndexDescription(["conversation", "sentAt"])])
/// ```
public struct EntityDescription: Sendable, Hashable, Codable {
    public var name: String
    public var parent: String?
    public var isAbstract: Bool
    public var attributes: [AttributeDescription]
    public var relationships: [RelationshipDescription]
    public var indexes: [IndexDescription]

    public init(
        _ name: String, parent: String? = nil, abstract: Bool = false, attributes: [AttributeDescription] = [],
        relationships: [RelationshipDescription] = [], indexes: [IndexDescription] = []
    ) {
        self.name = name
        self.parent = parent
        self.isAbstract = abstract
        self.attributes = attributes
        self.relationships = relationships
        self.indexes = indexes
    }
}
