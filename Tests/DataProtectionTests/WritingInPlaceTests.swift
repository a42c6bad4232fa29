import Crypto
@testable import DataProtection
@testable import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import SystemPackage
import Testing

/// Format 2 (FORMAT.md §3, "Writing in place"): a change cut short the way the kernel cuts a
/// write when its writer is killed — at a page boundary — leaves a file that opens, holding for
/// every byte its old value or its new one, never a torn segment. The cuts are made on copies of
/// the file's bytes: every page boundary of the change (its writes go in increasing page order),
/// and each step of a truncation.
@Suite struct WritingInPlaceTests {
    static let page = 4096

    /// A format-2 file key and header, without a keybag (the file's own keys are all that count).
    struct Fixture {
        let directory = temporaryDirectory()
        let keys: FileKeys
        let header: ProtectedFileHeader

        init() {
            let fileID = [UInt8](randomData(16))
            keys = FileKeys(fileKey: SymmetricKey(size: .bits256), fileID: fileID)
            header = ProtectedFileHeader(version: ProtectedFileHeader.pageAlignedVersion, segmentSizeLog2: 12, fileID: fileID,
                                         wrappedKey: WrappedFileKey(protectionClass: .complete, keybagID: UUID(), wrappedKey: [UInt8](repeating: 7, count: 40),
                                                                    ephemeralPublicKey: nil))
        }

        func path(_ name: String) -> String { directory.appendingPathComponent(name).path }

        /// A new file holding `initial`, settled (its end authenticated), open for writing.
        func file(_ name: String, holding initial: [UInt8]) throws -> SegmentedFile {
            let fd = try POSIXFile.open(path(name), .readWrite, options: [.create, .truncate], permissions: FilePermissions(rawValue: 0o600))
            let file = try SegmentedFile.create(fd: fd, path: path(name), header: header, keys: keys)
            file.threads = 1
            try initial.withUnsafeBytes { try file.write($0, at: 0) }
            try file.settle()
            return file
        }

        /// The plaintext of `image`, opened as a reader would.
        func read(_ image: [UInt8]) throws -> [UInt8] {
            let name = path("image")
            try Data(image).write(to: URL(fileURLWithPath: name))
            let fd = try POSIXFile.open(name, .readOnly)
            defer { try? fd.close() }
            let headerBytes = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: name)
            let file = try SegmentedFile.open(fd: fd, path: name, headerBytes: headerBytes,
                                              header: try ProtectedFileHeader.parse(headerBytes, path: name), keys: keys)
            return [UInt8](try file.read(at: 0, count: Int(file.size)))
        }

