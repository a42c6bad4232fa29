@_spi(Testing) import DataProtectionKeybag
import Foundation
import Testing

@Suite struct KeybagFileTests {
    func corrupt(_ root: String, _ mutate: (inout [UInt8]) -> Void) throws {
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: root + "/keybag")))
        mutate(&bytes)
        try Data(bytes).write(to: URL(fileURLWithPath: root + "/keybag"))
    }

    func expectCorrupt(_ root: String, _ clock: ManualClock) async {
        await #expect {
            _ = try await Keybag.open(root: root, clock: clock)
        } throws: { error in
            guard case KeybagError.corruptKeybag = error else { return false }
            return true
        }
    }

    @Test func everySingleFlippedBitIsRejected() async throws {
        let (_, clock, root) = try await makeDevice()
        let original = [UInt8](try Data(contentsOf: URL(fileURLWithPath: root + "/keybag")))
        #expect(original.count == 504)   // format version 2
        for index in stride(from: 0, to: original.count, by: 7) {
            try corrupt(root) { $0 = original; $0[index] ^= 0x01 }
            await expectCorrupt(root, clock)
        }
        try corrupt(root) { $0 = original }
        _ = try await Keybag.open(root: root, clock: clock)
    }

    @Test func truncatedExtendedAndGarbageKeybagsAreRejected() async throws {
        let (_, clock, root) = try await makeDevice()
        let original = [UInt8](try Data(contentsOf: URL(fileURLWithPath: root + "/keybag")))
        for cut in [0, 5, 12, 100, 423, 424, 503] {
            try corrupt(root) { $0 = Array(original.prefix(cut)) }
            await expectCorrupt(root, clock)
        }
        try corrupt(root) { $0 = original + [0] }
        await expectCorrupt(root, clock)
        try corrupt(root) { $0 = (0..<504).map { _ in UInt8.random(in: 0...255) } }
        await expectCorrupt(root, clock)
        try corrupt(root) { $0 = (0..<424).map { _ in UInt8.random(in: 0...255) } }
        await expectCorrupt(root, clock)
        try corrupt(root) { $0 = Array("{\"not\": \"a keybag\"}".utf8) }
        await expectCorrupt(root, clock)
    }

    @Test func aKeybagCopiedToAnotherDeviceSecretIsRejected() async throws {
        let (_, clock, rootA) = try await makeDevice()
        let (_, _, rootB) = try await makeDevice()
        try FileManager.default.removeItem(atPath: rootB + "/keybag")
        try FileManager.default.copyItem(atPath: rootA + "/keybag", toPath: rootB + "/keybag")
        await expectCorrupt(rootB, clock)
    }

    @Test func deviceSecretProblemsAreReportedClearly() async throws {
        let (_, clock, root) = try await makeDevice()
        chmod(root + "/device.secret", 0o644)
        await #expect { _ = try await Keybag.open(root: root, clock: clock) } throws: { error in
            guard case KeybagError.badDeviceSecret(let why) = error else { return false }
            return why.contains("0600")
        }
        chmod(root + "/device.secret", 0o600)
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: root + "/device.secret"))
        chmod(root + "/device.secret", 0o600)
        await #expect { _ = try await Keybag.open(root: root, clock: clock) } throws: { error in
            guard case KeybagError.badDeviceSecret = error else { return false }
            return true
        }
        try FileManager.default.removeItem(atPath: root + "/device.secret")
        await #expect { _ = try await Keybag.open(root: root, clock: clock) } throws: { error in
            guard case KeybagError.badDeviceSecret(let why) = error else { return false }
            return why.contains("missing")
        }
    }

    @Test func deviceSecretAndRootHaveOwnerOnlyModes() async throws {
        let (_, _, root) = try await makeDevice()
        let secret = try FileManager.default.attributesOfItem(atPath: root + "/device.secret")
        #expect((secret[.posixPermissions] as? Int) == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: root).sorted() == ["device.secret", "keybag", "keybag.spare"])
        let spare = try FileManager.default.attributesOfItem(atPath: root + "/keybag.spare")   // random bytes, for a full disk
        #expect((spare[.posixPermissions] as? Int) == 0o600 && (spare[.size] as? Int) == 504)
        let rootAttributes = try FileManager.default.attributesOfItem(atPath: root)
        #expect((rootAttributes[.posixPermissions] as? Int) == 0o700)
    }

    @Test func missingRootAndDoubleInit() async throws {
        let missing = temporaryDirectory() + "/nothing-here"
        await #expect(throws: KeybagError.notInitialized(root: missing)) { _ = try await Keybag.open(root: missing) }
        let (_, _, root) = try await makeDevice()
        await #expect(throws: KeybagError.alreadyInitialized(root: root)) {
            _ = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting)
        }
    }
}

@Suite struct FileKeyTests {
    @Test func classBWrapsWhileLockedAndUnwrapsOnlyWhenUnlocked() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        let (key, wrapped) = try await keybag.wrapNewFileKey(for: .completeUnlessOpen)
        #expect(wrapped.ephemeralPublicKey?.count == 32)
        await #expect(throws: KeybagError.classUnavailable(.completeUnlessOpen, .beforeFirstUnlock)) { _ = try await keybag.unwrapFileKey(wrapped) }
        try await keybag.unlock(passcode: "123456")
        #expect(try await keybag.unwrapFileKey(wrapped) == key)
    }

    @Test func classesOtherThanBCannotBeCreatedWhileUnavailable() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.classUnavailable(.complete, .beforeFirstUnlock)) { _ = try await keybag.wrapNewFileKey(for: .complete) }
        await #expect(throws: KeybagError.classUnavailable(.completeUntilFirstUserAuthentication, .beforeFirstUnlock)) {
            _ = try await keybag.wrapNewFileKey(for: .completeUntilFirstUserAuthentication)
        }
        _ = try await keybag.wrapNewFileKey(for: .noProtection)
    }

    @Test func keysFromAnotherKeybagAreForeign() async throws {
        let (a, _, _) = try await makeDevice()
        let (b, _, _) = try await makeDevice()
        let (_, wrapped) = try await a.wrapNewFileKey(for: .noProtection)
        await #expect { _ = try await b.unwrapFileKey(wrapped) } throws: { error in
            guard case KeybagError.foreignKeybag = error else { return false }
            return true
        }
    }

    @Test func aDamagedWrappedKeyFailsToUnwrap() async throws {
        let (keybag, _, _) = try await makeDevice()
        var (_, wrapped) = try await keybag.wrapNewFileKey(for: .complete)
        wrapped.wrappedKey[3] ^= 0x40
        await #expect(throws: KeybagError.keyUnwrapFailed(.complete)) { _ = try await keybag.unwrapFileKey(wrapped) }
    }
}
