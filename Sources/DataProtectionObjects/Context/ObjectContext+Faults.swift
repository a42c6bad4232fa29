import Foundation
import OrderedCollections

// ObjectContext: faults.
extension ObjectContext {
    // MARK: - Faults

    /// Loads a fault's values: with its neighbours from the same fetch, in one query.
    func fireFault(_ object: ManagedObject) throws {
        do {
            if let batch = object.faultBatch {
                // The faults among the next `size` of the fetch (registered now if they were not),
                // in key order: stores return rows in that order, so each row meets its object
                // by walking both lists, without a lookup.
                let end = min(object.batchPosition + batch.size, batch.ids.count)
                var faults: [ManagedObject] = []
                faults.reserveCapacity(end - object.batchPosition)
                for position in object.batchPosition..<end {
                    // A temporary ID (an insert the fetch merged in) has no row to load.
                    guard !batch.ids[position].isTemporaryID || position == object.batchPosition else { continue }
                    let candidate = self.object(with: batch.ids[position], batch: batch, position: position)
                    if candidate.isFault { faults.append(candidate) }
                }
                if zip(faults, faults.dropFirst()).contains(where: { $0.objectID.primaryKey > $1.objectID.primaryKey })
                {
                    faults.sort { $0.objectID.primaryKey < $1.objectID.primaryKey }
                }
                var next = 0
                for node in try store.nodes(for: faults.map(\.objectID)) {
                    while next < faults.count, faults[next].objectID.primaryKey < node.objectID.primaryKey { next += 1 }
                    // A row out of that order (a store that does not sort) is found by its ID.
                    let loaded =
                        next < faults.count && faults[next].objectID == node.objectID
                        ? faults[next] : self.object(with: node.objectID)
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
        registered.register(object, as: id)
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
}
