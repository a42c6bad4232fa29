import Foundation
import Synchronization

/// A store that keeps objects in memory only: for tests, previews and caches. It implements
/// the same contract, predicates and ordering as ``SQLiteObjectStore``, so a context behaves
/// alike on both.
///
/// ```swift
/// let store = InMemoryObjectStore(model: model)
/// let context = ObjectContext(store: store)
/// ```
public final class InMemoryObjectStore: PersistentStore {
    public let model: ObjectModel
    private let identifier = UUID()

    struct Row {
        var entity: Entity
        var values: [AttributeValue]
        var toOne: [ObjectID?]
        var version: Int64
    }

    struct State {
        /// Rows by root entity, then key.
        var tables: [String: [Int64: Row]] = [:]
        var maxKeys: [String: Int64] = [:]
        /// Join tables: first key → second keys, and second key → first keys.
        var joinsForward: [String: [Int64: [Int64]]] = [:]
        var joinsBackward: [String: [Int64: [Int64]]] = [:]
        /// Per "<root>.<to-one>": destination key → keys of the rows pointing to it (what an
        /// index on a key column gives the SQLite store).
        var pointing: [String: [Int64: Set<Int64>]] = [:]

        mutating func index(_ row: Row, key: Int64, adding: Bool) {
            for (slot, relationship) in row.entity.toOneRelationships.enumerated() {
                guard slot < row.toOne.count, let target = row.toOne[slot] else { continue }
                let name = "\(row.entity.root).\(relationship.name)"
                if adding {
                    pointing[name, default: [:]][target.primaryKey, default: []].insert(key)
                } else {
                    pointing[name]?[target.primaryKey]?.remove(key)
                }
            }
        }
    }
    private let state = Mutex(State())

    public init(model: ObjectModel) {
        self.model = model
    }

    public func loadMetadata() throws -> StoreMetadata {
        StoreMetadata(storeIdentifier: identifier, modelVersionHash: model.versionHash, storeType: "InMemory")
    }

    // MARK: Reading

    public func node(for objectID: ObjectID) throws -> StoreNode {
        try state.withLock { state in
            guard let row = state.tables[objectID.entity.root]?[objectID.primaryKey] else {
                throw ObjectGraphError.objectDeleted(objectID.description)
            }
            return StoreNode(
                objectID: ObjectID(entity: row.entity, primaryKey: objectID.primaryKey), values: row.values,
                toOne: row.toOne, version: row.version)
        }
    }

    public func destinations(of relationship: RelationshipDescription, for objectID: ObjectID) throws -> [ObjectID] {
        try state.withLock { state in try Source(state: state).toMany(relationship, of: objectID) }
    }

    public func execute(_ request: StoreFetchRequest) throws -> StoreFetchResult {
        try state.withLock { state in
            let source = Source(state: state)
            var ids: [ObjectID] = []
            for (key, row) in state.tables[request.entity.root] ?? [:] {
                guard request.includesSubentities ? request.entity.includes(row.entity) : row.entity === request.entity
                else { continue }
                let id = ObjectID(entity: row.entity, primaryKey: key)
                if let predicate = request.predicate, try predicate.evaluate(on: id, source: source) != true {
                    continue
                }
                ids.append(id)
            }
            ids = try Self.sort(ids, by: request.sortKeys, source: source)
            ids = Array(ids.dropFirst(request.offset).prefix(request.limit ?? Int.max))
            switch request.resultType {
            case .count: return .count(ids.count)
            case .objectIDs: return .objectIDs(ids)
            case .objects:
                guard request.includesPropertyValues else { return .objectIDs(ids) }
                return .nodes(
                    ids.map { id in
                        let row = state.tables[id.entity.root]![id.primaryKey]!
                        return StoreNode(objectID: id, values: row.values, toOne: row.toOne, version: row.version)
                    })
            case .dictionaries(let properties):
                return .dictionaries(
                    try ids.map { id in
                        var dictionary: [String: AttributeValue] = [:]
                        for property in properties {
                            guard
                                case .value(let value) = try PredicateOperand.property(
                                    property.split(separator: ".").map(String.init)
                                )
                                .resolve(on: id, source: source)
                            else {
                                throw ObjectGraphError.unsupportedPredicate(
                                    "\(property) is a relationship; dictionaries hold attributes")
                            }
                            dictionary[property] = value
                        }
                        return dictionary
                    })
            }
        }
    }

    /// Sorts as the SQLite store's ORDER BY does: by each key (NULL first), then by primary key.
    static func sort(_ ids: [ObjectID], by keys: [SortKey], source: some ObjectValueSource) throws -> [ObjectID] {
        let decorated = try ids.map { id in
            (
                id,
                try keys.map { key -> AttributeValue in
                    switch try PredicateOperand.property(key.path).resolve(on: id, source: source) {
                    case .value(let v): v
                    case .object(let o): o.map { .integer($0.primaryKey) } ?? .null
                    }
                }
            )
        }
        return decorated.sorted { a, b in
            for (index, key) in keys.enumerated() {
                let order = AttributeValue.sortOrder(a.1[index], b.1[index])
                if order != .orderedSame {
                    return key.ascending ? order == .orderedAscending : order == .orderedDescending
                }
            }
            return a.0.primaryKey < b.0.primaryKey
        }.map(\.0)
    }

