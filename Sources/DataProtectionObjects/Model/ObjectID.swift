import Foundation

/// Identifies one object across contexts, like `NSManagedObjectID`: its entity and its primary
/// key. An object inserted in a context has a temporary ID until it is saved (or until
/// ``ObjectContext/obtainPermanentIDs(for:)``); then its permanent ID is its row's key, which
/// is never 0.
public struct ObjectID: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The object's entity.
    public let entity: Entity
    /// The primary key: positive for a permanent ID, negative for a temporary one.
    public let primaryKey: Int64

    init(entity: Entity, primaryKey: Int64) {
        self.entity = entity
        self.primaryKey = primaryKey
    }

    /// Whether the ID is temporary (the object was never saved).
    public var isTemporaryID: Bool { primaryKey < 0 }

    /// A URI naming the object, like `NSManagedObjectID.uriRepresentation()`:
    /// `x-dataprotection:///Message/p42`.
    public var uriRepresentation: URL {
        URL(string: "x-dataprotection:///\(entity.name)/\(isTemporaryID ? "t\(-primaryKey)" : "p\(primaryKey)")")!
    }

    /// Encodes as ``uriRepresentation`` (so IDs can appear in `#Predicate`). Decoding needs the
    /// model: use ``ObjectContext/objectID(forURIRepresentation:)`` instead.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(uriRepresentation)
    }

    public init(from decoder: any Decoder) throws {
        throw DecodingError.dataCorrupted(
            .init(
                codingPath: decoder.codingPath,
                debugDescription: "an ObjectID is decoded with ObjectContext.objectID(forURIRepresentation:)"))
    }

    public var description: String { "\(entity.name)/\(isTemporaryID ? "t\(-primaryKey)" : "p\(primaryKey)")" }

    public static func == (lhs: ObjectID, rhs: ObjectID) -> Bool {
        lhs.primaryKey == rhs.primaryKey && lhs.entity.root == rhs.entity.root
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(primaryKey)   // unique within a root entity; == compares the root too
    }
}
