import Foundation

/// A store's metadata: which model wrote it, and the store's identity.
public struct StoreMetadata: Sendable, Equatable {
    public var storeIdentifier: UUID
    public var modelVersionHash: String
    public var storeType: String
}

/// A row of the store for one object, as `NSIncrementalStoreNode`: attribute values (in the
/// entity's attribute order), to-one destinations (in the entity's to-one order), and the
/// version the optimistic locking compares.
public struct StoreNode: Sendable, Equatable {
    public var objectID: ObjectID
    public var values: [AttributeValue]
    public var toOne: [ObjectID?]
    public var version: Int64
}

/// What a fetch returns, as `NSFetchRequestResultType`.
public enum FetchResultType: Sendable, Hashable {
    /// Objects (faults that load their values on first access, or filled objects).
    case objects
    /// Only the object IDs.
    case objectIDs
    /// One dictionary per object with the properties asked for.
    case dictionaries([String])
    /// The number of matching objects.
    case count
}

/// A fetch as a store executes it.
public struct StoreFetchRequest: Sendable {
    public var entity: Entity
    public var predicate: ObjectPredicate?
    public var sortKeys: [SortKey]
    public var limit: Int?
    public var offset: Int
    public var includesSubentities: Bool
    public var resultType: FetchResultType
    /// For `.objects`: load the rows now (faults fire without asking the store again).
    public var includesPropertyValues: Bool
}

/// What a store returns for a fetch.
public enum StoreFetchResult: Sendable {
    case nodes([StoreNode])
    case objectIDs([ObjectID])
    case dictionaries([[String: AttributeValue]])
    case count(Int)
}

/// One object's state to write, in a ``SaveChangesRequest``.
public struct StoreObjectChange: Sendable {
    public var objectID: ObjectID
    public var values: [AttributeValue]
    public var toOne: [ObjectID?]
    /// The version this context read (for updates and deletes); `nil` to write regardless.
    public var expectedVersion: Int64?
    /// The version written.
    public var newVersion: Int64
}

/// A change to a to-many relationship kept in a join table (many-to-many, or to-many without
/// an inverse): pairs added and removed.
public struct StoreRelationChange: Sendable {
    public var source: ObjectID
    public var relationship: String
    public var added: [ObjectID]
    public var removed: [ObjectID]
}

/// A save, as `NSSaveChangesRequest`: applied as one transaction or not at all.
public struct SaveChangesRequest: Sendable {
    public var inserted: [StoreObjectChange] = []
    public var updated: [StoreObjectChange] = []
    public var deleted: [StoreObjectChange] = []
    public var relationChanges: [StoreRelationChange] = []
}

/// The incremental-store contract, as CoreData's `NSIncrementalStore`: what a context needs
/// from storage. ``SQLiteObjectStore`` keeps objects in an (encrypted) SQLite database,
/// ``InMemoryObjectStore`` in memory; contexts work the same on both.
///
/// Stores are safe to use from several contexts and threads; a save is atomic.
public protocol PersistentStore: AnyObject, Sendable {
    /// The model the store was opened with.
    var model: ObjectModel { get }
    /// The store's metadata (`loadMetadata`).
    func loadMetadata() throws -> StoreMetadata
    /// Executes a fetch.
    func execute(_ request: StoreFetchRequest) throws -> StoreFetchResult
    /// Executes a save. Throws ``ObjectGraphError/conflict(objects:)`` (writing nothing) when
    /// an updated or deleted object's version is not the expected one.
    func execute(_ request: SaveChangesRequest) throws
    /// The row of one object (`newValuesForObjectWithID`): fires a fault.
    func node(for objectID: ObjectID) throws -> StoreNode
    /// The destinations of a to-many relationship (`newValueForRelationship`).
    func destinations(of relationship: RelationshipDescription, for objectID: ObjectID) throws -> [ObjectID]
    /// The rows of several objects of one root entity, in one go where the store can.
    func nodes(for objectIDs: [ObjectID]) throws -> [StoreNode]
    /// Permanent IDs for new objects of `entity`: keys allocated as the table's maximum + 1,
    /// never 0, never reused by another context.
    func obtainPermanentIDs(for entity: Entity, count: Int) throws -> [ObjectID]
}

extension PersistentStore {
    /// The rows of several objects of one root entity (batch fault firing). Stores that can
    /// read them in one query override it; objects no longer in the store are left out.
    public func nodes(for objectIDs: [ObjectID]) throws -> [StoreNode] {
        try objectIDs.compactMap { id in
            do { return try node(for: id) } catch ObjectGraphError.objectDeleted { return nil }
        }
    }
}
