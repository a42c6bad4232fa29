import Foundation
import Synchronization

/// The objects a context holds, one per ID: saved or fetched objects by their permanent ID, and
/// inserted objects in insertion order, each in a slot its temporary ID names.
///
/// A temporary ID's key is `-(context serial << 32 | slot number)`, so finding an inserted
/// object, or the permanent ID it was given, is an array index rather than a hash: a save of
/// many new objects hashes each one once (into the table of permanent IDs), and the references
/// between new objects are rewritten without a lookup table. Slot numbers are never reused
/// within a context, so a temporary ID names one object for the life of the process.
struct RegisteredObjects {
    /// Objects by permanent ID (and, rarely, a fault made for a temporary ID this context did
    /// not issue).
    private(set) var byID: [ObjectID: ManagedObject] = [:]
    /// Inserted objects, in insertion order; `nil` where one was deleted before it was saved.
    private(set) var slots: [ManagedObject?] = []
    /// How many slots hold an object.
    private(set) var insertedCount = 0
    /// Inserted objects deleted before they were saved, until the save or rollback: out of the
    /// context, but their IDs still lead to them (so that references to them are seen as
    /// references to deleted objects).
    private var discarded: [ObjectID: ManagedObject] = [:]
    private var serial: Int64
    /// The slot number of `slots[0]`.
    private var firstSlot: Int64 = 0

    private static let slotBits: Int64 = 32
    private static let slotMask: Int64 = (1 << slotBits) - 1
    private static let serials = Atomic<Int64>(0)

    init() { serial = Self.newSerial() }

    private static func newSerial() -> Int64 {
        // 1 ... 2^31 - 1: `serial << 32 | slot` stays positive, whatever the count of contexts.
        (serials.add(1, ordering: .relaxed).newValue - 1) % ((1 << 31) - 1) + 1
    }

    // MARK: Lookup

    /// The object registered under this ID, if any.
    subscript(id: ObjectID) -> ManagedObject? {
        if id.isTemporaryID, let object = inserted(temporary: id), object.objectID == id { return object }
        if let object = byID.isEmpty ? nil : byID[id] { return object }
        return discarded.isEmpty ? nil : discarded[id]
    }

    /// The inserted object a temporary ID of this context was issued for (whatever its ID is now).
    func inserted(temporary id: ObjectID) -> ManagedObject? {
        let key = -id.primaryKey
        guard key > 0, key >> Self.slotBits == serial else { return nil }
        let index = (key & Self.slotMask) - firstSlot
        guard index >= 0, index < Int64(slots.count), let object = slots[Int(index)],
            object.entity?.root == id.entity.root
        else { return nil }
        return object
    }

    /// The inserted objects not yet saved, in insertion order.
    var insertedObjects: some Sequence<ManagedObject> { slots.lazy.compactMap { $0 } }

    /// Calls `body` with every registered object, each once.
    func forEach(_ body: (ManagedObject) throws -> Void) rethrows {
        for object in byID.values { try body(object) }
        for case let object? in slots where object.objectID.isTemporaryID { try body(object) }
    }

    // MARK: Changes

    /// Registers an object under a permanent ID (or a foreign temporary one).
    mutating func register(_ object: ManagedObject, as id: ObjectID) { byID[id] = object }

    mutating func reserveCapacity(_ extra: Int) { byID.reserveCapacity(byID.count + extra) }

    /// Removes the object registered under a permanent ID (an inserted object keeps its slot
    /// until ``removeInserted(_:)``).
    @discardableResult
    mutating func remove(_ id: ObjectID) -> ManagedObject? { byID.removeValue(forKey: id) }

    /// A new temporary ID for an object being inserted, and its slot.
    mutating func insert(_ object: ManagedObject, entity: Entity) -> ObjectID {
        // Slot numbers stay below 2^32: a context renews its serial past 2^31 when its inserted
        // objects are saved or rolled back, and 2^31 unsaved objects cannot fit in memory.
        let id = ObjectID(entity: entity, primaryKey: -(serial << Self.slotBits | (firstSlot + Int64(slots.count))))
        object.insertionSlot = slots.count
        slots.append(object)
        insertedCount += 1
        return id
    }

    /// An inserted object slot, for its own object only.
    func isInserted(_ object: ManagedObject) -> Bool {
        guard let slot = object.insertionSlot else { return false }
        return slot < slots.count && slots[slot] === object
    }

    /// Takes an inserted object deleted before it was saved out of the context; its ID still
    /// leads to it until the save or rollback.
    mutating func discard(_ object: ManagedObject) {
        removeInserted(object)
        if byID[object.objectID] === object { byID[object.objectID] = nil }
        discarded[object.objectID] = object
    }

    /// Takes an inserted object out of the inserted ones.
    mutating func removeInserted(_ object: ManagedObject) {
        guard let slot = object.insertionSlot, slot < slots.count, slots[slot] === object else { return }
        slots[slot] = nil
        object.insertionSlot = nil
        insertedCount -= 1
    }

    /// Forgets the inserted objects as such (saved, or rolled back): their slots are not reused.
    mutating func clearInserted() {
        for object in insertedObjects { object.insertionSlot = nil }
        firstSlot += Int64(slots.count)
        slots = []
        insertedCount = 0
        discarded = [:]
        if firstSlot > Self.slotMask / 2 {
            serial = Self.newSerial()
            firstSlot = 0
        }
    }

    mutating func removeAll() {
        clearInserted()
        byID = [:]
    }
}
