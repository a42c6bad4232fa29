import Crypto
import DataProtection
import DataProtectionSystem
import Foundation

/// A set of entities, checked and resolved: the equivalent of `NSManagedObjectModel`.
///
/// ```swift
/// let model = try ObjectModel([
///     EntityDescription("Conversation", attributes: [AttributeDescription("title", .string)],
///                       relationships: [RelationshipDescription("messages", to: "Message", inverse: "conversation",
///                                                               toMany: true, deleteRule: .cascade)]),
///     EntityDescription("Message", attributes: [AttributeDescription("text", .string)],
///                       relationships: [RelationshipDescription("conversation", to: "Conversation", inverse: "messages")]),
/// ])
/// ```
///
/// The model's ``versionHash`` is kept in a store's metadata; a store opened with another model
/// is migrated when the change is additive, and refused otherwise.
public final class ObjectModel: Sendable {
    /// The entities as described, in the order given.
    public let descriptions: [EntityDescription]
    /// The resolved entities, by name.
    public let entitiesByName: [String: Entity]
    /// The resolved entities, in the order given.
    public let entities: [Entity]
    /// A SHA-256 over the model's canonical form: what a store compares to detect a change.
    public let versionHash: String
    /// The typed classes of the entities, when built from them.
    let modelTypes = ModelTypes()

    public init(_ descriptions: [EntityDescription]) throws {
        let descriptions = Self.inferInverses(descriptions)
        self.descriptions = descriptions
        var byName: [String: EntityDescription] = [:]
        for description in descriptions {
            guard byName.updateValue(description, forKey: description.name) == nil else {
                throw ObjectGraphError.invalidModel("entity \(description.name) is declared twice")
            }
            guard Self.isIdentifier(description.name) else {
                throw ObjectGraphError.invalidModel("\(description.name) is not a valid entity name")
            }
        }
        let entities = try Self.resolve(descriptions, byName: byName)
        self.entities = entities
        self.entitiesByName = Dictionary(uniqueKeysWithValues: entities.map { ($0.name, $0) })
        let canonical = descriptions.sorted { $0.name < $1.name }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let json = (try? encoder.encode(canonical)) ?? Data()
        self.versionHash = Array(SHA256.hash(data: json)).hex
        for entity in entities { entity.model = self }
    }

    /// The entity named `name`.
    public func entity(named name: String) throws -> Entity {
        guard let entity = entitiesByName[name] else { throw ObjectGraphError.unknownEntity(name) }
        return entity
    }

    /// A relationship whose inverse names it back gets that inverse filled in when it declares
    /// none (so declaring it on one side is enough, as in SwiftData).
    private static func inferInverses(_ descriptions: [EntityDescription]) -> [EntityDescription] {
        var result = descriptions
        for entity in descriptions {
            for relationship in entity.relationships {
                guard let inverse = relationship.inverse,
                    let e = result.firstIndex(where: { $0.name == relationship.destination }),
                    let r = result[e].relationships.firstIndex(where: { $0.name == inverse }),
                    result[e].relationships[r].inverse == nil,
                    result[e].relationships[r].destination == entity.name
                else { continue }
                result[e].relationships[r].inverse = relationship.name
            }
        }
        return result
    }

    static func isIdentifier(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, first == "_" || CharacterSet.letters.contains(first) else {
            return false
        }
        return name.unicodeScalars.allSatisfy { $0 == "_" || CharacterSet.alphanumerics.contains($0) }
            && name.utf8.count <= 64
            && !name.uppercased().hasPrefix("Z_")
    }

