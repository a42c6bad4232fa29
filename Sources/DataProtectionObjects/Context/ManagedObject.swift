import Foundation
import OrderedCollections

/// One object of a context, like `NSManagedObject`: its values, relationships and change
/// state. Typed models (``PersistentModel``, `@Model` classes) keep one as their backing;
/// the untyped API reads and writes it by property name.
///
/// ```swift
/// let message = context.create("Message")
/// try message.setValue(.string("hello"), forKey: "text")
/// try message.setObject(conversation, forKey: "conversation")
/// let text = try message.value(forKey: "text")
/// ```
///
/// An object fetched from a store may be a *fault*: its values load on first access, its
/// to-many relationships when first read.
public final class ManagedObject {
    /// The object's ID: temporary until the object is saved.
    public internal(set) var objectID: ObjectID
    /// The object's entity (`nil` while a typed model is not inserted in a context).
    public private(set) var entity: Entity?
    /// The context the object is registered in. Held weakly, as in CoreData: keep the context
    /// alive while its objects are used.
    public internal(set) weak var context: ObjectContext?

    /// Whether the values are not loaded yet.
    public internal(set) var isFault: Bool
    public internal(set) var isInserted = false
    public internal(set) var isDeleted = false
    /// Whether the object has unsaved changes to its row.
    public var isUpdated: Bool { !changedAttributes.isEmpty || !changedToOne.isEmpty || hasRelationChanges }
    public var hasChanges: Bool { isInserted || isDeleted || isUpdated }

    var values: [AttributeValue] = []
    var toOne: [ObjectID?] = []
    var version: Int64 = 0
    /// The values as last read from or written to the store (for rollback and merges).
    var committedValues: [AttributeValue] = []
    var committedToOne: [ObjectID?] = []
    var changedAttributes = PropertyIndexes()
    var changedToOne = PropertyIndexes()
    var toMany: [Int: ToManyState] = [:]   // by index in entity.relationships
    var hasRelationChanges: Bool { toMany.values.contains { !$0.added.isEmpty || !$0.removed.isEmpty } }
    /// The fetch this fault came from: firing it loads its neighbours too.
    var faultBatch: FaultBatch?
    /// Where the context keeps the object while it is inserted and not saved.
    var insertionSlot: Int?
    var batchPosition = 0
    /// The typed model wrapping this object (one wrapper per object while it lives). Weak: the
    /// wrapper keeps the context alive, and the context keeps this object.
    weak var typedObject: AnyObject?
    /// Values given before insertion (typed models built with `init`).
    var unattached: [String: UnattachedValue]?
    var modelTypeName: String?

    struct ToManyState {
        var loaded: OrderedSet<ObjectID>?
        var added: OrderedSet<ObjectID> = []
        var removed: Set<ObjectID> = []
    }

    enum UnattachedValue {
        case attribute(AttributeValue)
        case toOne(ManagedObject?)
        case toMany([ManagedObject])
    }

    init(entity: Entity, objectID: ObjectID, context: ObjectContext?, isFault: Bool) {
        self.entity = entity
        self.objectID = objectID
        self.context = context
        self.isFault = isFault
        self.modelTypeName = nil
    }

    /// The backing of a typed model that is not inserted in a context yet: it keeps the values
    /// given until ``ObjectContext/insert(_:)-(PersistentModel)`` binds it to its entity.
    public init(unattachedEntityName name: String) {
        self.entity = nil
        self.objectID = Self.placeholderID
        self.isFault = false
        self.unattached = [:]
        self.modelTypeName = name
    }

    /// The ID of an object not inserted yet.
    static let placeholderID = ObjectID(entity: placeholderEntity, primaryKey: 0)
    static let placeholderEntity = Entity(
        description: EntityDescription("_Unattached"), root: "_Unattached",
        lineage: ["_Unattached"], attributes: [], relationships: [], indexes: [])

    /// Leaves the context (deleted and saved, rolled back, or reset).
    func detach() {
        context = nil
        typedObject = nil
    }

    /// Gives the object its entity and defaults (on insertion).
    func bind(to entity: Entity, id: ObjectID) {
        self.entity = entity
        self.objectID = id
        values = entity.attributes.map { $0.defaultValue ?? .null }
        toOne = Array(repeating: nil, count: entity.toOneRelationships.count)
        committedValues = values
        committedToOne = toOne
        for (i, r) in entity.relationships.enumerated() where r.isToMany { toMany[i] = ToManyState(loaded: []) }
    }

    func fill(with node: StoreNode) {
        values = node.values
        toOne = node.toOne
        version = node.version
        committedValues = node.values
        committedToOne = node.toOne
        isFault = false
        faultBatch = nil
    }

    // MARK: Untyped access

    /// An object not inserted yet joins the context of an object it is related to (as in SwiftData).
    private func joinContext(of related: ManagedObject?) throws {
        guard unattached != nil, let context = related?.context else { return }
        try context.insertUnattached(self)
    }

    private func requireEntity() throws -> Entity {
        guard let entity else {
            throw ObjectGraphError.wrongContext("object of \(modelTypeName ?? "?") (insert it into a context first)")
        }
        return entity
    }

    /// Loads the values if the object is a fault.
    public func fulfill() throws {
        guard isFault else { return }
        guard let context else { throw ObjectGraphError.wrongContext(objectID.description) }
        try context.fireFault(self)
    }

    /// The value of an attribute.
    public func value(forKey key: String) throws -> AttributeValue {
        if let unattached { if case .attribute(let v)? = unattached[key] { return v } else { return .null } }
        let entity = try requireEntity()
        guard let i = entity.attributeIndex[key] else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        try fulfill()
        return values[i]
    }

