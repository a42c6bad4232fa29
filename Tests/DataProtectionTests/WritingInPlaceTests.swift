import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

/// Format 2 (FORMAT.md §3, "Writing in place"): a change cut short the way the kernel cuts a
/// write when its writer is killed — at a page boundary — leaves a file that opens, holding for
/// every byte its old value or its new one, never a torn segment. The cuts are made on copies of
/// the file's bytes: every page boundary of the change, in the order its writes were made.
@Suite struct WritingInPlaceTests {
    static let page = 4096

    /// The file as a write cut at page boundary `cut` leaves it: pages before `cut` as after the
    /// change, the rest as before; the length as far as the write got.
    static func cut(before: [UInt8], after: [UInt8], at cut: Int) -> [UInt8] {
        let boundary = cut * page
        let length = boundary >= after.count ? after.count : max(before.count, min(after.count, boundary))
        return (0..<length).map { i in i < boundary ? after[i] : (i < before.count ? before[i] : after[i]) }
    }

    /// Opens `image` as a file and returns its plaintext (or the error).
    static func read(_ image: [UInt8], on device: TestDevice, name: String) async throws -> Data {
        let url = device.url(name)
        try Data(image).write(to: url)
        return try await device.files.contents(of: url)
    }

    /// Applies `change` to a settled file holding `initial`, then checks every cut of it.
    func checkCuts(initial: [UInt8], _ change: (ProtectedFileHandle) async throws -> Void,
                   expected: [UInt8], device: TestDevice, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let url = device.url("file")
        try? FileManager.default.removeItem(at: url)
        let handle = try await device.files.createFile(at: url, protection: .complete)
        try await handle.write(Data(initial), at: 0)
        try await handle.synchronize()   // settled: its end authenticated
        let before = [UInt8](try Data(contentsOf: url))
        try await change(handle)
        let after = [UInt8](try Data(contentsOf: url))   // not settled yet: the handle is open
        #expect(try await device.files.contents(of: url) == Data(expected), sourceLocation: sourceLocation)
        for cut in 0...((max(before.count, after.count) + Self.page - 1) / Self.page) {
            let image = Self.cut(before: before, after: after, at: cut)
            let content: [UInt8]
            do {
                content = [UInt8](try await Self.read(image, on: device, name: "cut"))
            } catch {
                Issue.record("cut at page \(cut): \(error)", sourceLocation: sourceLocation)
                continue
            }
            #expect(content.count >= min(initial.count, expected.count), "cut at page \(cut): \(content.count) bytes", sourceLocation: sourceLocation)
            let mixed = content.indices.allSatisfy { i in
                (i < initial.count && content[i] == initial[i]) || (i < expected.count && content[i] == expected[i])
            }
            #expect(mixed, "cut at page \(cut): a byte that is neither old nor new", sourceLocation: sourceLocation)
        }
        try await handle.close()
        #expect(try await device.files.contents(of: url) == Data(expected), sourceLocation: sourceLocation)
    }

    @Test func appendsCutShortOpen() async throws {
        let device = try await TestDevice.make()
        let initial = [UInt8](randomData(5_000))
        let tail = [UInt8](randomData(20_000))
        try await checkCuts(initial: initial, { try await $0.write(Data(tail), at: Int64(initial.count)) },
                            expected: initial + tail, device: device)
        // From a full final segment (3,908 bytes: segment 0 exactly), which is resealed first.
        let full = [UInt8](randomData(3_908))
        try await checkCuts(initial: full, { try await $0.write(Data(tail), at: Int64(full.count)) },
                            expected: full + tail, device: device)
    }

    @Test func overwritesCutShortOpen() async throws {
        let device = try await TestDevice.make()
        let initial = [UInt8](randomData(40_000))
        let patch = [UInt8](randomData(17_000))
        var expected = initial
        expected.replaceSubrange(10_000..<27_000, with: patch)
        try await checkCuts(initial: initial, { try await $0.write(Data(patch), at: 10_000) }, expected: expected, device: device)
        // Over the end: part overwrite, part append.
        var longer = initial
        longer.replaceSubrange(35_000..<40_000, with: patch[0..<5_000])
        longer += patch[5_000...]
        try await checkCuts(initial: initial, { try await $0.write(Data(patch), at: 35_000) }, expected: longer, device: device)
    }

    /// A truncation whose new final segment is written but whose cut is not made: it opens at
    /// its new length (header bit 2).
    @Test func aTruncationCutShortOpensAtItsNewLength() async throws {
        let device = try await TestDevice.make()
        let initial = [UInt8](randomData(30_000))
        let url = device.url("file")
        let handle = try await device.files.createFile(at: url, protection: .complete)
        try await handle.write(Data(initial), at: 0)
        try await handle.synchronize()
        let before = [UInt8](try Data(contentsOf: url))
        try await handle.truncate(atOffset: 10_000)
        let after = [UInt8](try Data(contentsOf: url))
        #expect(after.count < before.count)
        // Every write made, the cut not: the new bytes over the old file, at its old length.
        let uncut = after + before[after.count...]
        #expect(try await Self.read(uncut, on: device, name: "uncut") == Data(initial[0..<10_000]))
        // Only the header written (bits 1 and 2): the old file.
        let headerOnly = after[0..<160] + before[160...]
        #expect(try await Self.read(Array(headerOnly), on: device, name: "header-only") == Data(initial))
        try await handle.close()
    }

    /// Once settled (fsync, close), a file's end is authenticated again: cut at a segment
    /// boundary, it is reported damaged — while being written, the same cut opens.
    @Test func aSettledFileDetectsTruncationAtASegmentBoundary() async throws {
        let device = try await TestDevice.make()
        let url = device.url("file")
        let handle = try await device.files.createFile(at: url, protection: .complete)
        try await handle.write(Data(randomData(20_000)), at: 0)
        let beingWritten = [UInt8](try Data(contentsOf: url))
        #expect(Array(beingWritten[8..<10]) == [0, 2], "format 2")
        #expect(beingWritten[14] & 2 != 0, "marked as being written")
        // Page 2 and after cut off: segments 0 and 1 remain, whole.
        #expect(try await Self.read(Array(beingWritten[0..<(2 * Self.page)]), on: device, name: "open-cut").count == 3_908 + 4_068)
        try await handle.close()
        let settled = [UInt8](try Data(contentsOf: url))
        #expect(settled[14] & 6 == 0, "settled at close")
        await #expect(throws: ProtectedFileError.self) {
            _ = try await Self.read(Array(settled[0..<(2 * Self.page)]), on: device, name: "settled-cut")
        }
        // The layout: segment 1 is page 1 — a flipped byte at 4096 fails segment 1.
        var flipped = settled
        flipped[Self.page] ^= 1
        await #expect(throws: ProtectedFileError.self) { _ = try await Self.read(flipped, on: device, name: "flipped") }
        #expect(settled.count == 4 * Self.page + (20_000 - 3_908 - 3 * 4_068) + 28)
    }
}