    private static func resolve(
        _ descriptions: [EntityDescription], byName: [String: EntityDescription]
    ) throws -> [Entity] {
        // Parents before children, and no cycles.
        func chain(_ name: String) throws -> [EntityDescription] {
            var result: [EntityDescription] = []
            var current: String? = name
            while let n = current {
                guard let d = byName[n] else {
                    throw ObjectGraphError.invalidModel("entity \(name) has unknown parent \(n)")
                }
                guard !result.contains(where: { $0.name == n }) else {
                    throw ObjectGraphError.invalidModel("entity \(name) inherits from itself")
                }
                result.insert(d, at: 0)
                current = d.parent
            }
            return result
        }
        var resolved: [String: Entity] = [:]
        for description in descriptions {
            let lineage = try chain(description.name)
            var attributes: [AttributeDescription] = []
            var relationships: [RelationshipDescription] = []
            var indexes: [IndexDescription] = []
            var names = Set<String>()
            var owners: [String: String] = [:]
            for d in lineage {
                for a in d.attributes {
                    guard Self.isIdentifier(a.name), names.insert(a.name).inserted else {
                        throw ObjectGraphError.invalidModel(
                            "\(description.name).\(a.name) is declared twice or is not a valid name")
                    }
                    if let value = a.defaultValue, !value.fits(a.type) {
                        throw ObjectGraphError.invalidModel("the default of \(d.name).\(a.name) is not a \(a.type)")
                    }
                    attributes.append(a)
                }
                for r in d.relationships {
                    guard Self.isIdentifier(r.name), names.insert(r.name).inserted else {
                        throw ObjectGraphError.invalidModel(
                            "\(description.name).\(r.name) is declared twice or is not a valid name")
                    }
                    relationships.append(r)
                    owners[r.name] = d.name
                }
                indexes += d.indexes
            }
            let root = lineage[0].name
            resolved[description.name] = Entity(
                description: description, root: root, lineage: lineage.map(\.name),
                attributes: attributes, relationships: relationships, indexes: indexes)
            resolved[description.name]!.relationshipOwners = owners
        }
        // Relationships: destinations exist, inverses point back.
        for entity in resolved.values {
            for r in entity.relationships {
                guard let destination = resolved[r.destination] else {
                    throw ObjectGraphError.invalidModel(
                        "\(entity.name).\(r.name) points to unknown entity \(r.destination)")
                }
                if let inverseName = r.inverse {
                    guard let inverse = destination.relationship(named: inverseName) else {
                        throw ObjectGraphError.invalidModel(
                            "\(entity.name).\(r.name): inverse \(r.destination).\(inverseName) does not exist")
                    }
                    guard inverse.inverse == r.name, entity.lineage.contains(inverse.destination) else {
                        throw ObjectGraphError.invalidModel(
                            "\(entity.name).\(r.name) and \(r.destination).\(inverseName) are not each other's inverse")
                    }
                }
            }
            for index in entity.indexes {
                for property in index.properties {
                    let isToOne = entity.relationship(named: property).map { !$0.isToMany } ?? false
                    guard entity.attributeIndex[property] != nil || isToOne else {
                        throw ObjectGraphError.invalidModel(
                            "index on \(entity.name) names \(property), which is not an attribute or to-one relationship"
                        )
                    }
                }
            }
        }
        for entity in resolved.values {
            entity.subentityNames = Set(resolved.values.filter { $0.lineage.contains(entity.name) }.map(\.name))
            entity.subentities = resolved.values.filter { entity.subentityNames.contains($0.name) }
        }
        // Entity codes unique within a root table.
        var codes: [String: Set<Int64>] = [:]
        for entity in resolved.values {
            guard codes[entity.root, default: []].insert(entity.code).inserted else {
                throw ObjectGraphError.invalidModel("entity codes of \(entity.name) collide; rename the entity")
            }
        }
        return descriptions.map { resolved[$0.name]! }
    }
}

/// An entity of a model with everything it inherits resolved: what contexts and stores use.
/// `@unchecked Sendable`: its `nonisolated(unsafe)` links (sub-entities, owners, model) are set while the model is
/// built, before it is shared; read-only afterwards.
public final class Entity: @unchecked Sendable, CustomStringConvertible {
    public let name: String
    /// The entity whose table holds this one's rows (itself, unless it is a sub-entity).
    public let root: String
    /// The names from the root entity down to this one.
    public let lineage: [String]
    /// The entity as declared (its own properties only).
    public let declaration: EntityDescription
    /// All attributes, inherited ones first.
    public let attributes: [AttributeDescription]
    /// All relationships, inherited ones first.
    public let relationships: [RelationshipDescription]
    public let indexes: [IndexDescription]
    /// The to-one relationships, in order: their values are kept beside the attributes.
    public let toOneRelationships: [RelationshipDescription]
    /// The value stored in the root table's `Z_ENT` column for rows of this entity.
    public let code: Int64
    let attributeIndex: [String: Int]
    let toOneIndex: [String: Int]
    let relationshipPositions: [String: Int]
    // Set once while the model is built, read-only afterwards.
    nonisolated(unsafe) public internal(set) var subentityNames: Set<String> = []
    nonisolated(unsafe) var subentities: [Entity] = []
    /// The entity that declares each relationship (a parent, for inherited ones).
    nonisolated(unsafe) var relationshipOwners: [String: String] = [:]
    // Strong on purpose: entities outlive nothing without their model (a model is built once, kept for the process).
    nonisolated(unsafe) var model: ObjectModel?

