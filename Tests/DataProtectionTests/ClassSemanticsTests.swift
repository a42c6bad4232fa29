import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// Every class in every lock state, exactly as iOS behaves.
@Suite struct ClassSemanticsTests {
    /// Writes one file per class while unlocked, then restarts the device.
    func deviceWithOneFilePerClass() async throws -> (TestDevice, [ProtectionClass: URL]) {
        let device = try await TestDevice.make()
        var urls: [ProtectionClass: URL] = [:]
        for cls in ProtectionClass.allCases {
            urls[cls] = device.url(cls.shortName)
            try await device.files.write(Data(cls.shortName.utf8), to: urls[cls]!, protection: cls)
        }
        return (try await device.restarted(), urls)
    }

    func canRead(_ device: TestDevice, _ url: URL) async -> Bool {
        do { _ = try await device.files.contents(of: url); return true } catch {
            #expect(isUnavailable(error, writing: false), "unexpected \(error)")
            return false
        }
    }

    func canCreate(_ device: TestDevice, _ cls: ProtectionClass) async -> Bool {
        do { try await device.files.write(Data("new".utf8), to: device.url("new-\(UUID())"), protection: cls); return true } catch {
            #expect(isUnavailable(error, writing: true), "unexpected \(error)")
            return false
        }
    }

    @Test func beforeFirstUnlockOnlyDReadsAndBAndDCreate() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        #expect(await !canRead(device, urls[.complete]!))
        #expect(await !canRead(device, urls[.completeUnlessOpen]!))
        #expect(await !canRead(device, urls[.completeUntilFirstUserAuthentication]!))
        #expect(await canRead(device, urls[.noProtection]!))
        #expect(await !canCreate(device, .complete))
        #expect(await canCreate(device, .completeUnlessOpen))
        #expect(await !canCreate(device, .completeUntilFirstUserAuthentication))
        #expect(await canCreate(device, .noProtection))
    }

    @Test func unlockedEverythingWorks() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        try await device.keybag.unlock(passcode: "123456")
        for cls in ProtectionClass.allCases {
            #expect(await canRead(device, urls[cls]!))
            #expect(await canCreate(device, cls))
        }
    }

    @Test func lockedWithinGraceEverythingWorksAfterGraceOnlyCAndD() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        try await device.keybag.unlock(passcode: "123456")
        await device.keybag.lock()
        device.clock.advance(by: 5)
        for cls in ProtectionClass.allCases { #expect(await canRead(device, urls[cls]!)) }
        device.clock.advance(by: 5)
        #expect(await !canRead(device, urls[.complete]!))
        #expect(await !canRead(device, urls[.completeUnlessOpen]!))
        #expect(await canRead(device, urls[.completeUntilFirstUserAuthentication]!))
        #expect(await canRead(device, urls[.noProtection]!))
        #expect(await !canCreate(device, .complete))
        #expect(await canCreate(device, .completeUnlessOpen))
        #expect(await canCreate(device, .completeUntilFirstUserAuthentication))
        #expect(await canCreate(device, .noProtection))
    }

    @Test func openClassAHandleFailsAfterGraceAndRecoversAfterUnlock() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        try await device.keybag.unlock(passcode: "123456")
        let handle = try await device.files.openHandle(forUpdating: urls[.complete]!)
        await device.keybag.lock()
        device.clock.advance(by: 9)
        #expect(try await handle.read(at: 0, count: 100) == Data("complete".utf8))
        device.clock.advance(by: 1)
        await #expect { _ = try await handle.read(at: 0, count: 100) } throws: { isUnavailable($0, writing: false) }
        await #expect { try await handle.write(Data("x".utf8), at: 0) } throws: { isUnavailable($0, writing: true) }
        try await device.keybag.unlock(passcode: "123456")
        #expect(try await handle.read(at: 0, count: 100) == Data("complete".utf8))
        try await handle.close()
    }

    @Test func classBHandleOpenedWhileUnlockedSurvivesLockButReopenNeedsUnlock() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        try await device.keybag.unlock(passcode: "123456")
        let handle = try await device.files.openHandle(forUpdating: urls[.completeUnlessOpen]!)
        await device.keybag.lock()
        device.clock.advance(by: 3600)
        try await handle.append(Data(" more".utf8))
        #expect(try await handle.read(at: 0, count: 100) == Data("complete-unless-open more".utf8))
        try await handle.close()
        await #expect { _ = try await device.files.openHandle(forReadingFrom: urls[.completeUnlessOpen]!) } throws: { isUnavailable($0) }
        try await device.keybag.unlock(passcode: "123456")
        #expect(try await device.files.contents(of: urls[.completeUnlessOpen]!) == Data("complete-unless-open more".utf8))
    }

    @Test func classBFileCreatedWhileLockedIsWritableUntilClosedThenNeedsUnlock() async throws {
        let (device, _) = try await deviceWithOneFilePerClass()
        try await device.keybag.unlock(passcode: "123456")
        await device.keybag.lock()
        device.clock.advance(by: 10)
        let url = device.url("download.part")
        let handle = try await device.files.createFile(at: url, protection: .completeUnlessOpen)
        let payload = randomData(150_000)
        try await handle.write(contentsOf: payload.prefix(70_000))
        try await handle.write(contentsOf: payload.suffix(from: 70_000))
        #expect(try await handle.read(at: 0, count: payload.count) == payload)
        try await handle.close()
        await #expect { _ = try await device.files.contents(of: url) } throws: { isUnavailable($0) }
        try await device.keybag.unlock(passcode: "123456")
        #expect(try await device.files.contents(of: url) == payload)
    }

    @Test func unavailableErrorsBridgeToCocoa257And513() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        do {
            _ = try await device.files.contents(of: urls[.complete]!)
            Issue.record("read must fail")
        } catch {
            let ns = error as NSError
            #expect(ns.domain == NSCocoaErrorDomain)
            #expect(ns.code == 257)
            #expect((error as? ProtectedFileError)?.cocoaError.code == .fileReadNoPermission)
        }
        do {
            try await device.files.write(Data(), to: device.url("new"), options: .completeFileProtection)
            Issue.record("write must fail")
        } catch {
            #expect((error as NSError).code == 513)
            #expect((error as? ProtectedFileError)?.cocoaError.code == .fileWriteNoPermission)
        }
    }

    @Test func classReadableWhileLockedWithoutAnyKey() async throws {
        let (device, urls) = try await deviceWithOneFilePerClass()
        for cls in ProtectionClass.allCases {
            #expect(try device.files.protection(ofItemAt: urls[cls]!) == .protected(cls))
        }
    }

    @Test func filesOfAnotherDeviceAreForeign() async throws {
        let a = try await TestDevice.make()
        let b = try await TestDevice.make()
        let url = a.url("mine")
        try await a.files.write(Data("a".utf8), to: url, protection: .noProtection)
        await #expect(throws: ProtectedFileError.foreignKeybag(path: url.path)) { _ = try await b.files.contents(of: url) }
    }

    @Test func erasedDeviceLeavesFilesUnrecoverable() async throws {
        let device = try await TestDevice.make()
        let url = device.url("d")
        try await device.files.write(Data("gone".utf8), to: url, protection: .noProtection)
        try await device.keybag.erase()
        await #expect(throws: (any Error).self) { _ = try await device.files.contents(of: url) }
        let fresh = try await Keybag.create(root: device.root, passcode: nil, kdf: .insecureFastForTesting)
        await #expect(throws: ProtectedFileError.foreignKeybag(path: url.path)) {
            _ = try await ProtectedFileManager(keybag: fresh).contents(of: url)
        }
    }
}
