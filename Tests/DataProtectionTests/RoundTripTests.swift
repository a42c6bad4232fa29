import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

@Suite struct RoundTripTests {
    @Test(arguments: ProtectionClass.allCases)
    func writeThenReadEveryClass(cls: ProtectionClass) async throws {
        let device = try await TestDevice.make()
        for size in [0, 1, 100, 65_535, 65_536, 65_537, 200_000] {
            let url = device.url("f-\(size)")
            let data = randomData(size)
            try await device.files.write(data, to: url, protection: cls)
            #expect(try device.files.protection(ofItemAt: url) == .protected(cls))
            #expect(try await device.files.contents(of: url) == data)
            #expect(try device.files.plaintextSize(ofItemAt: url) == Int64(size))
            let raw = try Data(contentsOf: url)
            #expect(raw.count == 160 + size + 28 * max(1, (size + 65_535) / 65_536))
            if size >= 16 { #expect(raw.range(of: data.prefix(16)) == nil, "plaintext must not appear on disk") }
        }
    }

    @Test func foundationShapedWritingOptionsAndAttributes() async throws {
        let device = try await TestDevice.make()
        let url = device.url("note.txt")
        try await Data("hello".utf8).write(to: url, options: [.atomic, .completeFileProtection], using: device.files)
        let attributes = try device.files.attributesOfItem(atPath: url.path)
        #expect((attributes[.protectionKey] as? FileProtectionType)?.rawValue == FileProtectionType.complete.rawValue)
        #expect((attributes[.size] as? NSNumber)?.intValue == 5)
        try await device.files.setAttributes([.protectionKey: FileProtectionType.completeUntilFirstUserAuthentication], ofItemAtPath: url.path)
        #expect(try device.files.protection(ofItemAt: url) == .protected(.completeUntilFirstUserAuthentication))
        #expect(try await Data(contentsOfProtectedFile: url, using: device.files) == Data("hello".utf8))
        try await device.files.write(Data("x".utf8), to: device.url("none"), options: .noFileProtection)
        #expect(try device.files.protection(ofItemAt: device.url("none")) == .protected(.noProtection))
        await #expect(throws: ProtectedFileError.self) {
            try await device.files.write(Data(), to: url, options: .withoutOverwriting)
        }
    }

    @Test func classChangeRewrapsWithoutReencrypting() async throws {
        let device = try await TestDevice.make()
        let url = device.url("doc")
        let data = randomData(300_000)
        try await device.files.write(data, to: url, protection: .noProtection)
        let before = try Data(contentsOf: url)
        for cls in [ProtectionClass.complete, .completeUnlessOpen, .completeUntilFirstUserAuthentication, .noProtection] {
            try await device.files.setProtection(cls, ofItemAt: url)
            let after = try Data(contentsOf: url)
            #expect(after.count == before.count)
            #expect(after[160...] == before[160...], "segments untouched")
            #expect(try await device.files.contents(of: url) == data)
        }
    }

    @Test func plainFilesAreReportedUnprotectedAndConvertedInPlace() async throws {
        let device = try await TestDevice.make()
        let url = device.url("plain.txt")
        let text = Data("just text, not protected\n".utf8)
        try text.write(to: url)
        #expect(try device.files.protection(ofItemAt: url) == .plain)
        #expect(try await device.files.contents(of: url) == text)
        await #expect(throws: ProtectedFileError.notProtected(path: url.path)) { _ = try await device.files.openHandle(forReadingFrom: url) }
        try await device.files.setProtection(.complete, ofItemAt: url)
        #expect(try device.files.protection(ofItemAt: url) == .protected(.complete))
        #expect(try await device.files.contents(of: url) == text)
        #expect(try Data(contentsOf: url).range(of: Data("not protected".utf8)) == nil)
        // Binary plain files that merely resemble nothing of ours stay plain.
        let png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0])
        try png.write(to: device.url("image.png"))
        #expect(try device.files.protection(ofItemAt: device.url("image.png")) == .plain)
    }

    @Test func missingPathsAndDirectoriesGiveClearErrors() async throws {
        let device = try await TestDevice.make()
        let missing = device.url("nope")
        await #expect(throws: ProtectedFileError.noSuchFile(path: missing.path)) { _ = try await device.files.contents(of: missing) }
        #expect(throws: ProtectedFileError.noSuchFile(path: missing.path)) { _ = try device.files.protection(ofItemAt: missing) }
        await #expect(throws: ProtectedFileError.isDirectory(path: device.dir.path)) {
            try await device.files.write(Data(), to: device.dir, protection: .noProtection)
        }
        let inMissingDir = device.url("no-such-dir/file")
        await #expect(throws: ProtectedFileError.self) { try await device.files.write(Data(), to: inMissingDir, protection: .noProtection) }
    }
}
