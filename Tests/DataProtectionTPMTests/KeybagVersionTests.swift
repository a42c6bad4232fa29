import Crypto
import DataProtection
@_spi(Testing) @testable import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing

/// Keybag format version 2 and the TPM binding's documented vectors (docs/FORMAT.md §2, §2c, §6).
@Suite struct KeybagVersionTests {
    static let vectors: [String: String] = [
        "tpm_passcode_kek": "75e4dd28bced2548d72941164d27757134487060caf92ee73ec5daf882cc725a",
        "tpm_passcode_auth": "87b8a7aa515777362cf0560ce7a91e4d7f58785035c12fbdff55b0ea9bf28934",
        "tpm_counter_auth": "57cebc2af69bc8ed931d880a6cdfa6cbe1cf5fb9dd94bb85e4d39a6e02bdf460",
        "tpm_binding": "89445054504d0d0a0001000081004000000b0000000000800000000000000000",
        "tpm_binding_digest": "dac4c4ee180a3a4a75173fe8420f974222d23d117cb1d6c89ac928211718d438",
    ]

    static func hex(_ bytes: some Sequence<UInt8>) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    @Test func theLibraryComputesTheDocumentedTPMVectors() throws {
        let secret = DeviceSecret(key: SymmetricKey(data: Array(0x00...0x1f as ClosedRange<UInt8>)))
        let stretched = try PasscodeKDF(logN: 10).derive(passcode: "1234", salt: Array(0x00...0x0f as ClosedRange<UInt8>))
        let passcodeSecret = SecretBytes(copying: Array(0x20...0x3f as ClosedRange<UInt8>))
        let record = TPMBindingRecord(deviceObject: 0x8100_4000, pcrs: TPMPCRSelection(mask: 1 << 7))
        let computed = [
            "tpm_passcode_kek": EmbeddedKeybag.passcodeKEK(secret: secret, stretched: stretched, passcodeSecret: passcodeSecret)
                .withUnsafeBytes { Self.hex($0) },
            "tpm_passcode_auth": Self.hex(EmbeddedKeybag.tpmPasscodeAuth(secret: secret, stretched: stretched)),
            "tpm_counter_auth": Self.hex(EmbeddedKeybag.tpmCounterAuth(secret: secret)),
            "tpm_binding": Self.hex(record.encoded),
            "tpm_binding_digest": Self.hex(record.digest),
        ]
        #expect(computed == Self.vectors)
        let format = try String(contentsOf: packageRoot.appendingPathComponent("docs/FORMAT.md"), encoding: .utf8)
        for (name, value) in Self.vectors { #expect(format.contains(value), "\(name) is not in FORMAT.md") }
        #expect(try TPMBindingRecord.decode(record.encoded, path: "x") == record)
    }

    @Test func aVersionOneKeybagOpensAndIsRewrittenAsVersionTwo() async throws {
        let root = temporaryDirectory().appendingPathComponent("root").path
        _ = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting)
        let path = root + "/keybag"
        let macKey = try DeviceSecret.load(from: root).derive(KeybagFile.macLabel)
        var v2 = try POSIXFile.readAll(path)
        #expect(v2.count == 504 && v2[9] == 2)
        // The same keybag as version 1 wrote it: the first 392 bytes, version 1, length 424, its MAC.
        var v1 = Array(v2[0..<392])
        v1[9] = 1
        v1[10] = UInt8(424 >> 8); v1[11] = UInt8(424 & 0xFF)
        v1 += Array(HMAC<SHA256>.authenticationCode(for: v1, using: macKey))
        try Data(v1).write(to: URL(fileURLWithPath: path))
        let keybag = try await Keybag.open(root: root)
        try await keybag.unlock(passcode: "123456")
        v2 = try POSIXFile.readAll(path)
        #expect(v2.count == 504 && v2[9] == 2)

        // Version 2 parsed defensively: a storage byte, reserved bytes or TPM fields out of place.
        for (offset, value) in [(400, UInt8(2)), (401, UInt8(1)), (404, UInt8(1)), (440, UInt8(1))] {
            var bad = Array(v2[0..<472])
            bad[offset] = value
            bad += Array(HMAC<SHA256>.authenticationCode(for: bad, using: macKey))
            #expect(throws: KeybagError.self) { try KeybagFile.decode(bad, macKey: macKey) }
        }
        #expect(throws: KeybagError.self) { try KeybagFile.decode(Array(v2.dropLast()), macKey: macKey) }
    }
}
