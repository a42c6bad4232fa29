import Foundation
import OrderedCollections

// ObjectContext: saving.
extension ObjectContext {
    // MARK: - Saving

    /// Checks required values of the objects to save.
    func validate() throws {
        for id in insertedThenUpdated {
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

    /// The inserted objects' IDs, then the updated ones' not inserted (`inserted.union(updated)`
    /// without a copy of every inserted ID).
    var insertedThenUpdated: InsertedThenUpdated { InsertedThenUpdated(inserted: inserted, updated: updated) }

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

    func remap(_ mapping: [ObjectID: ObjectID]) {
        func swap(_ id: ObjectID) -> ObjectID { mapping[id] ?? id }
        for (old, new) in mapping {
            if let object = registered.removeValue(forKey: old) {
                object.objectID = new
                registered[new] = object
            }
        }
        inserted = OrderedSet(inserted.map(swap))
        // Only temporary IDs can be swapped: permanent ones are not looked up.
        func swapsAny<S: Sequence<ObjectID>>(_ ids: S) -> Bool { ids.contains { $0.isTemporaryID && mapping[$0] != nil } }
        for object in registered.values {
            if object.toOne.contains(where: { $0.map { $0.isTemporaryID && mapping[$0] != nil } ?? false }) {
                object.toOne = object.toOne.map { $0.map(swap) }
            }
            for (index, state) in object.toMany
            where swapsAny(state.added) || swapsAny(state.removed) || state.loaded.map(swapsAny) == true {
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

    func saveRequest() -> SaveChangesRequest {
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
        for id in insertedThenUpdated {
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

    func didSave() {
        for id in insertedThenUpdated {
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

    func resolveConflict(_ object: ManagedObject) throws {
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
    func merge(_ object: ManagedObject, storeTrump: Bool) throws {
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

    func discardChanges(_ object: ManagedObject) {
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
}

/// The IDs of a save: every inserted one, then every updated one not inserted.
struct InsertedThenUpdated: Sequence {
    let inserted: OrderedSet<ObjectID>
    let updated: OrderedSet<ObjectID>

    struct Iterator: IteratorProtocol {
        let inserted: OrderedSet<ObjectID>
        let updated: OrderedSet<ObjectID>
        var index = 0

        mutating func next() -> ObjectID? {
            while index < inserted.count + updated.count {
                defer { index += 1 }
                if index < inserted.count { return inserted[index] }
                let id = updated[index - inserted.count]
                if !inserted.contains(id) { return id }
            }
            return nil
        }
    }

    func makeIterator() -> Iterator { Iterator(inserted: inserted, updated: updated) }
}