    /// Sets an attribute.
    public func setValue(_ value: AttributeValue, forKey key: String) throws {
        if unattached != nil { unattached![key] = .attribute(value); return }
        let entity = try requireEntity()
        guard let i = entity.attributeIndex[key] else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        guard value.fits(entity.attributes[i].type) else {
            throw ObjectGraphError.typeMismatch(
                entity: entity.name, property: key, expected: "\(entity.attributes[i].type)")
        }
        try fulfill()
        guard values[i] != value else { return }
        values[i] = value
        if !isInserted { changedAttributes.insert(i) }   // an inserted object is written whole
        context?.didChange(self)
    }

    /// The destination of a to-one relationship.
    public func object(forKey key: String) throws -> ManagedObject? {
        if let unattached { if case .toOne(let o)? = unattached[key] { return o } else { return nil } }
        let entity = try requireEntity()
        guard let i = entity.toOneIndex[key] else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        try fulfill()
        guard let id = toOne[i], let context else { return nil }
        return context.object(with: id)
    }

    /// Sets a to-one relationship (and its inverse).
    public func setObject(_ object: ManagedObject?, forKey key: String) throws {
        try joinContext(of: object)
        if unattached != nil { unattached![key] = .toOne(object); return }
        let entity = try requireEntity()
        guard let context else { throw ObjectGraphError.wrongContext(objectID.description) }
        guard let i = entity.toOneIndex[key] else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        if let object { try context.adopt(object) }
        try context.setToOne(self, index: i, to: object, maintainInverse: true)
    }

    /// The destinations of a to-many relationship, loaded on first access.
    public func objects(forKey key: String) throws -> [ManagedObject] {
        if let unattached { if case .toMany(let list)? = unattached[key] { return list } else { return [] } }
        let entity = try requireEntity()
        guard let i = entity.relationshipIndex(key), entity.relationships[i].isToMany, let context else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        return try context.toManyIDs(self, index: i).map { context.object(with: $0) }
    }

    /// Adds a destination to a to-many relationship (and sets the inverse).
    public func add(_ object: ManagedObject, toKey key: String) throws {
        try joinContext(of: object)
        if unattached != nil {
            if case .toMany(let list)? = unattached![key] {
                unattached![key] = .toMany(list + [object])
            } else {
                unattached![key] = .toMany([object])
            }
            return
        }
        let entity = try requireEntity()
        guard let i = entity.relationshipIndex(key), entity.relationships[i].isToMany, let context else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        try context.adopt(object)
        try context.addToMany(self, index: i, object, maintainInverse: true)
    }

    /// Removes a destination from a to-many relationship (and clears the inverse).
    public func remove(_ object: ManagedObject, fromKey key: String) throws {
        if unattached != nil {
            if case .toMany(let list)? = unattached![key] { unattached![key] = .toMany(list.filter { $0 !== object }) }
            return
        }
        let entity = try requireEntity()
        guard let i = entity.relationshipIndex(key), entity.relationships[i].isToMany, let context else {
            throw ObjectGraphError.unknownProperty(entity: entity.name, property: key)
        }
        try context.removeFromToMany(self, index: i, object, maintainInverse: true)
    }

    /// Replaces the destinations of a to-many relationship.
    public func setObjects(_ objects: [ManagedObject], forKey key: String) throws {
        if let related = objects.first(where: { $0.context != nil }) { try joinContext(of: related) }
        if unattached != nil { unattached![key] = .toMany(objects); return }
        let current = try self.objects(forKey: key)
        let wanted = Set(objects.map(ObjectIdentifier.init))
        for object in current where !wanted.contains(ObjectIdentifier(object)) { try remove(object, fromKey: key) }
        let have = Set(current.map(ObjectIdentifier.init))
        for object in objects where !have.contains(ObjectIdentifier(object)) { try add(object, toKey: key) }
    }

    /// The committed (last saved or fetched) values of the changed attributes.
    public var changedValues: [String: AttributeValue] {
        guard let entity else { return [:] }
        return Dictionary(uniqueKeysWithValues: changedAttributes.map { (entity.attributes[$0].name, values[$0]) })
    }
}

/// The IDs one fetch returned as faults: firing one loads a run of them in one query.
final class FaultBatch {
    let ids: [ObjectID]
    let size: Int
    init(ids: [ObjectID], size: Int) {
        self.ids = ids
        self.size = size
    }
}

/// The result of a batched fetch: a random-access collection of the matching objects, made
/// (as faults) when first accessed and loaded a batch at a time. It keeps its context alive.
///
/// ```swift
/// let messages = try context.fetch(FetchDescriptor<Message>(), batchSize: 500)
/// for message in messages { print(message.text) }   // 500 rows per query
/// ```
public struct FetchResults<Element>: RandomAccessCollection {
    public let context: ObjectContext
    /// The IDs of the matching objects, in order.
    public let objectIDs: [ObjectID]
    let batch: FaultBatch
    let wrap: (ManagedObject) -> Element

    init(context: ObjectContext, ids: [ObjectID], batch: FaultBatch, wrap: @escaping (ManagedObject) -> Element) {
        self.context = context
        self.objectIDs = ids
        self.batch = batch
        self.wrap = wrap
    }

    public var startIndex: Int { 0 }
    public var endIndex: Int { objectIDs.count }
    public subscript(position: Int) -> Element {
        wrap(context.object(with: objectIDs[position], batch: batch, position: position))
    }
}

extension Entity {
    func relationshipIndex(_ name: String) -> Int? { relationshipPositions[name] }
}
