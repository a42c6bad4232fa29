import Foundation

/// A fetch by entity name, like `NSFetchRequest`.
///
/// ```swift
/// var request = FetchRequest(entityName: "Message")
/// request.predicate = .compare("sentAt", .greater, .date(yesterday))
/// request.sortKeys = [SortKey("sentAt", ascending: false)]
/// request.fetchLimit = 50
/// let messages = try context.fetch(request)
/// ```
public struct FetchRequest: Sendable {
    public var entityName: String
    public var predicate: ObjectPredicate?
    public var sortKeys: [SortKey] = []
    public var fetchLimit: Int?
    public var fetchOffset: Int = 0
    /// Whether objects of sub-entities match too (the default, as in CoreData).
    public var includesSubentities = true
    /// Whether objects come with their values (faults then fire without a query). When
    /// `false`, only IDs are read and values load on first access, in batches.
    public var includesPropertyValues = true
    /// Whether unsaved inserts and deletes of the context count (the default).
    public var includesPendingChanges = true

    public init(entityName: String, predicate: ObjectPredicate? = nil, sortKeys: [SortKey] = []) {
        self.entityName = entityName
        self.predicate = predicate
        self.sortKeys = sortKeys
    }
}

/// How a save resolves objects another context changed since this one read them, as
/// CoreData's merge policies.
public enum MergePolicy: Sendable, Hashable {
    /// The save fails with ``ObjectGraphError/conflict(objects:)`` (the default).
    case error
    /// Per property: what the store has wins where it changed; this context's changes win elsewhere.
    case mergeByPropertyStoreTrump
    /// Per property: this context's changes win; the store's values fill the rest.
    case mergeByPropertyObjectTrump
    /// This context's version of the objects replaces the store's.
    case overwrite
    /// This context's changes to the conflicting objects are dropped.
    case rollback
}
