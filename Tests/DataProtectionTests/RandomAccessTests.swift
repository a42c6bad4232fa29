import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

@Suite struct RandomAccessTests {
    /// Random writes, appends and truncations, checked against a plain in-memory model after
    /// every step and once more after reopening.
    @Test(arguments: [ProtectionClass.complete, .completeUnlessOpen])
    func randomOperationsMatchAPlainModel(cls: ProtectionClass) async throws {
        let device = try await TestDevice.make()
        let url = device.url("random")
        let handle = try await device.files.createFile(at: url, protection: cls)
        var model = [UInt8]()
        var rng = SystemRandomNumberGenerator()
        for step in 0..<120 {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<5:
                let offset = Int.random(in: 0...(model.count + 70_000), using: &rng)
                let chunk = [UInt8](randomData(Int.random(in: 1...140_000, using: &rng)))
                try await handle.write(chunk, at: Int64(offset))
                if offset > model.count { model += [UInt8](repeating: 0, count: offset - model.count) }
                let end = offset + chunk.count
                if end > model.count { model += [UInt8](repeating: 0, count: end - model.count) }
                model.replaceSubrange(offset..<end, with: chunk)
            case 5..<7:
                let chunk = [UInt8](randomData(Int.random(in: 0...70_000, using: &rng)))
                try await handle.append(chunk)
                model += chunk
            case 7:
                let size = Int.random(in: 0...(model.count + 100_000), using: &rng)
                try await handle.truncate(atOffset: Int64(size))
                if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            default:
                let offset = Int.random(in: 0...max(0, model.count), using: &rng)
                let count = Int.random(in: 0...150_000, using: &rng)
                let expected = model[min(offset, model.count)..<min(model.count, offset + count)]
                #expect(try await handle.read(at: Int64(offset), count: count) == Data(expected), "step \(step)")
            }
            #expect(try await handle.size() == Int64(model.count), "step \(step)")
        }
        try await handle.close()
        #expect(try await device.files.contents(of: url) == Data(model))
        #expect(try device.files.plaintextSize(ofItemAt: url) == Int64(model.count))
    }

    @Test func sequentialFileHandleStyleAPI() async throws {
        let device = try await TestDevice.make()
        let url = device.url("seq")
        try await device.files.write(Data("0123456789".utf8), to: url, protection: .noProtection)
        let handle = try await device.files.openHandle(forUpdating: url)
        #expect(try await handle.read(upToCount: 4) == Data("0123".utf8))
        #expect(try await handle.read(upToCount: 4) == Data("4567".utf8))
        #expect(try await handle.read(upToCount: 4) == Data("89".utf8))
        #expect(try await handle.read(upToCount: 4) == nil)
        try await handle.seek(toOffset: 2)
        try await handle.write(contentsOf: Data("ab".utf8))
        #expect(await handle.offset() == 4)
        try await handle.synchronize()
        try await handle.close()
        await #expect(throws: ProtectedFileError.closed(path: url.path)) { _ = try await handle.size() }
        #expect(try await device.files.contents(of: url) == Data("01ab456789".utf8))
        let reader = try await device.files.openHandle(forReadingFrom: url)
        await #expect(throws: ProtectedFileError.self) { try await reader.write(Data("no".utf8), at: 0) }
    }

    @Test func largeFilesStreamInBoundedChunks() async throws {
        let device = try await TestDevice.make()
        let url = device.url("big")
        let handle = try await device.files.createFile(at: url, protection: .noProtection)
        let chunk = randomData(1 << 20)
        for _ in 0..<24 { try await handle.append(chunk) }
        #expect(try await handle.size() == 24 << 20)
        #expect(try await handle.read(at: Int64(17 << 20) + 5, count: 10) == chunk[5..<15])
        try await handle.close()
    }
}

/// The segment size of a new file follows its use (``ProtectedFileAccessPattern``): 4 KiB for
/// files made for random access, 64 KiB for files written whole; both read back the same, and
/// a copy keeps its source's.
@Suite struct AccessPatternTests {
    /// Bytes on disk of a file of `size` plaintext bytes in segments of `segment`.
    static func sealedSize(_ size: Int, segment: Int) -> Int { 160 + size + 28 * max(1, (size + segment - 1) / segment) }
    /// Format 2 (FORMAT.md §3): segment 0 holds 3,908 bytes, every other one 4,068 (one page each).
    static func pageAlignedSize(_ size: Int) -> Int { 160 + size + 28 * (size <= 3_908 ? 1 : 1 + (size - 3_908 + 4_067) / 4_068) }

    @Test func segmentSizeFollowsTheAccessPattern() async throws {
        let device = try await TestDevice.make()
        let data = randomData(100_000)
        let whole = device.url("whole"), random = device.url("random"), created = device.url("created"), streamed = device.url("streamed")
        try await device.files.write(data, to: whole, protection: .complete)
        try await device.files.write(data, to: random, protection: .complete, access: .randomAccess)
        let handle = try await device.files.createFile(at: created, protection: .complete)
        try await handle.write(data, at: 0)
        try await handle.close()
        let streaming = try await device.files.createFile(at: streamed, protection: .complete, access: .sequential)
        try await streaming.write(data, at: 0)
        try await streaming.close()
        func onDisk(_ url: URL) throws -> Int { try Data(contentsOf: url).count }
        #expect(try onDisk(whole) == Self.sealedSize(data.count, segment: 65_536))
        #expect(try onDisk(random) == Self.pageAlignedSize(data.count))
        #expect(try onDisk(created) == Self.pageAlignedSize(data.count))
        #expect(try onDisk(streamed) == Self.sealedSize(data.count, segment: 65_536))
        for url in [whole, random, created, streamed] {
            #expect(try await device.files.contents(of: url) == data)
            let reader = try await device.files.openHandle(forReadingFrom: url)
            #expect(try await reader.read(at: 4090, count: 10) == data[4090..<4100])
            #expect(try await reader.read(at: 65_530, count: 20) == data[65_530..<65_550])
            try await reader.close()
        }
        // A copy is used as its source was: same segment size, new key.
        let copy = device.url("copy")
        try await device.files.copyItem(at: random, to: copy)
        #expect(try onDisk(copy) == Self.pageAlignedSize(data.count))
        #expect(try await device.files.contents(of: copy) == data)
    }

    @Test func aDamaged4KiBSegmentIsCaughtAndNamed() async throws {
        let device = try await TestDevice.make()
        let url = device.url("random")
        try await device.files.write(randomData(20_000), to: url, protection: .noProtection, access: .randomAccess)
        var bytes = [UInt8](try Data(contentsOf: url))
        // Format 2: segment 2 is page 2 (segments 0 and 1 hold 3,908 and 4,068 bytes).
        bytes[2 * 4096 + 50] ^= 0x80
        try Data(bytes).write(to: url)
        let handle = try await device.files.openHandle(forReadingFrom: url)
        #expect(try await handle.read(at: 0, count: 7976).count == 7976, "segments 0 and 1 are intact")
        await #expect { _ = try await handle.read(at: 7976, count: 1) } throws: { error in
            guard case ProtectedFileError.damaged(_, let reason) = error else { return false }
            return reason.contains("segment 2")
        }
        try await handle.close()
    }
}