    struct Source: ObjectValueSource {
        let state: State
        func row(_ id: ObjectID) throws -> Row {
            guard let row = state.tables[id.entity.root]?[id.primaryKey] else {
                throw ObjectGraphError.objectDeleted(id.description)
            }
            return row
        }
        func attribute(_ index: Int, of id: ObjectID) throws -> AttributeValue { try row(id).values[index] }
        func toOne(_ index: Int, of id: ObjectID) throws -> ObjectID? { try row(id).toOne[index] }
        func toMany(_ relationship: RelationshipDescription, of id: ObjectID) throws -> [ObjectID] {
            let destination = id.entity.destination(of: relationship)
            if let inverse = id.entity.inverseToOne(of: relationship) {
                let keys = state.pointing["\(destination.root).\(inverse.name)"]?[id.primaryKey] ?? []
                return keys.sorted().compactMap { key in
                    guard let row = state.tables[destination.root]?[key], destination.includes(row.entity),
                        let slot = row.entity.toOneIndex[inverse.name], row.toOne[slot] == id
                    else { return nil }
                    return ObjectID(entity: row.entity, primaryKey: key)
                }
            }
            guard let join = id.entity.joinTable(for: relationship) else { return [] }
            let keys = (join.sourceIsFirst ? state.joinsForward : state.joinsBackward)[join.name]?[id.primaryKey] ?? []
            return keys.sorted().compactMap { key in
                state.tables[destination.root]?[key].map { ObjectID(entity: $0.entity, primaryKey: key) }
            }
        }
    }

    // MARK: Writing

    public func obtainPermanentIDs(for entity: Entity, count: Int) throws -> [ObjectID] {
        state.withLock { state in
            let first = state.maxKeys[entity.root, default: 0] + 1
            state.maxKeys[entity.root] = first + Int64(count) - 1
            return (0..<Int64(count)).map { ObjectID(entity: entity, primaryKey: first + $0) }
        }
    }

    public func execute(_ request: SaveChangesRequest) throws {
        try state.withLock { state in
            var conflicts: [String] = []
            for change in request.updated + request.deleted {
                guard let expected = change.expectedVersion else { continue }
                if state.tables[change.objectID.entity.root]?[change.objectID.primaryKey]?.version != expected {
                    conflicts.append(change.objectID.description)
                }
            }
            guard conflicts.isEmpty else { throw ObjectGraphError.conflict(objects: conflicts) }
            for change in request.inserted + request.updated {
                let id = change.objectID
                if let old = state.tables[id.entity.root]?[id.primaryKey] {
                    state.index(old, key: id.primaryKey, adding: false)
                }
                let row = Row(entity: id.entity, values: change.values, toOne: change.toOne, version: change.newVersion)
                state.tables[id.entity.root, default: [:]][id.primaryKey] = row
                state.index(row, key: id.primaryKey, adding: true)
                state.maxKeys[id.entity.root] = max(state.maxKeys[id.entity.root, default: 0], id.primaryKey)
            }
            for change in request.deleted {
                let id = change.objectID
                if let old = state.tables[id.entity.root]?[id.primaryKey] {
                    state.index(old, key: id.primaryKey, adding: false)
                }
                state.tables[id.entity.root]?[id.primaryKey] = nil
                for relationship in id.entity.relationships {
                    guard let join = id.entity.joinTable(for: relationship) else { continue }
                    Self.removeAll(of: id.primaryKey, first: join.sourceIsFirst, table: join.name, state: &state)
                }
            }
            for change in request.relationChanges {
                guard let relationship = change.source.entity.relationship(named: change.relationship),
                    let join = change.source.entity.joinTable(for: relationship)
                else { continue }
                for target in change.removed {
                    let (a, b) =
                        join.sourceIsFirst
                        ? (change.source.primaryKey, target.primaryKey) : (target.primaryKey, change.source.primaryKey)
                    state.joinsForward[join.name]?[a]?.removeAll { $0 == b }
                    state.joinsBackward[join.name]?[b]?.removeAll { $0 == a }
                }
                for target in change.added {
                    let (a, b) =
                        join.sourceIsFirst
                        ? (change.source.primaryKey, target.primaryKey) : (target.primaryKey, change.source.primaryKey)
                    if !(state.joinsForward[join.name]?[a]?.contains(b) ?? false) {
                        state.joinsForward[join.name, default: [:]][a, default: []].append(b)
                        state.joinsBackward[join.name, default: [:]][b, default: []].append(a)
                    }
                }
            }
        }
    }

    private static func removeAll(of key: Int64, first: Bool, table: String, state: inout State) {
        if first {
            for other in state.joinsForward[table]?[key] ?? [] {
                state.joinsBackward[table]?[other]?.removeAll { $0 == key }
            }
            state.joinsForward[table]?[key] = nil
        } else {
            for other in state.joinsBackward[table]?[key] ?? [] {
                state.joinsForward[table]?[other]?.removeAll { $0 == key }
            }
            state.joinsBackward[table]?[key] = nil
        }
    }
}
