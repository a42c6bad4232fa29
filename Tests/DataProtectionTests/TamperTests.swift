import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

/// Every way of changing a protected file's bytes is an error, never wrong plaintext.
@Suite struct TamperTests {
    static let segment = 65_536 + 28
    static let header = 160

    /// A device with one class-C file of three and a half segments.
    func fixture() async throws -> (TestDevice, URL, Data, [UInt8]) {
        let device = try await TestDevice.make()
        let url = device.url("victim")
        let data = randomData(3 * 65_536 + 1000)
        try await device.files.write(data, to: url, protection: .completeUntilFirstUserAuthentication)
        return (device, url, data, [UInt8](try Data(contentsOf: url)))
    }

    func expectRejected(_ device: TestDevice, _ url: URL, _ bytes: [UInt8], _ what: String) async throws {
        try Data(bytes).write(to: url)
        do {
            let read = try await device.files.contents(of: url)
            Issue.record("\(what): read \(read.count) bytes instead of failing")
        } catch {
            #expect(isDamaged(error) || error is ProtectedFileError, "\(what): \(error)")
            if case ProtectedFileError.unavailable = error { Issue.record("\(what): reported as unavailable") }
        }
    }

    @Test func flippedBitsAnywhereAreDetected() async throws {
        let (device, url, _, original) = try await fixture()
        // Every byte of the header except the reserved padding, and a sample of every segment.
        var positions = Array(0..<Self.header)
        positions += stride(from: Self.header, to: original.count, by: 997)
        positions += [Self.header, Self.header + 11, Self.header + 12, Self.header + Self.segment - 1, original.count - 1]
        for position in positions {
            var bytes = original
            bytes[position] ^= 0x04
            try await expectRejected(device, url, bytes, "bit flip at \(position)")
        }
    }

    @Test func truncationIsDetected() async throws {
        let (device, url, _, original) = try await fixture()
        // Cut to nothing, the file is an empty file: no format can tell (documented in FORMAT.md).
        try Data().write(to: url)
        #expect(try device.files.protection(ofItemAt: url) == .plain)
        for cut in [4, 8, 100, Self.header, Self.header + 10, Self.header + Self.segment,
                    Self.header + 2 * Self.segment, Self.header + 3 * Self.segment, original.count - 1] {
            try await expectRejected(device, url, Array(original.prefix(cut)), "truncated to \(cut)")
        }
    }

    /// A text-mode transfer turns `\r\n` into `\n` (or `\n` into `\r\n`), shifting the rest of
    /// the magic; a 7-bit one strips the high bit. Each is a damaged protected file, never plain.
    @Test func textModeManglingAndShortTruncationAreDamagedNotPlain() async throws {
        let (device, url, _, original) = try await fixture()
        func lfOnly(_ bytes: [UInt8]) -> [UInt8] {
            var out: [UInt8] = []
            for (i, byte) in bytes.enumerated() where !(byte == 0x0D && i + 1 < bytes.count && bytes[i + 1] == 0x0A) { out.append(byte) }
            return out
        }
        func crlf(_ bytes: [UInt8]) -> [UInt8] { bytes.flatMap { $0 == 0x0A ? [0x0D, 0x0A] : [$0] } }
        let sevenBit = original.map { $0 & 0x7F }
        for (what, bytes) in [("\\r\\n turned into \\n", lfOnly(original)), ("\\n turned into \\r\\n", crlf(original)),
                              ("high bit stripped", sevenBit), ("first 4 bytes only", Array(original.prefix(4))),
                              ("first 3 bytes only", Array(original.prefix(3))), ("first 2 bytes only", Array(original.prefix(2))),
                              ("magic with \\r\\n → \\n, cut at 6", Array(lfOnly(original).prefix(6)))] {
            try Data(bytes).write(to: url)
            #expect(throws: ProtectedFileError.self, "\(what): must be reported as damaged") {
                _ = try device.files.protection(ofItemAt: url)
            }
            try await expectRejected(device, url, bytes, what)
        }
        // A plain file that merely starts with the same first byte stays plain.
        try Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]).write(to: url)   // a PNG's magic
        #expect(try device.files.protection(ofItemAt: url) == .plain)
        try Data([0x89]).write(to: url)
        #expect(try device.files.protection(ofItemAt: url) == .plain)
    }

    @Test func extensionIsDetected() async throws {
        let (device, url, _, original) = try await fixture()
        try await expectRejected(device, url, original + [0], "one byte appended")
        try await expectRejected(device, url, original + [UInt8](repeating: 0, count: 28), "empty segment appended")
        let lastSegment = Array(original[(Self.header + 3 * Self.segment)...])
        try await expectRejected(device, url, original + lastSegment, "final segment duplicated")
        let firstSegment = Array(original[Self.header..<(Self.header + Self.segment)])
        try await expectRejected(device, url, original + firstSegment, "first segment appended")
    }

    @Test func reorderedSegmentsAreDetected() async throws {
        let (device, url, _, original) = try await fixture()
        var bytes = original
        let a = Self.header..<(Self.header + Self.segment)
        let b = (Self.header + Self.segment)..<(Self.header + 2 * Self.segment)
        bytes.replaceSubrange(a, with: original[b])
        bytes.replaceSubrange(b, with: original[a])
        try await expectRejected(device, url, bytes, "segments 0 and 1 swapped")
    }

    @Test func segmentsSwappedBetweenFilesAreDetected() async throws {
        let (device, url, _, original) = try await fixture()
        let other = device.url("other")
        try await device.files.write(randomData(3 * 65_536 + 1000), to: other, protection: .completeUntilFirstUserAuthentication)
        let otherBytes = [UInt8](try Data(contentsOf: other))
        var bytes = original
        let second = (Self.header + Self.segment)..<(Self.header + 2 * Self.segment)
        bytes.replaceSubrange(second, with: otherBytes[second])
        try await expectRejected(device, url, bytes, "segment 1 from another file")
        // Another file's header on our segments.
        var headerSwap = original
        headerSwap.replaceSubrange(0..<Self.header, with: otherBytes[0..<Self.header])
        try await expectRejected(device, url, headerSwap, "header of another file")
    }

    @Test func aTamperedFileStillReportsErrorsThroughHandlesAndRandomReads() async throws {
        let (device, url, data, original) = try await fixture()
        var bytes = original
        bytes[Self.header + Self.segment + 500] ^= 0xff   // inside segment 1
        try Data(bytes).write(to: url)
        let handle = try await device.files.openHandle(forReadingFrom: url)
        // Segment 0 is intact and readable; segment 1 is not.
        #expect(try await handle.read(at: 0, count: 1000) == data.prefix(1000))
        await #expect { _ = try await handle.read(at: 65_536, count: 10) } throws: { isDamaged($0) }
    }

    @Test func garbageAndForeignFilesAreNeverMisparsed() async throws {
        let (device, url, _, _) = try await fixture()
        // Looks like our magic, then garbage.
        try await expectRejected(device, url, [0x89, 0x44, 0x50, 0x46, 0x0D, 0x0A, 0x1A, 0x0A] + (0..<500).map { _ in UInt8.random(in: 0...255) }, "magic + garbage")
        // Future version.
        var future = [UInt8](try Data(contentsOf: device.url("victim")).prefix(0))
        future = [0x89, 0x44, 0x50, 0x46, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x03, 0x00, 0xA0] + [UInt8](repeating: 0, count: 300)
        try Data(future).write(to: url)
        await #expect(throws: ProtectedFileError.unsupportedVersion(path: url.path, version: 3)) { _ = try await device.files.contents(of: url) }
    }
}
