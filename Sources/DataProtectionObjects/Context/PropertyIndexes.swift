/// A set of property indexes of one entity (its attributes, or its to-one relationships): a bit
/// mask for the first 64, a set past them. Every object has two; `IndexSet` would allocate them
/// on the heap (on Linux it is backed by a class), twice per object and again at each save.
struct PropertyIndexes: Sequence, ExpressibleByArrayLiteral {
    private var mask: UInt64 = 0
    private var beyondMask: Set<Int> = []

    init() {}

    init(arrayLiteral indexes: Int...) {
        for index in indexes { insert(index) }
    }

    var isEmpty: Bool { mask == 0 && beyondMask.isEmpty }

    func contains(_ index: Int) -> Bool {
        index < 64 ? mask & (1 << UInt64(index)) != 0 : beyondMask.contains(index)
    }

    mutating func insert(_ index: Int) {
        precondition(index >= 0, "a property index is never negative")
        if index < 64 { mask |= 1 << UInt64(index) } else { beyondMask.insert(index) }
    }

    mutating func remove(_ index: Int) {
        if index < 64 { mask &= ~(1 << UInt64(index)) } else { beyondMask.remove(index) }
    }

    /// The indexes in ascending order.
    func makeIterator() -> IndexingIterator<[Int]> {
        var indexes: [Int] = []
        var rest = mask
        while rest != 0 {
            indexes.append(rest.trailingZeroBitCount)
            rest &= rest - 1
        }
        return (indexes + beyondMask.sorted()).makeIterator()
    }
}
