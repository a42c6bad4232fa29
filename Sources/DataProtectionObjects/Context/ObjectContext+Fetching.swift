import Foundation
import OrderedCollections

// ObjectContext: fetching.
extension ObjectContext {
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
            guard case .count(let n) = try store.execute(try storeRequest(request, resultType: .count, merging: false))
            else { return 0 }
            return n
        }
        return try fetchIDs(request, loadValues: nil).count
    }

    /// One dictionary per matching object, holding the properties asked for (attributes, or
    /// key paths through to-one relationships to attributes). Reads the store only, as
    /// CoreData's dictionary results do: unsaved changes are not seen.
    public func fetchDictionaries(_ request: FetchRequest, properties: [String]) throws -> [[String: AttributeValue]] {
        guard
            case .dictionaries(let rows) = try store.execute(
                try storeRequest(request, resultType: .dictionaries(properties), merging: false))
        else {
            return []
        }
        return rows
    }

    func hasPendingChanges(for entity: Entity) -> Bool {
        registered.insertedObjects.contains { entity.includes($0.objectID.entity) }
            || deleted.contains { entity.includes($0.entity) }
    }

    func storeRequest(_ request: FetchRequest, resultType: FetchResultType, merging: Bool) throws -> StoreFetchRequest {
        StoreFetchRequest(
            entity: try model.entity(named: request.entityName), predicate: request.predicate,
            sortKeys: request.sortKeys,
            limit: merging ? nil : request.fetchLimit, offset: merging ? 0 : request.fetchOffset,
            includesSubentities: request.includesSubentities, resultType: resultType,
            includesPropertyValues: resultType == .objects)
    }

    /// Fetches, registers, and merges unsaved inserts and deletes. `loadValues`: true = rows,
    /// false = faults (batched), nil = IDs only (nothing registered).
    func fetchIDs(_ request: FetchRequest, loadValues: Bool?) throws -> [ObjectID] {
        let entity = try model.entity(named: request.entityName)
        let merging = request.includesPendingChanges && hasPendingChanges(for: entity)
        var storeRequest = try storeRequest(
            request, resultType: loadValues == true ? .objects : .objectIDs, merging: merging)
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
        for object in registered.insertedObjects {
            let id = object.objectID
            guard request.includesSubentities ? entity.includes(object.entity!) : object.entity === entity else {
                continue
            }
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
