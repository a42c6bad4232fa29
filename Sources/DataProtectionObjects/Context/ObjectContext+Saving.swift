import Foundation
import OrderedCollections

// ObjectContext: saving.
extension ObjectContext {
    // MARK: - Saving

    /// Checks required values of the objects to save.
    func validate() throws {
        for object in insertedThenUpdated {
            guard !object.isDeleted, let entity = object.entity else { continue }
            let id = object.objectID
            for (i, attribute) in entity.attributes.enumerated() where !attribute.isOptional && object.values[i].isNull
            {
                throw ObjectGraphError.missingValue(object: id.description, property: attribute.name)
            }
            for (i, relationship) in entity.toOneRelationships.enumerated() where !relationship.isOptional {
                guard let target = object.toOne[i] else {
                    throw ObjectGraphError.missingValue(object: id.description, property: relationship.name)
                }
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

    /// The inserted objects, then the updated ones.
    var insertedThenUpdated: InsertedThenUpdated { InsertedThenUpdated(registered: registered, updated: updated) }

    /// Gives inserted objects their permanent IDs (the store's keys) now.
    public func obtainPermanentIDs(for objects: [ManagedObject]) throws {
        // Keys in insertion order, per root table (a model has few: a short list, not a table).
        var groups: [(root: String, objects: [ManagedObject])] = []
        var last = -1
        // Inserted objects of this context, each once (a list may name one twice).
        var seen = [Bool](repeating: false, count: registered.slots.count)
        for object in objects where object.objectID.isTemporaryID && object.context === self {
            guard let slot = object.insertionSlot, registered.isInserted(object), !seen[slot] else { continue }
            seen[slot] = true
            let root = object.entity!.root
            if last < 0 || groups[last].root != root {
                last =
                    groups.firstIndex { $0.root == root }
                    ?? {
                        groups.append((root, [])); return groups.count - 1
                    }()
            }
            groups[last].objects.append(object)
        }
        guard !groups.isEmpty else { return }
        var keys: [[ObjectID]] = []
        for group in groups {
            keys.append(try store.obtainPermanentIDs(for: group.objects[0].entity!, count: group.objects.count))
        }
        registered.reserveCapacity(objects.count)
        for (group, ids) in zip(groups, keys) {
            for (object, id) in zip(group.objects, ids) {
                object.objectID = ObjectID(entity: object.entity!, primaryKey: id.primaryKey)
                registered.register(object, as: object.objectID)
            }
        }
        rewriteTemporaryReferences()
    }

    /// Replaces, in every registered object's relationships, the temporary IDs of objects that
    /// now have a permanent one. A temporary ID leads to its object by its slot: no lookup table.
    func rewriteTemporaryReferences() {
        let registered = self.registered
        func current(_ id: ObjectID) -> ObjectID {
            guard id.isTemporaryID, let object = registered.inserted(temporary: id) else { return id }
            return object.objectID
        }
        func changes<S: Sequence<ObjectID>>(_ ids: S) -> Bool { ids.contains { $0.isTemporaryID && current($0) != $0 } }
        registered.forEach { object in
            for i in object.toOne.indices {
                if let id = object.toOne[i], id.isTemporaryID { object.toOne[i] = current(id) }
            }
            guard !object.toMany.isEmpty else { return }
            for (index, state) in object.toMany
            where changes(state.added) || changes(state.removed) || state.loaded.map(changes) == true {
                var state = state
                state.loaded = state.loaded.map { OrderedSet($0.map(current)) }
                state.added = OrderedSet(state.added.map(current))
                state.removed = Set(state.removed.map(current))
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
                let conflicted = (updated.union(deleted)).compactMap { registered[$0] }.filter {
                    names.contains($0.objectID.description)
                }
                for object in conflicted { try resolveConflict(object) }
            }
        }
        didSave()
    }

    func saveRequest() -> SaveChangesRequest {
        var request = SaveChangesRequest()
        let overwrite = mergePolicy == .overwrite
        for object in registered.insertedObjects {
            request.inserted.append(
                StoreObjectChange(
                    objectID: object.objectID, values: object.values, toOne: object.toOne, expectedVersion: nil,
                    newVersion: 1))
        }
        for id in updated {
            guard let object = registered[id], !object.isDeleted else { continue }
            if object.changedAttributes.isEmpty && object.changedToOne.isEmpty { continue }
            request.updated.append(
                StoreObjectChange(
                    objectID: id, values: object.values, toOne: object.toOne,
                    expectedVersion: overwrite ? nil : object.version, newVersion: object.version + 1))
        }
        for id in deleted {
            guard let object = registered[id] else { continue }
            request.deleted.append(
                StoreObjectChange(
                    objectID: id, values: [], toOne: [],
                    expectedVersion: overwrite || object.isFault ? nil : object.version,
                    newVersion: 0))
        }
        for object in insertedThenUpdated {
            guard !object.isDeleted, let entity = object.entity else { continue }
            let id = object.objectID
            for (index, state) in object.toMany where !state.added.isEmpty || !state.removed.isEmpty {
                let relationship = entity.relationships[index]
                guard let join = entity.joinTable(for: relationship), join.sourceIsFirst else { continue }
                let added = state.added.filter { registered[$0]?.isDeleted != true }
                request.relationChanges.append(
                    StoreRelationChange(
                        source: id, relationship: relationship.name, added: Array(added),
                        removed: Array(state.removed)))
            }
        }
        return request
    }

    func didSave() {
        for object in insertedThenUpdated {
            if object.isInserted {
                object.version = 1
            } else if !object.changedAttributes.isEmpty || !object.changedToOne.isEmpty {
                object.version += 1
            }
            object.isInserted = false
            object.committedValues = object.values
            object.committedToOne = object.toOne
            object.changedAttributes = []
            object.changedToOne = []
            for (index, state) in object.toMany {
                object.toMany[index] = ManagedObject.ToManyState(loaded: state.loaded)
            }
        }
        for id in deleted {
            if let object = registered.remove(id) { object.detach() }
        }
        // Relationship deltas recorded on objects outside the save (inverses of one-to-many) are now in the store.
        registered.forEach { object in
            guard !object.toMany.isEmpty, object.hasRelationChanges else { return }
            for (index, state) in object.toMany {
                object.toMany[index] = ManagedObject.ToManyState(loaded: state.loaded)
            }
        }
        registered.clearInserted()
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
        for object in registered.insertedObjects {
            registered.remove(object.objectID)   // one given its key early
            object.detach()
            object.isInserted = false
        }
        registered.clearInserted()
        registered.forEach { object in
            if object.hasChanges || !object.toMany.isEmpty {
                discardChanges(object)
                object.isDeleted = false
            }
        }
        updated = []
        deleted = []
        deferredError = nil
    }

    /// Forgets every registered object (unsaved changes included).
    public func reset() {
        registered.forEach { $0.detach() }
        registered.removeAll()
        updated = []
        deleted = []
        deferredError = nil
    }
}

/// The objects of a save: every inserted one, then every updated one not inserted.
struct InsertedThenUpdated: Sequence {
    let registered: RegisteredObjects
    let updated: OrderedSet<ObjectID>

    struct Iterator: IteratorProtocol {
        let sequence: InsertedThenUpdated
        var index = 0

        mutating func next() -> ManagedObject? {
            let slots = sequence.registered.slots, updated = sequence.updated
            while index < slots.count + updated.count {
                defer { index += 1 }
                if index < slots.count {
                    if let object = slots[index] { return object }
                } else if let object = sequence.registered[updated[index - slots.count]], !object.isInserted {
                    return object
                }
            }
            return nil
        }
    }

    func makeIterator() -> Iterator { Iterator(sequence: self) }
}
