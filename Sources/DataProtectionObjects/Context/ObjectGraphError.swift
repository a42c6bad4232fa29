import Foundation

/// Errors of the object graph. Each says what went wrong and what to do.
public enum ObjectGraphError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The model is inconsistent (an unknown destination, a missing inverse …).
    case invalidModel(String)
    /// No entity of that name in the model.
    case unknownEntity(String)
    /// No attribute or relationship of that name in the entity.
    case unknownProperty(entity: String, property: String)
    /// A value does not fit the attribute's type.
    case typeMismatch(entity: String, property: String, expected: String)
    /// A required attribute or to-one relationship has no value (at save).
    case missingValue(object: String, property: String)
    /// The delete rule `deny` refuses to delete an object whose relationship still has destinations.
    case deleteDenied(object: String, relationship: String)
    /// Another context (or process) saved or deleted the object since this context read it.
    case conflict(objects: [String])
    /// The object was deleted from the store.
    case objectDeleted(String)
    /// The object belongs to no context, or to another one.
    case wrongContext(String)
    /// A predicate or sort cannot be expressed for this store.
    case unsupportedPredicate(String)
    /// The store was written with a model this one cannot migrate to without losing data.
    case incompatibleModel(store: String, reason: String)
    /// The store's metadata is missing or damaged.
    case damagedStore(store: String, detail: String)

    public var description: String {
        switch self {
        case .invalidModel(let why): "invalid model: \(why)"
        case .unknownEntity(let name): "no entity named \(name) in the model"
        case .unknownProperty(let entity, let property): "\(entity) has no property \(property)"
        case .typeMismatch(let entity, let property, let expected): "\(entity).\(property) takes \(expected)"
        case .missingValue(let object, let property):
            "\(object): \(property) is required but has no value; set it before saving"
        case .deleteDenied(let object, let relationship):
            "\(object) cannot be deleted while \(relationship) is not empty (delete rule deny); empty it first"
        case .conflict(let objects):
            "save conflict: \(objects.joined(separator: ", ")) changed in the store since this context read them; choose a merge policy or refresh"
        case .objectDeleted(let object): "\(object) was deleted from the store"
        case .wrongContext(let object): "\(object) belongs to another context"
        case .unsupportedPredicate(let why): "unsupported predicate: \(why)"
        case .incompatibleModel(let store, let reason):
            "\(store): the model changed in a way that cannot be migrated automatically (\(reason)); nothing was changed"
        case .damagedStore(let store, let detail): "\(store): object store damaged: \(detail)"
        }
    }

    public var errorDescription: String? { description }
}