        func bytes(_ name: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path(name)))) }
    }

    /// The file as a write cut at page boundary `cut` leaves it: pages before `cut` as after the
    /// change, the rest as before; the length as far as the write got.
    static func cut(before: [UInt8], after: [UInt8], at cut: Int) -> [UInt8] {
        let boundary = cut * page
        let length = boundary >= after.count ? after.count : max(before.count, min(after.count, boundary))
        return (0..<length).map { i in i < boundary ? after[i] : (i < before.count ? before[i] : after[i]) }
    }

    /// Applies `change` to a settled file holding `initial`, then checks every cut of it.
    func checkCuts(initial: [UInt8], expected: [UInt8], cuts: ((Int) -> [Int])? = nil,
                   sourceLocation: SourceLocation = #_sourceLocation, _ change: (SegmentedFile) throws -> Void) throws {
        let fixture = Fixture()
        let file = try fixture.file("file", holding: initial)
        let before = try fixture.bytes("file")
        try change(file)
        let after = try fixture.bytes("file")   // not settled yet
        #expect(try fixture.read(after) == expected, sourceLocation: sourceLocation)
        let pages = (max(before.count, after.count) + Self.page - 1) / Self.page
        for cut in cuts?(pages) ?? Array(0...pages) {
            let content: [UInt8]
            do {
                content = try fixture.read(Self.cut(before: before, after: after, at: cut))
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
        try file.settle()
        #expect(try fixture.read(try fixture.bytes("file")) == expected, sourceLocation: sourceLocation)
    }

    @Test func appendsCutShortOpen() throws {
        let initial = [UInt8](randomData(5_000))
        let tail = [UInt8](randomData(20_000))
        try checkCuts(initial: initial, expected: initial + tail) { file in
            try tail.withUnsafeBytes { try file.write($0, at: Int64(initial.count)) }
        }
        // From a full final segment (3,908 bytes: segment 0 exactly), which is resealed first.
        let full = [UInt8](randomData(3_908))
        try checkCuts(initial: full, expected: full + tail) { file in
            try tail.withUnsafeBytes { try file.write($0, at: Int64(full.count)) }
        }
    }

    /// Writes of several windows (1 MiB each, sealed and written one after another), and a
    /// write past the end (zeros sealed first): cut at page boundaries around every window edge.
    @Test func longWritesAndWritesPastTheEndCutShortOpen() throws {
        let initial = [UInt8](randomData(6_000))
        let long = [UInt8](randomData(2_600_000))
        let windowPages = (1 << 20) / 4_068
        try checkCuts(initial: initial, expected: initial + long, cuts: { pages in
            Array(Set((0..<4).flatMap { w in (-2...2).map { w * windowPages + $0 } } + Array(stride(from: 0, through: pages, by: 97)) + [pages])
                .filter { (0...pages).contains($0) }).sorted()
        }) { file in
            try long.withUnsafeBytes { try file.write($0, at: Int64(initial.count)) }
        }
        let past = [UInt8](randomData(300))
        try checkCuts(initial: initial, expected: initial + [UInt8](repeating: 0, count: 20_000 - initial.count) + past) { file in
            try past.withUnsafeBytes { try file.write($0, at: 20_000) }
        }
    }

    @Test func overwritesCutShortOpen() throws {
        let initial = [UInt8](randomData(40_000))
        let patch = [UInt8](randomData(17_000))
        var expected = initial
        expected.replaceSubrange(10_000..<27_000, with: patch)
        try checkCuts(initial: initial, expected: expected) { file in
            try patch.withUnsafeBytes { try file.write($0, at: 10_000) }
        }
        // Over the end: part overwrite, part append.
        var longer = initial
        longer.replaceSubrange(35_000..<40_000, with: patch[0..<5_000])
        longer += patch[5_000...]
        try checkCuts(initial: initial, expected: longer) { file in
            try patch.withUnsafeBytes { try file.write($0, at: 35_000) }
        }
    }

    /// Each step of a truncation (FORMAT.md §3: the target in the header, the new final
    /// segment, the cut, the mark cleared), cut short after each: the old file or the new one.
    @Test(arguments: [0, 100, 3_908, 5_000, 7_976, 10_000, 29_999])
    func aTruncationCutShortOpensAtItsOldOrNewLength(target: Int) throws {
        let fixture = Fixture()
        let initial = [UInt8](randomData(30_000))
        let file = try fixture.file("file", holding: initial)
        let before = try fixture.bytes("file")
        try file.truncate(to: Int64(target))
        let after = try fixture.bytes("file")
        #expect(after.count < before.count)
        #expect(after[14] & 6 == 2, "being written; the truncation mark gone once the cut is made")
        #expect(try fixture.read(after) == Array(initial[0..<target]))
        // The header as it was during the truncation: bits 1 and 2, the target length.
        var marking = fixture.header
        marking.beingWritten = true
        marking.truncatingTo = Int64(target)
        let marked = marking.encoded(keys: fixture.keys)
        // Only the header written: the old file.
        #expect(try fixture.read(marked + before[160...]) == initial)
        // The new final segment written, the cut not: the new bytes over the old file, at its old length.
        #expect(try fixture.read(marked + after[160...] + before[after.count...]) == Array(initial[0..<target]))
        // The cut made, the mark not yet cleared.
        #expect(try fixture.read(marked + after[160...]) == Array(initial[0..<target]))
        try file.settle()
        #expect(try fixture.bytes("file")[14] & 6 == 0)
    }

    /// Once settled (fsync, close), a file's end is authenticated again: cut at a segment
    /// boundary, it is reported damaged — while being written, the same cut opens.
    @Test func aSettledFileDetectsTruncationAtASegmentBoundary() throws {
        let fixture = Fixture()
        let file = try fixture.file("file", holding: [])
        let data = [UInt8](randomData(20_000))
        try data.withUnsafeBytes { try file.write($0, at: 0) }
        let beingWritten = try fixture.bytes("file")
        #expect(Array(beingWritten[8..<10]) == [0, 2], "format 2")
        #expect(beingWritten[14] & 2 != 0, "marked as being written")
        // Page 2 and after cut off: segments 0 and 1 remain, whole.
        #expect(try fixture.read(Array(beingWritten[0..<(2 * Self.page)])) == Array(data[0..<(3_908 + 4_068)]))
        // A short segment sealed non-final is never one the writer leaves: refused.
        #expect(throws: ProtectedFileError.self) { _ = try fixture.read(Array(beingWritten[0..<(2 * Self.page - 100)])) }
        try file.settle()
        let settled = try fixture.bytes("file")
        #expect(settled[14] & 6 == 0, "settled")
        #expect(throws: ProtectedFileError.self) { _ = try fixture.read(Array(settled[0..<(2 * Self.page)])) }
        // The layout: segment 1 is page 1 — a flipped byte at 4096 fails segment 1.
        var flipped = settled
        flipped[Self.page] ^= 1
        #expect(throws: ProtectedFileError.self) { _ = try fixture.read(flipped) }
        #expect(settled.count == 4 * Self.page + (20_000 - 3_908 - 3 * 4_068) + 28)
    }

    /// A file whose end no longer authenticates (a failed write, a foreign change) is never
    /// settled: its mark stays, and settling says why.
    @Test func aFileThatStaysInItsFirstPageIsNeverMarked() throws {
        let fixture = Fixture()
        let file = try fixture.file("file", holding: [])
        let small = [UInt8](randomData(3_908))
        try small.withUnsafeBytes { try file.write($0, at: 0) }
        #expect(try fixture.bytes("file")[14] & 2 == 0, "a change inside page 0 needs no mark")
        #expect(try fixture.bytes("file").count == Self.page)
        try [UInt8](randomData(1)).withUnsafeBytes { try file.write($0, at: 3_908) }
        #expect(try fixture.bytes("file")[14] & 2 != 0, "a change past page 0 is marked first")
        try file.settle()
        #expect(try fixture.bytes("file")[14] & 2 == 0)
        #expect(try fixture.read(try fixture.bytes("file")).count == 3_909)
    }

    @Test func aFileWhoseEndDoesNotAuthenticateIsNotSettled() throws {
        let fixture = Fixture()
        let file = try fixture.file("file", holding: [UInt8](randomData(10_000)))
        try [UInt8](randomData(100)).withUnsafeBytes { try file.write($0, at: 10_000) }
        // Another writer flips a byte of the last segment behind the engine's back.
        let fd = try POSIXFile.open(fixture.path("file"), .readWrite)
        defer { try? fd.close() }
        let size = try POSIXFile.size(fd, path: "file")
        var byte = try POSIXFile.read(fd, count: 1, at: size - 1, path: "file")
        byte[0] ^= 1
        try POSIXFile.write(fd, byte, at: size - 1, path: "file")
        #expect(throws: ProtectedFileError.self) { try file.settle() }
        #expect(try fixture.bytes("file")[14] & 2 != 0, "still marked as being written")
    }
}
