@_spi(Testing) @testable import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Testing

/// Values at the edges of their types, and the keybag's MAC-first rule.
@Suite struct KeybagHardeningTests {
    /// NaN, infinities, negatives and 10^300 were accepted or trapped in `Int64(seconds * 1000)`.
    @Test(arguments: [Double.nan, .infinity, -.infinity, -1, 1e300, 86_401])
    func anOutOfRangeGracePeriodIsRefused(seconds: Double) async throws {
        let (keybag, _, _) = try await makeDevice()
        await #expect { try await keybag.setGracePeriod(seconds) } throws: { error in
            guard case KeybagError.invalidArgument = error else { return false }
            return true
        }
        #expect(await keybag.gracePeriod == 10)
        await #expect(throws: KeybagError.self) {
            _ = try await Keybag.create(root: temporaryDirectory() + "/r", passcode: "1", kdf: .insecureFastForTesting, gracePeriod: seconds)
        }
    }

    @Test func theLargestGracePeriodIsAccepted() async throws {
        let (keybag, _, _) = try await makeDevice()
        try await keybag.setGracePeriod(PasscodePolicy.maximumGracePeriod)
        #expect(await keybag.gracePeriod == PasscodePolicy.maximumGracePeriod)
    }

    /// A keybag whose counter is at `UInt32.max` (crafted with the device's own MAC key) made
    /// every unlock trap on overflow: the counter saturates, and the right passcode still works.
    @Test func aFailureCounterAtItsMaximumSaturates() async throws {
        let (_, clock, root) = try await makeDevice()
        let secret = try DeviceSecret.load(from: root)
        let macKey = secret.derive(KeybagFile.macLabel)
        var file = try KeybagFile.decode(try POSIXFile.readAll(root + "/keybag"), macKey: macKey)
        file.failedAttempts = .max
        file.lastFailureMillis = Int64(clock.now().timeIntervalSince1970 * 1000)
        try POSIXFile.writeAtomically(root + "/keybag", file.encoded(macKey: macKey))
        clock.advance(by: 3601)   // past the longest delay
        let keybag = try await Keybag.open(root: root, clock: clock)
        await #expect(throws: KeybagError.wrongPasscode(failedAttempts: Int(UInt32.max))) { try await keybag.unlock(passcode: "wrong") }
        clock.advance(by: 3601)
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.lockState == .unlocked)
    }

    /// The MAC is checked before the magic, version and length fields are believed (FORMAT.md §2).
    @Test func headerFieldsAreReadOnlyAfterTheMAC() async throws {
        let (_, clock, root) = try await makeDevice()
        let original = try POSIXFile.readAll(root + "/keybag")
        for index in [0, 3, 8, 9, 10, 11] {
            var bytes = original
            bytes[index] ^= 0x40
            try POSIXFile.writeAtomically(root + "/keybag", bytes)
            await #expect(Comment(rawValue: "byte \(index)")) { _ = try await Keybag.open(root: root, clock: clock) } throws: { error in
                "\(error)".contains("authentication failed")
            }
        }
    }

    /// Names from the file system are bytes: the mapping to strings loses and merges nothing.
    @Test func losslessPathsRoundTripEveryByteString() {
        var samples: [[UInt8]] = [Array("lat".utf8) + [0xE9], [0x79, 0xFE], [0x79, 0xFD], [0xFF], [0xC3], [0xE2, 0x82],
                                  Array("plain/ascii".utf8), Array("日本語".utf8), [0xF4, 0x8F, 0xBF, 0xBF], [0xED, 0xA0, 0x80]]
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2_000 { samples.append((0..<Int.random(in: 1...12, using: &generator)).map { _ in UInt8.random(in: 1...255, using: &generator) }) }
        var seen: [String: [UInt8]] = [:]
        for bytes in samples {
            let string = LosslessPath.string(fromBytes: bytes)
            #expect(LosslessPath.bytes(of: string) == bytes, "\(bytes)")
            if let other = seen[string] { #expect(other == bytes, "\(other) and \(bytes) merged") }
            seen[string] = bytes
        }
        #expect(LosslessPath.display(LosslessPath.string(fromBytes: Array("lat".utf8) + [0xE9])) == "lat\\xE9")
        #expect(throws: NULInPathError.self) { try LosslessPath.withCString("a\0b") { _ in 0 } }
    }

    /// A path's directory and name, split without touching the file system, as `dirname` and
    /// `basename` would; a temporary sibling stays in the same directory, hidden.
    @Test func pathsSplitAtTheirLastSlash() {
        #expect(POSIXFile.split("/a/b") == ("/a", "b"))
        #expect(POSIXFile.split("/a/b/") == ("/a", "b"))
        #expect(POSIXFile.split("/a") == ("/", "a"))
        #expect(POSIXFile.split("a") == (".", "a"))
        #expect(POSIXFile.split("/") == ("/", "/"))
        let odd = "/d/" + LosslessPath.string(fromBytes: [0x79, 0xFE, 0x2F - 1])
        #expect(POSIXFile.split(odd).name == LosslessPath.string(fromBytes: [0x79, 0xFE, 0x2E]))
        let sibling = POSIXFile.temporarySibling(of: "/d/settings.plist")
        #expect(sibling.hasPrefix("/d/.settings.plist.dp-tmp-"))
        #expect(POSIXFile.temporarySibling(of: "/top").hasPrefix("/.top.dp-tmp-"))
    }
}

/// Mutated keybags: every one is refused with `corruptKeybag` (none is accepted, none traps).
@Suite struct KeybagFuzzTests {
    @Test func twoThousandMutatedKeybagsAreRefused() async throws {
        let (_, clock, root) = try await makeDevice()
        let original = try POSIXFile.readAll(root + "/keybag")
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2_000 {
            var bytes = original
            switch Int.random(in: 0..<4, using: &generator) {
            case 0: bytes[Int.random(in: 0..<bytes.count, using: &generator)] ^= UInt8.random(in: 1...255, using: &generator)
            case 1: bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &generator)))
            case 2: bytes.insert(UInt8.random(in: 0...255, using: &generator), at: Int.random(in: 0...bytes.count, using: &generator))
            default: bytes = (0..<[424, 504].randomElement(using: &generator)!).map { _ in UInt8.random(in: 0...255, using: &generator) }
            }
            #expect(throws: KeybagError.self) {
                _ = try KeybagFile.decode(bytes, macKey: try DeviceSecret.load(from: root).derive(KeybagFile.macLabel))
            }
        }
        _ = try await Keybag.open(root: root, clock: clock)
    }
}