    init(
        description: EntityDescription, root: String, lineage: [String], attributes: [AttributeDescription],
        relationships: [RelationshipDescription], indexes: [IndexDescription]
    ) {
        self.name = description.name
        self.declaration = description
        self.root = root
        self.lineage = lineage
        self.attributes = attributes
        self.relationships = relationships
        self.indexes =
            indexes + attributes.filter(\.isIndexed).map { IndexDescription([$0.name]) }
            + relationships.filter { $0.isIndexed && !$0.isToMany }.map { IndexDescription([$0.name]) }
        self.toOneRelationships = relationships.filter { !$0.isToMany }
        self.attributeIndex = Dictionary(uniqueKeysWithValues: attributes.enumerated().map { ($1.name, $0) })
        self.toOneIndex = Dictionary(uniqueKeysWithValues: toOneRelationships.enumerated().map { ($1.name, $0) })
        self.relationshipPositions = Dictionary(uniqueKeysWithValues: relationships.enumerated().map { ($1.name, $0) })
        let digest = SHA256.hash(data: Data(description.name.utf8))
        self.code = Int64(digest.prefix(4).reduce(0) { $0 << 8 | UInt32($1) } & 0x7fff_ffff)
    }

    public var description: String { name }

    public func relationship(named name: String) -> RelationshipDescription? {
        relationshipPositions[name].map { relationships[$0] }
    }

    public func attribute(named name: String) -> AttributeDescription? {
        attributeIndex[name].map { attributes[$0] }
    }

    /// Whether `other` is this entity or one of its sub-entities.
    public func includes(_ other: Entity) -> Bool { other === self || subentityNames.contains(other.name) }

    func destination(of relationship: RelationshipDescription) -> Entity {
        model!.entitiesByName[relationship.destination]!
    }
}

/// Where a to-many relationship that is not the inverse of a to-one is kept: a join table of
/// (first, second) key pairs, shared by the relationship and its to-many inverse.
struct JoinTable: Hashable {
    let name: String
    /// Whether this relationship's source is the table's first column.
    let sourceIsFirst: Bool
}

extension Entity {
    /// The join table of a to-many relationship, or `nil` when it is the inverse of a to-one
    /// (its destinations are then found through the destination's key column).
    func joinTable(for relationship: RelationshipDescription) -> JoinTable? {
        guard relationship.isToMany else { return nil }
        let mine = "\(relationshipOwners[relationship.name] ?? name)_\(relationship.name)"
        guard let inverseName = relationship.inverse else { return JoinTable(name: "Z_" + mine, sourceIsFirst: true) }
        let destination = destination(of: relationship)
        guard let inverse = destination.relationship(named: inverseName), inverse.isToMany else { return nil }
        let theirs = "\(destination.relationshipOwners[inverseName] ?? destination.name)_\(inverseName)"
        return mine <= theirs
            ? JoinTable(name: "Z_" + mine, sourceIsFirst: true) : JoinTable(name: "Z_" + theirs, sourceIsFirst: false)
    }

    /// For a to-many that is the inverse of a to-one: the destination's to-one relationship.
    func inverseToOne(of relationship: RelationshipDescription) -> RelationshipDescription? {
        guard relationship.isToMany, let inverseName = relationship.inverse,
            let inverse = destination(of: relationship).relationship(named: inverseName), !inverse.isToMany
        else { return nil }
        return inverse
    }
}
