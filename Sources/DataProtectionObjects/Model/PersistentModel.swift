import Foundation

/// A Swift class whose instances are objects of an entity, like a SwiftData `@Model` class.
/// Write it with the ``Model()`` macro, which generates everything this protocol asks for:
///
/// ```swift
/// @Model final class Message {
///     var text: String
///     @Attribute(.indexed) var sentAt: Date
///     var conversation: Conversation?
///     @Relationship(deleteRule: .cascade, inverse: \Attachment.message) var attachments: [Attachment]
///     init(text: String, sentAt: Date) { self.text = text; self.sentAt = sentAt }
/// }
/// ```
///
/// Typed getters cannot throw: when a value cannot be loaded (the store's class is locked, the
/// object was deleted elsewhere) they return a placeholder, and the error is kept in
/// ``ObjectContext/lastFaultError``; a setter that fails this way makes the next
/// ``ObjectContext/save()`` throw it, so a placeholder is never written back.
public protocol PersistentModel: AnyObject, Hashable {
    /// The entity the class stands for.
    static var entityDescription: EntityDescription { get }
    /// The property a key path of the class names (for `#Predicate` and `SortDescriptor`).
    static func propertyName(for keyPath: AnyKeyPath) -> String?
    /// The object behind the instance.
    var managedObject: ManagedObject { get }
    /// Wraps an object of the context (used when fetching).
    init(managedObject: ManagedObject)
}

extension ObjectModel {
    /// The model of typed classes: `try ObjectModel(types: [Account.self, Conversation.self, Message.self])`.
    public convenience init(types: [any PersistentModel.Type]) throws {
        try self.init(types.map { $0.entityDescription })
        for type in types { modelTypes.set(type, for: type.entityDescription.name) }
    }
}

/// The Swift classes of a model's entities (set once, when the model is built).
/// `@unchecked Sendable`: written only while the model is built, before it is shared; read-only afterwards.
final class ModelTypes: @unchecked Sendable {
    private var types: [String: any PersistentModel.Type] = [:]
    func set(_ type: any PersistentModel.Type, for name: String) { types[name] = type }
    subscript(name: String) -> (any PersistentModel.Type)? { types[name] }
}

extension ManagedObject {
    /// The typed instance for this object: the live one, or a new wrapper.
    func typed<T: PersistentModel>(_ type: T.Type) -> T {
        if let existing = typedObject as? T { return existing }
        let concrete = (entity.flatMap { context?.model.modelTypes[$0.name] } as? T.Type) ?? T.self
        let made = concrete.init(managedObject: self)
        typedObject = made
        return made
    }

    /// Used by `@Model`: the backing of a typed instance, made when first needed (an instance
    /// built with `init` gets an unattached one; one made by a fetch is given its object).
    /// Once the object is in a context, the instance becomes its typed wrapper and keeps the
    /// context alive (objects refer to their context weakly; typed instances do not).
    public static func _backing(
        _ backing: inout ManagedObject?, context: inout ObjectContext?, entityName: @autoclosure () -> String,
        classIsFinal: Bool, model: AnyObject
    ) -> ManagedObject {
        // The common case — a wrapper made by a fetch, or one already bound — costs two checks.
        if let existing = backing, context != nil { return existing }
        let object = _backing(&backing, context: nil, entityName: entityName())
        // Not inserted yet: the instance's own class names the entity (a subclass's initial
        // values may have made the backing under its superclass's name).
        if !classIsFinal, object.unattached != nil { object.modelTypeName = entityName() }
        if let objectContext = object.context {
            context = objectContext
            if object.typedObject == nil { object.typedObject = model }
        }
        return object
    }

    public static func _backing(
        _ backing: inout ManagedObject?, context: ObjectContext?, entityName: String
    ) -> ManagedObject {
        if let existing = backing { return existing }
        let object = ManagedObject(unattachedEntityName: entityName)
        backing = object
        return object
    }

    /// Used by `@Model`'s property initializers: the value a property starts with.
    public func _setInitialValue(_ value: AttributeValue, forKey key: String) {
        if unattached != nil { unattached![key] = .attribute(value) }
    }
}

// MARK: - Accessors the @Model macro generates calls to

extension PersistentModel {
    public func _attribute<T: AttributeValueConvertible>(_ key: String, as type: T.Type = T.self) -> T {
        let object = managedObject
        do {
            return T(attributeValue: try object.value(forKey: key)) ?? T.placeholder
        } catch {
            object.context?.recordFaultError(error, writing: false)
            return T.placeholder
        }
    }

    public func _setAttribute<T: AttributeValueConvertible>(_ key: String, _ value: T) {
        let object = managedObject
        do { try object.setValue(value.attributeValue, forKey: key) } catch {
            object.context?.recordFaultError(error, writing: true)
        }
    }

    public func _toOne<T: PersistentModel>(_ key: String, as type: T.Type = T.self) -> T? {
        let object = managedObject
        do {
            return try object.object(forKey: key)?.typed(T.self)
        } catch {
            object.context?.recordFaultError(error, writing: false)
            return nil
        }
    }

    public func _setToOne<T: PersistentModel>(_ key: String, _ value: T?) {
        let object = managedObject
        do { try object.setObject(value?.managedObject, forKey: key) } catch {
            object.context?.recordFaultError(error, writing: true)
        }
    }

