@testable import DataProtectionObjects
import Foundation
import Testing

/// The changed-property sets every object carries: the same answers as `IndexSet`, past the
/// 64 indexes of the bit mask too.
@Suite struct PropertyIndexesTests {
    @Test func itAnswersAsIndexSetDoesOnEitherSideOfTheMask() {
        var ours = PropertyIndexes()
        var reference = IndexSet()
        #expect(ours.isEmpty)
        for index in [0, 5, 63, 64, 65, 130, 5, 2] {
            ours.insert(index)
            reference.insert(index)
        }
        for index in [5, 64, 7] {
            ours.remove(index)
            reference.remove(index)
        }
        #expect(Array(ours) == Array(reference))
        #expect((0..<200).allSatisfy { ours.contains($0) == reference.contains($0) })
        #expect(!ours.isEmpty)
        for index in Array(reference) { ours.remove(index) }
        #expect(ours.isEmpty && Array(ours).isEmpty)
        let literal: PropertyIndexes = [3, 70]
        #expect(Array(literal) == [3, 70])
    }
}
