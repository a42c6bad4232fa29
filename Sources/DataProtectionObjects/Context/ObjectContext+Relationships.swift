import Foundation
import OrderedCollections

// ObjectContext: relationships.
extension ObjectContext {
    // MARK: - Relationships

    func toManyIDs(_ object: ManagedObject, index: Int) throws -> OrderedSet<ObjectID> {
        if let loaded = object.toMany[index]?.loaded { return loaded }
        let relationship = object.entity!.relationships[index]
        var ids =
            object.objectID.isTemporaryID
            ? [] : OrderedSet(try store.destinations(of: relationship, for: object.objectID))
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
            throw ObjectGraphError.typeMismatch(
                entity: entity.name, property: relationship.name, expected: relationship.destination)
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
            throw ObjectGraphError.typeMismatch(
                entity: entity.name, property: relationship.name, expected: relationship.destination)
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

    static func mutate<T>(_ object: ManagedObject, _ index: Int, _ body: (inout ManagedObject.ToManyState) -> T) -> T {
        body(&object.toMany[index, default: ManagedObject.ToManyState()])
    }

    /// `target.<inverse>` gains `object`.
    func linkInverse(_ target: ManagedObject, _ inverseName: String, to object: ManagedObject) throws {
        let entity = target.entity!
        if let i = entity.toOneIndex[inverseName] {
            // One-to-one: the target's previous partner loses it.
            try target.fulfill()
            if let previous = target.toOne[i], previous != object.objectID,
                let back = entity.toOneRelationships[i].inverse
            {
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
    func unlinkInverse(_ target: ManagedObject, _ inverseName: String, from object: ManagedObject) throws {
        let entity = target.entity!
        if let i = entity.toOneIndex[inverseName] {
            try target.fulfill()
            if target.toOne[i] == object.objectID { try setToOne(target, index: i, to: nil, maintainInverse: false) }
        } else if let i = entity.relationshipIndex(inverseName) {
            try removeFromToMany(target, index: i, object, maintainInverse: false)
        }
    }
}
