import Foundation
import OrderedCollections

/// A scratchpad of objects over a store, like `NSManagedObjectContext`: insert, fetch,
/// change, delete, then ``save()`` (one transaction) or ``rollback()``. A context holds one
/// object per ID; fetched objects are faults whose values and relationships load when first
/// used; inverse relationships are kept in step; delete rules apply when an object is deleted.
///
/// A context is not thread-safe: use it from one task or thread (several contexts may share a
/// store and save concurrently; a conflict is resolved by ``mergePolicy``).
///
/// ```swift
/// let context = ObjectContext(store: store)
/// let conversation = Conversation(title: "Team")
/// context.insert(conversation)
/// conversation.messages.append(Message(text: "hello"))
/// try context.save()
/// ```
public final class ObjectContext {
    public let store: any PersistentStore
    public var model: ObjectModel { store.model }
    /// How ``save()`` resolves conflicts with other contexts' saves.
    public var mergePolicy: MergePolicy = .error
    /// The last error met while firing a fault through a typed property (typed getters cannot
    /// throw; they return a placeholder and the error is kept here).
    public internal(set) var lastFaultError: (any Error)?
    /// A change that could not be applied (a typed setter on an object whose values could not
    /// be loaded): ``save()`` throws it until ``rollback()``.
    var deferredError: (any Error)?

    var registered = RegisteredObjects()
    var updated: OrderedSet<ObjectID> = []
    var deleted: OrderedSet<ObjectID> = []

    public init(store: any PersistentStore) {
        self.store = store
    }

    // MARK: - Registration

    /// The objects registered in the context.
    public var registeredObjects: [ManagedObject] {
        var objects: [ManagedObject] = []
        registered.forEach { objects.append($0) }
        return objects
    }
    public var insertedObjects: [ManagedObject] { Array(registered.insertedObjects) }
    public var updatedObjects: [ManagedObject] { updated.compactMap { registered[$0] } }
    public var deletedObjects: [ManagedObject] { deleted.compactMap { registered[$0] } }
    public var hasChanges: Bool { registered.insertedCount > 0 || !updated.isEmpty || !deleted.isEmpty }

    /// The object with this ID: the registered one, or a fault.
    public func object(with id: ObjectID) -> ManagedObject {
        if let object = registered[id] { return object }
        // An ID made with another instance of the same model is taken by entity name.
        var id = id
        if let own = model.entitiesByName[id.entity.name], own !== id.entity {
            id = ObjectID(entity: own, primaryKey: id.primaryKey)
        }
        let object = ManagedObject(entity: id.entity, objectID: id, context: self, isFault: true)
        registered.register(object, as: id)
        return object
    }

    /// The ID a ``ObjectID/uriRepresentation`` names, or `nil` when it names no entity of the model.
    public func objectID(forURIRepresentation uri: URL) -> ObjectID? {
        let parts = uri.path.split(separator: "/")
        guard uri.scheme == "x-dataprotection", parts.count == 2, let entity = model.entitiesByName[String(parts[0])],
            let first = parts[1].first, let key = Int64(parts[1].dropFirst()), key > 0, first == "p" || first == "t"
        else { return nil }
        return ObjectID(entity: entity, primaryKey: first == "p" ? key : -key)
    }

    /// The object with this ID, with its values loaded; throws when the store has no such object.
    public func existingObject(with id: ObjectID) throws -> ManagedObject {
        let object = self.object(with: id)
        try object.fulfill()
        return object
    }

    /// A new object of the entity, inserted in the context (`insertNewObject(forEntityName:into:)`).
    public func create(_ entityName: String) throws -> ManagedObject {
        let entity = try model.entity(named: entityName)
        guard !entity.declaration.isAbstract else { throw ObjectGraphError.invalidModel("\(entityName) is abstract") }
        let object = ManagedObject(entity: entity, objectID: ManagedObject.placeholderID, context: self, isFault: false)
        register(inserted: object, entity: entity)
        return object
    }

    /// Gives a new object its entity, defaults and temporary ID, as inserted here.
    func register(inserted object: ManagedObject, entity: Entity) {
        object.bind(to: entity, id: registered.insert(object, entity: entity))
        object.context = self
        object.isInserted = true
    }

    /// Inserts an object built outside the context (a typed model's backing), with the values
    /// and related objects it was given.
    func insertUnattached(_ object: ManagedObject) throws {
        guard let pending = object.unattached else {
            guard object.context === self else { throw ObjectGraphError.wrongContext(object.objectID.description) }
            return
        }
        let entity = try model.entity(named: object.modelTypeName ?? "")
        guard !entity.declaration.isAbstract else { throw ObjectGraphError.invalidModel("\(entity.name) is abstract") }
        object.unattached = nil
        register(inserted: object, entity: entity)
        for (key, value) in pending {
            switch value {
            case .attribute(let v): try object.setValue(v, forKey: key)
            case .toOne(let target): try object.setObject(target, forKey: key)
            case .toMany(let targets): for target in targets { try object.add(target, toKey: key) }
            }
        }
    }

    /// Makes sure a related object belongs here (inserting it when it was never inserted).
    func adopt(_ object: ManagedObject) throws {
        if object.unattached != nil { try insertUnattached(object); return }
        guard object.context === self else { throw ObjectGraphError.wrongContext(object.objectID.description) }
    }

    func didChange(_ object: ManagedObject) {
        if !object.isInserted && !object.isDeleted { updated.append(object.objectID) }
    }

}
