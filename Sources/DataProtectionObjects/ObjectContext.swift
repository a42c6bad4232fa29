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
    public private(set) var lastFaultError: (any Error)?
    /// A change that could not be applied (a typed setter on an object whose values could not
    /// be loaded): ``save()`` throws it until ``rollback()``.
    private var deferredError: (any Error)?

    private var registered: [ObjectID: ManagedObject] = [:]
    private var inserted: OrderedSet<ObjectID> = []
    private var updated: OrderedSet<ObjectID> = []
    private var deleted: OrderedSet<ObjectID> = []

    public init(store: any PersistentStore) {
        self.store = store
    }

    // MARK: - Registration

    /// The objects registered in the context.
    public var registeredObjects: [ManagedObject] { Array(registered.values) }
    public var insertedObjects: [ManagedObject] { inserted.compactMap { registered[$0] } }
    public var updatedObjects: [ManagedObject] { updated.compactMap { registered[$0] } }
    public var deletedObjects: [ManagedObject] { deleted.compactMap { registered[$0] } }
    public var hasChanges: Bool { !inserted.isEmpty || !updated.isEmpty || !deleted.isEmpty }

    /// The object with this ID: the registered one, or a fault.
    public func object(with id: ObjectID) -> ManagedObject {
        if let object = registered[id] { return object }
        // An ID made with another instance of the same model is taken by entity name.
        var id = id
        if let own = model.entitiesByName[id.entity.name], own !== id.entity { id = ObjectID(entity: own, primaryKey: id.primaryKey) }
        let object = ManagedObject(entity: id.entity, objectID: id, context: self, isFault: true)
        registered[id] = object
        return object
    }

    /// The ID a ``ObjectID/uriRepresentation`` names, or `nil` when it names no entity of the model.
    public func objectID(forURIRepresentation uri: URL) -> ObjectID? {
        let parts = uri.path.split(separator: "/")
        guard uri.scheme == "x-dataprotection", parts.count == 2, let entity = model.entitiesByName[String(parts[0])],
              let first = parts[1].first, let key = Int64(parts[1].dropFirst()), key > 0, first == "p" || first == "t" else { return nil }
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
        let object = ManagedObject(entity: entity, objectID: .temporary(entity), context: self, isFault: false)
        object.bind(to: entity, id: object.objectID)
        register(inserted: object)
        return object
    }

    private func register(inserted object: ManagedObject) {
        object.context = self
        object.isInserted = true
        registered[object.objectID] = object
        inserted.append(object.objectID)
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
        object.bind(to: entity, id: .temporary(entity))
        register(inserted: object)
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

    // MARK: - Faults

    /// Loads a fault's values: with its neighbours from the same fetch, in one query.
    func fireFault(_ object: ManagedObject) throws {
        do {
            if let batch = object.faultBatch {
                let end = min(object.batchPosition + batch.size, batch.ids.count)
                let ids = batch.ids[object.batchPosition..<end].filter { registered[$0].map(\.isFault) ?? true }
                for node in try store.nodes(for: ids) {
                    let loaded = self.object(with: node.objectID)
                    if loaded.isFault { loaded.fill(with: node) }
                }
                if object.isFault { throw ObjectGraphError.objectDeleted(object.objectID.description) }
            } else {
                object.fill(with: try store.node(for: object.objectID))
            }
        } catch {
            lastFaultError = error
            throw error
        }
    }

    /// The object for an ID of a batched fetch: registered now if it was not, as a fault that
    /// loads with its batch.
    func object(with id: ObjectID, batch: FaultBatch, position: Int) -> ManagedObject {
        if let object = registered[id] { return object }
        let object = ManagedObject(entity: id.entity, objectID: id, context: self, isFault: true)
        object.faultBatch = batch
        object.batchPosition = position
        registered[id] = object
        return object
    }

    /// Records an error a typed accessor could not throw.
    func recordFaultError(_ error: any Error, writing: Bool) {
        lastFaultError = error
        if writing && deferredError == nil { deferredError = error }
    }

    /// Turns an object back into a fault (dropping unsaved changes when `mergeChanges` is false)
    /// or, with `mergeChanges`, reloads it keeping this context's changes on top.
    public func refresh(_ object: ManagedObject, mergeChanges: Bool) throws {
        guard object.context === self, !object.isInserted else { return }
        if mergeChanges && object.isUpdated {
            try merge(object, storeTrump: false)
        } else {
            discardChanges(object)
            object.isFault = true
            object.toMany = [:]
        }
    }

    // MARK: - Relationships

    func toManyIDs(_ object: ManagedObject, index: Int) throws -> OrderedSet<ObjectID> {
        if let loaded = object.toMany[index]?.loaded { return loaded }
        let relationship = object.entity!.relationships[index]
        var ids = object.objectID.isTemporaryID ? [] : OrderedSet(try store.destinations(of: relationship, for: object.objectID))
        let state = object.toMany[index] ?? ManagedObject.ToManyState()
        ids.subtract(state.removed)
        ids.append(contentsOf: state.added)
        object.toMany[index, default: ManagedObject.ToManyState()].loaded = ids
        return ids
    }

    func setToOne(_ object: ManagedObject, index: Int, to target: ManagedObject?, maintainInverse: Bool) throws {
        try object.fulfill()
        let entity = object.entity!
        let relationship = entity.toOneRelationships[index]
        if let target, !entity.destination(of: relationship).includes(target.entity!) {
            throw ObjectGraphError.typeMismatch(entity: entity.name, property: relationship.name, expected: relationship.destination)
        }
        let old = object.toOne[index]
        guard old != target?.objectID else { return }
        object.toOne[index] = target?.objectID
        if !object.isInserted { object.changedToOne.insert(index) }   // an inserted object is written whole
        didChange(object)
        guard maintainInverse, let inverseName = relationship.inverse else { return }
        if let old { try unlinkInverse(self.object(with: old), inverseName, from: object) }
        if let target { try linkInverse(target, inverseName, to: object) }
    }

    func addToMany(_ object: ManagedObject, index: Int, _ target: ManagedObject, maintainInverse: Bool) throws {
        let entity = object.entity!
        let relationship = entity.relationships[index]
        if !entity.destination(of: relationship).includes(target.entity!) {
            throw ObjectGraphError.typeMismatch(entity: entity.name, property: relationship.name, expected: relationship.destination)
        }
        // Mutated in place: a copy of the state would copy its sets on every add.
        let added = Self.mutate(object, index) { state -> Bool in
            if state.loaded?.contains(target.objectID) == true { return false }
            if state.loaded == nil && state.added.contains(target.objectID) { return false }
            state.loaded?.append(target.objectID)
            if state.removed.remove(target.objectID) == nil { state.added.append(target.objectID) }
            return true
        }
        guard added else { return }
        if entity.joinTable(for: relationship) != nil { didChange(object) }
        guard maintainInverse, let inverseName = relationship.inverse else { return }
        try linkInverse(target, inverseName, to: object)
    }

    func removeFromToMany(_ object: ManagedObject, index: Int, _ target: ManagedObject, maintainInverse: Bool) throws {
        let entity = object.entity!
        let relationship = entity.relationships[index]
        let removed = Self.mutate(object, index) { state -> Bool in
            if let loaded = state.loaded, !loaded.contains(target.objectID) { return false }
            state.loaded?.remove(target.objectID)
            if state.added.remove(target.objectID) == nil { state.removed.insert(target.objectID) }
            return true
        }
        guard removed else { return }
        if entity.joinTable(for: relationship) != nil { didChange(object) }
        guard maintainInverse, let inverseName = relationship.inverse else { return }
        try unlinkInverse(target, inverseName, from: object)
    }

    private static func mutate<T>(_ object: ManagedObject, _ index: Int, _ body: (inout ManagedObject.ToManyState) -> T) -> T {
        body(&object.toMany[index, default: ManagedObject.ToManyState()])
    }

    /// `target.<inverse>` gains `object`.
    private func linkInverse(_ target: ManagedObject, _ inverseName: String, to object: ManagedObject) throws {
        let entity = target.entity!
        if let i = entity.toOneIndex[inverseName] {
            // One-to-one: the target's previous partner loses it.
            try target.fulfill()
            if let previous = target.toOne[i], previous != object.objectID,
               let back = entity.toOneRelationships[i].inverse {
                let partner = self.object(with: previous)
                try partner.fulfill()
                if let j = partner.entity!.toOneIndex[back], partner.toOne[j] == target.objectID {
                    try setToOne(partner, index: j, to: nil, maintainInverse: false)
                }
            }
            try setToOne(target, index: i, to: object, maintainInverse: false)
        } else if let i = entity.relationshipIndex(inverseName) {
            try addToMany(target, index: i, object, maintainInverse: false)
        }
    }

    /// `target.<inverse>` loses `object`.
    private func unlinkInverse(_ target: ManagedObject, _ inverseName: String, from object: ManagedObject) throws {
        let entity = target.entity!
        if let i = entity.toOneIndex[inverseName] {
            try target.fulfill()
            if target.toOne[i] == object.objectID { try setToOne(target, index: i, to: nil, maintainInverse: false) }
        } else if let i = entity.relationshipIndex(inverseName) {
            try removeFromToMany(target, index: i, object, maintainInverse: false)
        }
    }

    // MARK: - Deleting

    /// Deletes an object, applying the delete rules now: `cascade` deletes the destinations,
    /// `nullify` clears their inverse, `deny` refuses (throwing, changing nothing) while the
    /// relationship has a destination that is not deleted with it.
    public func delete(_ object: ManagedObject) throws {
        try adopt(object)
        guard !object.isDeleted else { return }
        // 1. What cascades.
        var closure: OrderedSet<ObjectIdentifier> = []
        var queue = [object], members: [ManagedObject] = []
        while let next = queue.popLast() {
            guard closure.append(ObjectIdentifier(next)).inserted else { continue }
            members.append(next)
            for (i, relationship) in next.entity!.relationships.enumerated() where relationship.deleteRule == .cascade {
                queue += try destinations(of: next, index: i).filter { !$0.isDeleted }
            }
        }
        // 2. Deny.
        for member in members {
            for (i, relationship) in member.entity!.relationships.enumerated() where relationship.deleteRule == .deny {
                if try destinations(of: member, index: i).contains(where: { !$0.isDeleted && !closure.contains(ObjectIdentifier($0)) }) {
                    throw ObjectGraphError.deleteDenied(object: member.objectID.description, relationship: relationship.name)
                }
            }
        }
        // 3. Mark, and clear the inverses of the survivors.
        for member in members {
            member.isDeleted = true
            if member.isInserted {
                inserted.remove(member.objectID)
            } else {
                deleted.append(member.objectID)
            }
            updated.remove(member.objectID)
        }
        for member in members {
            for (i, relationship) in member.entity!.relationships.enumerated() {
                guard let inverse = relationship.inverse else { continue }
                for target in try destinations(of: member, index: i) where !target.isDeleted {
                    try unlinkInverse(target, inverse, from: member)
                }
            }
        }
        for member in members where member.objectID.isTemporaryID {
            registered[member.objectID] = nil
            member.detach()
        }
    }

    private func destinations(of object: ManagedObject, index: Int) throws -> [ManagedObject] {
        let relationship = object.entity!.relationships[index]
        if relationship.isToMany { return try toManyIDs(object, index: index).map { self.object(with: $0) } }
        try object.fulfill()
        return object.toOne[object.entity!.toOneIndex[relationship.name]!].map { [self.object(with: $0)] } ?? []
    }

    // MARK: - Saving

    /// Checks required values of the objects to save.
    private func validate() throws {
        for id in inserted.union(updated) {
            guard let object = registered[id], !object.isDeleted, let entity = object.entity else { continue }
            for (i, attribute) in entity.attributes.enumerated() where !attribute.isOptional && object.values[i].isNull {
                throw ObjectGraphError.missingValue(object: id.description, property: attribute.name)
            }
            for (i, relationship) in entity.toOneRelationships.enumerated() where !relationship.isOptional {
                guard let target = object.toOne[i] else { throw ObjectGraphError.missingValue(object: id.description, property: relationship.name) }
                if registered[target]?.isDeleted == true {
                    throw ObjectGraphError.missingValue(object: id.description, property: relationship.name)
                }
            }
        }
        for id in deleted {
            guard let object = registered[id] else { continue }
            for (i, relationship) in object.entity!.relationships.enumerated() where relationship.deleteRule == .deny {
                if try destinations(of: object, index: i).contains(where: { !$0.isDeleted }) {
                    throw ObjectGraphError.deleteDenied(object: id.description, relationship: relationship.name)
                }
            }
        }
    }

    /// Gives inserted objects their permanent IDs (the store's keys) now.
    public func obtainPermanentIDs(for objects: [ManagedObject]) throws {
        // Keys in insertion order, per root table.
        var byRoot: OrderedDictionary<String, [ManagedObject]> = [:]
        for object in objects where object.objectID.isTemporaryID && object.context === self {
            byRoot[object.entity!.root, default: []].append(object)
        }
        guard !byRoot.isEmpty else { return }
        var mapping: [ObjectID: ObjectID] = [:]
        for (_, group) in byRoot {
            let ids = try store.obtainPermanentIDs(for: group[0].entity!, count: group.count)
            for (object, id) in zip(group, ids) { mapping[object.objectID] = ObjectID(entity: object.entity!, primaryKey: id.primaryKey) }
        }
        remap(mapping)
    }

    private func remap(_ mapping: [ObjectID: ObjectID]) {
        func swap(_ id: ObjectID) -> ObjectID { mapping[id] ?? id }
        for (old, new) in mapping {
            if let object = registered.removeValue(forKey: old) {
                object.objectID = new
                registered[new] = object
            }
        }
        inserted = OrderedSet(inserted.map(swap))
        for object in registered.values {
            if object.toOne.contains(where: { $0.map { mapping[$0] != nil } ?? false }) {
                object.toOne = object.toOne.map { $0.map(swap) }
            }
            for (index, state) in object.toMany {
                var state = state
                state.loaded = state.loaded.map { OrderedSet($0.map(swap)) }
                state.added = OrderedSet(state.added.map(swap))
                state.removed = Set(state.removed.map(swap))
                object.toMany[index] = state
            }
        }
    }

    /// Writes the changes to the store in one transaction. On a conflict with another
    /// context's save, ``mergePolicy`` decides; with `.error` the save throws
    /// ``ObjectGraphError/conflict(objects:)`` and nothing is written.
    public func save() throws {
        if let deferredError { throw deferredError }
        guard hasChanges else { return }
        try validate()
        try obtainPermanentIDs(for: insertedObjects)
        var attempt = 0
        while true {
            let request = saveRequest()
            do {
                try store.execute(request)
                break
            } catch ObjectGraphError.conflict(let names) where mergePolicy != .error && attempt < 3 {
                attempt += 1
                let conflicted = (updated.union(deleted)).compactMap { registered[$0] }.filter { names.contains($0.objectID.description) }
                for object in conflicted { try resolveConflict(object) }
            }
        }
        didSave()
    }

    private func saveRequest() -> SaveChangesRequest {
        var request = SaveChangesRequest()
        let overwrite = mergePolicy == .overwrite
        for id in inserted {
            guard let object = registered[id] else { continue }
            request.inserted.append(StoreObjectChange(objectID: id, values: object.values, toOne: object.toOne, expectedVersion: nil, newVersion: 1))
        }
        for id in updated {
            guard let object = registered[id], !object.isDeleted else { continue }
            if object.changedAttributes.isEmpty && object.changedToOne.isEmpty { continue }
            request.updated.append(StoreObjectChange(objectID: id, values: object.values, toOne: object.toOne,
                                                     expectedVersion: overwrite ? nil : object.version, newVersion: object.version + 1))
        }
        for id in deleted {
            guard let object = registered[id] else { continue }
            request.deleted.append(StoreObjectChange(objectID: id, values: [], toOne: [], expectedVersion: overwrite || object.isFault ? nil : object.version,
                                                     newVersion: 0))
        }
        for id in inserted.union(updated) {
            guard let object = registered[id], !object.isDeleted, let entity = object.entity else { continue }
            for (index, state) in object.toMany where !state.added.isEmpty || !state.removed.isEmpty {
                let relationship = entity.relationships[index]
                guard let join = entity.joinTable(for: relationship), join.sourceIsFirst else { continue }
                let added = state.added.filter { registered[$0]?.isDeleted != true }
                request.relationChanges.append(StoreRelationChange(source: id, relationship: relationship.name, added: Array(added),
                                                                   removed: Array(state.removed)))
            }
        }
        return request
    }

    private func didSave() {
        for id in inserted.union(updated) {
            guard let object = registered[id] else { continue }
            if object.isInserted { object.version = 1 } else if !object.changedAttributes.isEmpty || !object.changedToOne.isEmpty { object.version += 1 }
            object.isInserted = false
            object.committedValues = object.values
            object.committedToOne = object.toOne
            object.changedAttributes = []
            object.changedToOne = []
            for (index, state) in object.toMany { object.toMany[index] = ManagedObject.ToManyState(loaded: state.loaded) }
        }
        for id in deleted {
            if let object = registered.removeValue(forKey: id) { object.detach() }
        }
        // Relationship deltas recorded on objects outside the save (inverses of one-to-many) are now in the store.
        for object in registered.values where object.hasRelationChanges {
            for (index, state) in object.toMany { object.toMany[index] = ManagedObject.ToManyState(loaded: state.loaded) }
        }
        inserted = []
        updated = []
        deleted = []
    }

    private func resolveConflict(_ object: ManagedObject) throws {
        switch mergePolicy {
        case .error: break
        case .overwrite: break   // the retried request carries no expected versions
        case .rollback:
            discardChanges(object)
            if object.isDeleted {
                object.isDeleted = false
                deleted.remove(object.objectID)
            }
            object.fill(with: try store.node(for: object.objectID))
        case .mergeByPropertyStoreTrump: try merge(object, storeTrump: true)
        case .mergeByPropertyObjectTrump: try merge(object, storeTrump: false)
        }
    }

    /// Reloads an object from the store and lays this context's changes over it: per property,
    /// the store's value wins where the store changed it (`storeTrump`), or this context's
    /// change wins.
    private func merge(_ object: ManagedObject, storeTrump: Bool) throws {
        let node = try store.node(for: object.objectID)
        for i in object.values.indices {
            let storeChanged = node.values[i] != object.committedValues[i]
            if !object.changedAttributes.contains(i) || (storeTrump && storeChanged) {
                object.values[i] = node.values[i]
                object.changedAttributes.remove(i)
            }
        }
        for i in object.toOne.indices {
            let storeChanged = node.toOne[i] != object.committedToOne[i]
            if !object.changedToOne.contains(i) || (storeTrump && storeChanged) {
                object.toOne[i] = node.toOne[i]
                object.changedToOne.remove(i)
            }
        }
        object.committedValues = node.values
        object.committedToOne = node.toOne
        object.version = node.version
    }

    private func discardChanges(_ object: ManagedObject) {
        object.values = object.committedValues
        object.toOne = object.committedToOne
        object.changedAttributes = []
        object.changedToOne = []
        for (index, _) in object.toMany { object.toMany[index] = ManagedObject.ToManyState() }
        updated.remove(object.objectID)
    }

    /// Drops every unsaved change: inserted objects leave the context, changed and deleted
    /// ones get their saved values back, relationships reload.
    public func rollback() {
        for id in inserted {
            if let object = registered.removeValue(forKey: id) {
                object.detach()
                object.isInserted = false
            }
        }
        for object in registered.values {
            if object.hasChanges || !object.toMany.isEmpty {
                discardChanges(object)
                object.isDeleted = false
            }
        }
        inserted = []
        updated = []
        deleted = []
        deferredError = nil
    }

    /// Forgets every registered object (unsaved changes included).
    public func reset() {
        for object in registered.values { object.detach() }
        registered = [:]
        inserted = []
        updated = []
        deleted = []
        deferredError = nil
    }

    // MARK: - Fetching

    /// Objects matching the request (faults when ``FetchRequest/includesPropertyValues`` is false).
    public func fetch(_ request: FetchRequest) throws -> [ManagedObject] {
        try fetchIDs(request, loadValues: request.includesPropertyValues).map { registered[$0]! }
    }

    /// The IDs of the objects matching the request.
    public func fetchObjectIDs(_ request: FetchRequest) throws -> [ObjectID] {
        try fetchIDs(request, loadValues: nil)
    }

    /// The objects matching the request as a collection that makes them when first accessed,
    /// as faults loading `batchSize` at a time (CoreData's `fetchBatchSize`, SwiftData's
    /// `fetch(_:batchSize:)`): only the keys are read now.
    public func fetch(_ request: FetchRequest, batchSize: Int) throws -> FetchResults<ManagedObject> {
        let ids = try fetchIDs(request, loadValues: nil)
        return FetchResults(context: self, ids: ids, batch: FaultBatch(ids: ids, size: max(batchSize, 1))) { $0 }
    }

    /// The number of objects matching the request.
    public func count(_ request: FetchRequest) throws -> Int {
        let entity = try model.entity(named: request.entityName)
        if !request.includesPendingChanges || !hasPendingChanges(for: entity) {
            guard case .count(let n) = try store.execute(try storeRequest(request, resultType: .count, merging: false)) else { return 0 }
            return n
        }
        return try fetchIDs(request, loadValues: nil).count
    }

    /// One dictionary per matching object, holding the properties asked for (attributes, or
    /// key paths through to-one relationships to attributes). Reads the store only, as
    /// CoreData's dictionary results do: unsaved changes are not seen.
    public func fetchDictionaries(_ request: FetchRequest, properties: [String]) throws -> [[String: AttributeValue]] {
        guard case .dictionaries(let rows) = try store.execute(try storeRequest(request, resultType: .dictionaries(properties), merging: false)) else {
            return []
        }
        return rows
    }

    private func hasPendingChanges(for entity: Entity) -> Bool {
        inserted.contains { entity.includes($0.entity) } || deleted.contains { entity.includes($0.entity) }
    }

    private func storeRequest(_ request: FetchRequest, resultType: FetchResultType, merging: Bool) throws -> StoreFetchRequest {
        StoreFetchRequest(entity: try model.entity(named: request.entityName), predicate: request.predicate, sortKeys: request.sortKeys,
                          limit: merging ? nil : request.fetchLimit, offset: merging ? 0 : request.fetchOffset,
                          includesSubentities: request.includesSubentities, resultType: resultType,
                          includesPropertyValues: resultType == .objects)
    }

    /// Fetches, registers, and merges unsaved inserts and deletes. `loadValues`: true = rows,
    /// false = faults (batched), nil = IDs only (nothing registered).
    private func fetchIDs(_ request: FetchRequest, loadValues: Bool?) throws -> [ObjectID] {
        let entity = try model.entity(named: request.entityName)
        let merging = request.includesPendingChanges && hasPendingChanges(for: entity)
        var storeRequest = try storeRequest(request, resultType: loadValues == true ? .objects : .objectIDs, merging: merging)
        storeRequest.includesPropertyValues = loadValues == true
        var ids: [ObjectID]
        switch try store.execute(storeRequest) {
        case .nodes(let nodes):
            ids = nodes.map { node in
                let object = self.object(with: node.objectID)
                if object.isFault || (!object.hasChanges && object.version != node.version) { object.fill(with: node) }
                return node.objectID
            }
        case .objectIDs(let found):
            ids = found
            if loadValues == false {
                let batch = FaultBatch(ids: found, size: 512)
                for (position, id) in found.enumerated() {
                    let object = self.object(with: id)
                    if object.isFault {
                        object.faultBatch = batch
                        object.batchPosition = position
                    }
                }
            }
        default: ids = []
        }
        guard merging else { return ids }
        ids.removeAll { registered[$0]?.isDeleted == true }
        let source = ContextValueSource(context: self)
        for id in inserted {
            guard let object = registered[id], request.includesSubentities ? entity.includes(object.entity!) : object.entity === entity else { continue }
            if let predicate = request.predicate, try predicate.evaluate(on: id, source: source) != true { continue }
            ids.append(id)
        }
        ids = try InMemoryObjectStore.sort(ids, by: request.sortKeys, source: source)
        return Array(ids.dropFirst(request.fetchOffset).prefix(request.fetchLimit ?? Int.max))
    }

    /// Reads registered objects (firing faults) for in-memory evaluation.
    struct ContextValueSource: ObjectValueSource {
        let context: ObjectContext
        func attribute(_ index: Int, of id: ObjectID) throws -> AttributeValue {
            let object = context.object(with: id)
            try object.fulfill()
            return object.values[index]
        }
        func toOne(_ index: Int, of id: ObjectID) throws -> ObjectID? {
            let object = context.object(with: id)
            try object.fulfill()
            return object.toOne[index]
        }
        func toMany(_ relationship: RelationshipDescription, of id: ObjectID) throws -> [ObjectID] {
            let object = context.object(with: id)
            return Array(try context.toManyIDs(object, index: id.entity.relationshipIndex(relationship.name)!))
        }
    }
}
