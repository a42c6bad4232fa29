import Foundation
import OrderedCollections

// ObjectContext: faults.
extension ObjectContext {
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