    public func _toMany<T: PersistentModel>(_ key: String, as type: T.Type = T.self) -> [T] {
        let object = managedObject
        do {
            return try object.objects(forKey: key).map { $0.typed(T.self) }
        } catch {
            object.context?.recordFaultError(error, writing: false)
            return []
        }
    }

    public func _setToMany<T: PersistentModel>(_ key: String, _ value: [T]) {
        let object = managedObject
        do { try object.setObjects(value.map(\.managedObject), forKey: key) } catch {
            object.context?.recordFaultError(error, writing: true)
        }
    }

    /// Models are equal when they are the same instance (one instance per object per context).
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }

    /// The object's ID (temporary until saved).
    public var persistentModelID: ObjectID { managedObject.objectID }
    /// The context the object is in.
    public var modelContext: ObjectContext? { managedObject.context }
    /// Whether the object is deleted (and not saved yet) in its context.
    public var isDeleted: Bool { managedObject.isDeleted }
}

// MARK: - Typed fetches

/// A typed fetch, like SwiftData's `FetchDescriptor`: Foundation's `#Predicate` and
/// `SortDescriptor`, or the ``ObjectPredicate`` builders for what `#Predicate` cannot say.
///
/// ```swift
/// let since = Date.now.addingTimeInterval(-86_400)
/// var recent = FetchDescriptor<Message>(predicate: #Predicate { $0.sentAt > since },
///                                       sortBy: [SortDescriptor(\.sentAt, order: .reverse)])
/// recent.fetchLimit = 20
/// let messages = try context.fetch(recent)
/// ```
public struct FetchDescriptor<T: PersistentModel>: Sendable {
    public var predicate: Predicate<T>?
    /// An additional condition in the store's own terms (ANDed with `predicate`).
    public var condition: ObjectPredicate?
    public var sortBy: [SortDescriptor<T>]
    public var sortKeys: [SortKey] = []
    public var fetchLimit: Int?
    public var fetchOffset: Int?
    public var includesPendingChanges = true
    public var includesPropertyValues = true
    public var includesSubentities = true

    public init(predicate: Predicate<T>? = nil, sortBy: [SortDescriptor<T>] = []) {
        self.predicate = predicate
        self.sortBy = sortBy
    }

    public init(condition: ObjectPredicate?, sortKeys: [SortKey] = []) {
        self.condition = condition
        self.sortBy = []
        self.sortKeys = sortKeys
    }

    /// The untyped request this descriptor stands for.
    public func request() throws -> FetchRequest {
        var parts: [ObjectPredicate] = []
        if let predicate { parts.append(try PredicateTranslator.translate(predicate)) }
        if let condition { parts.append(condition) }
        var request = FetchRequest(
            entityName: T.entityDescription.name,
            predicate: parts.isEmpty ? nil : parts.count == 1 ? parts[0] : .and(parts))
        request.sortKeys =
            try sortBy.map { descriptor in
                guard let keyPath = descriptor.keyPath, let name = T.propertyName(for: keyPath) else {
                    throw ObjectGraphError.unsupportedPredicate(
                        "a sort descriptor of \(T.self) does not name a stored property")
                }
                return SortKey(path: [name], ascending: descriptor.order == .forward)
            } + sortKeys
        request.fetchLimit = fetchLimit
        request.fetchOffset = fetchOffset ?? 0
        request.includesPendingChanges = includesPendingChanges
        request.includesPropertyValues = includesPropertyValues
        request.includesSubentities = includesSubentities
        return request
    }
}

extension ObjectContext {
    /// Inserts a typed object (and the objects it refers to that are not inserted yet).
    public func insert<T: PersistentModel>(_ model: T) {
        do {
            model.managedObject.typedObject = model
            try insertUnattached(model.managedObject)
        } catch {
            recordFaultError(error, writing: true)
        }
    }

    /// Deletes a typed object, applying delete rules (see ``delete(_:)-(ManagedObject)``).
    public func delete<T: PersistentModel>(_ model: T) throws {
        try delete(model.managedObject)
    }

    public func fetch<T: PersistentModel>(_ descriptor: FetchDescriptor<T>) throws -> [T] {
        try fetch(try descriptor.request()).map { $0.typed(T.self) }
    }

    /// The matching objects as a collection that makes each one when first accessed, loading
    /// their values `batchSize` at a time (SwiftData's `fetch(_:batchSize:)`).
    public func fetch<T: PersistentModel>(_ descriptor: FetchDescriptor<T>, batchSize: Int) throws -> FetchResults<T> {
        let results = try fetch(try descriptor.request(), batchSize: batchSize)
        return FetchResults(context: self, ids: results.objectIDs, batch: results.batch) { $0.typed(T.self) }
    }

    public func fetchIdentifiers<T: PersistentModel>(_ descriptor: FetchDescriptor<T>) throws -> [ObjectID] {
        try fetchObjectIDs(try descriptor.request())
    }

    public func fetchCount<T: PersistentModel>(_ descriptor: FetchDescriptor<T>) throws -> Int {
        try count(try descriptor.request())
    }

    public func fetchDictionaries<T: PersistentModel>(
        _ descriptor: FetchDescriptor<T>, properties: [String]
    ) throws -> [[String: AttributeValue]] {
        try fetchDictionaries(try descriptor.request(), properties: properties)
    }

    /// The typed object with this ID (a fault until used).
    public func model<T: PersistentModel>(for id: ObjectID, as type: T.Type = T.self) -> T {
        object(with: id).typed(T.self)
    }
}
