import Foundation
import OrderedCollections

// ObjectContext: deleting.
extension ObjectContext {
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
                if try destinations(of: member, index: i).contains(where: {
                    !$0.isDeleted && !closure.contains(ObjectIdentifier($0))
                }) {
                    throw ObjectGraphError.deleteDenied(
                        object: member.objectID.description, relationship: relationship.name)
                }
            }
        }
        // 3. Mark, and clear the inverses of the survivors.
        var unsaved: [ManagedObject] = []
        for member in members {
            member.isDeleted = true
            if member.isInserted {
                unsaved.append(member)   // leaves the context below: its ID is still looked up meanwhile
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
        // Objects never saved leave the context (with a permanent ID obtained early too: the
        // store never had that row); until the save, references to them read as deleted.
        for member in unsaved {
            registered.discard(member)
            member.detach()
        }
    }

    func destinations(of object: ManagedObject, index: Int) throws -> [ManagedObject] {
        let relationship = object.entity!.relationships[index]
        if relationship.isToMany { return try toManyIDs(object, index: index).map { self.object(with: $0) } }
        try object.fulfill()
        return object.toOne[object.entity!.toOneIndex[relationship.name]!].map { [self.object(with: $0)] } ?? []
    }
}
