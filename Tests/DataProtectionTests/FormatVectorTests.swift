import Crypto
@testable import DataProtection
@testable import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing

/// The test vectors of docs/FORMAT.md, computed by the library's own code paths. The same
/// values are recomputed by the independent Python reader (`Tests/oracle/dp_format.py vectors`,
/// checked in `OracleTests`).
@Suite struct FormatVectorTests {
    static let expected: [String: String] = [
        "keybag_mac_key": "8dced66b3bf20007b5564d3d21b3e06d24779d560297c7118b7991acb9abf4a0",
        "class_d_kek": "86851e9be77aa12c3eee3a016837b4df56506f26a54d9e752356cab1f4293bfa",
        "no_passcode_kek": "24b26fe393291a531b8fb281482ced1336f4727d5dac3bb5260d8da4b5de9fed",
        "scrypt_1234": "11fb48b815df907de8d7662a055dec5ede83867a221fa66acfeb6736cd1d5a6f",
        "passcode_kek": "ef75e46a32a94297af5b2fc401981734ed05e2073776b40f136f8045577830f0",
        "failed_tag_key": "a398afc31c2387efb05d6720b591a1e2b0850709f0b5c33257091280db4950f7",
        "content_key": "8017f079e9da600ee6e27df192f3494f179e00055442cac2ae4f7c97dfc9ce27",
        "header_key": "0e4d7b138873de0a874c86fab9046c093ddc3f14dd82dfc1968c765743f54357",
        "wrapped_file_key": "9b169301e574abf4cb4bd821e878c57a73ba8f9a6b1c544c36e22a8d5ac054e7d685929ed5632a39",
        "header": "894450460d0a1a0a000100a003100000606162636465666768696a6b6c6d6e6f00112233445566778899aabbccddeeff9b169301e574abf4cb4bd821e878c57a73ba8f9a6b1c544c36e22a8d5ac054e7d685929ed5632a390000000000000000000000000000000000000000000000000000000000000000000000000000000060d6802f03589eda45dc32c76089a5a245e8e8b06f5b62c2178ff651fe2f78d3",
        "segment_aad": "606162636465666768696a6b6c6d6e6f000000000000000001",
        "segment": "000102030405060708090a0b4782d5b3a073a25e11aeb47265c3a16835471de55c34dd5e8a1ff5ef88b723a2d2f836882779",
        "class_b_public": "605a725d2a4adfeeb1a29e17edd621c1b7593ee8cdbc44ac6c4ab6e2f805d23c",
        "class_b_ephemeral_public": "dc2cca31e8e43bbd91dff7e475cca3347eb478107d5bd765aba4ae4a30c35d44",
        "class_b_wrapped_file_key": "1a71ab96b47011f465e87b516c490eba8f197a45417bb940eca536817f7956b607547ecefd89c1d8",
        "header_v2": "894450460d0a1a0a000200a0030c0000606162636465666768696a6b6c6d6e6f00112233445566778899aabbccddeeff9b169301e574abf4cb4bd821e878c57a73ba8f9a6b1c544c36e22a8d5ac054e7d685929ed5632a3900000000000000000000000000000000000000000000000000000000000000000000000000000000e9d3d8926f9bedd3c8102b0a09b2d1a3a5325e191465fe08d75df26b12a79584",
        "header_v2_truncating": "894450460d0a1a0a000200a0030c0600606162636465666768696a6b6c6d6e6f00112233445566778899aabbccddeeff9b169301e574abf4cb4bd821e878c57a73ba8f9a6b1c544c36e22a8d5ac054e7d685929ed5632a3900000000000000000000000000000000000000000000000000000000000000000000000000001388830b646c6823767412bb59c9633ecc62c3a61ba429e9e5c583bc9a91b36da997",
    ]

    static func bytes(_ range: ClosedRange<UInt8>) -> [UInt8] { Array(range) }
    static func hex(_ key: SymmetricKey) -> String { key.withUnsafeBytes { Array($0) }.hex }

    static func computed() throws -> [String: String] {
        let secret = DeviceSecret(key: SymmetricKey(data: bytes(0x00...0x1f)))
        let stretched = try PasscodeKDF(logN: 10).derive(passcode: "1234", salt: bytes(0x00...0x0f))
        let fileKey = SymmetricKey(data: bytes(0x40...0x5f))
        let fileID = bytes(0x60...0x6f)
        let classKey = SymmetricKey(data: bytes(0x80...0x9f))
        let keys = FileKeys(fileKey: fileKey, fileID: fileID)
        let wrapped = Array(try AES.KeyWrap.wrap(fileKey, using: classKey))
        let header = ProtectedFileHeader(
            segmentSizeLog2: 16, fileID: fileID,
            wrappedKey: WrappedFileKey(protectionClass: .completeUntilFirstUserAuthentication,
                                       keybagID: UUID(uuidString: "00112233-4455-6677-8899-AABBCCDDEEFF")!,
                                       wrappedKey: wrapped, ephemeralPublicKey: nil))
        var pageAligned = header
        pageAligned.version = ProtectedFileHeader.pageAlignedVersion
        pageAligned.segmentSizeLog2 = 12
        var truncating = pageAligned
        truncating.beingWritten = true
        truncating.truncatingTo = 5000
        let cipher = SegmentCipher(key: keys.contentKey, fileID: fileID)
        var segment: [UInt8] = []
        try Array("hello, data protection".utf8).withUnsafeBytes {
            try cipher.seal($0, index: 0, final: true, nonce: AES.GCM.Nonce(data: bytes(0x00...0x0b)), into: &segment)
        }
        let bPrivate = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: bytes(0xa0...0xbf))
        let ephemeral = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: bytes(0xc0...0xdf))
        let (bWrapped, ephemeralPublic) = try ClassBKeyAgreement.wrap(fileKey, to: bPrivate.publicKey, ephemeral: ephemeral)
        return [
            "keybag_mac_key": hex(secret.derive(KeybagFile.macLabel)),
            "class_d_kek": hex(secret.derive(Keybag.labelClassD)),
            "no_passcode_kek": hex(secret.derive(Keybag.labelNoPasscode)),
            "scrypt_1234": hex(stretched),
            "passcode_kek": hex(secret.derive(Keybag.labelPasscode, salt: stretched.withUnsafeBytes { Array($0) })),
            "failed_tag_key": hex(secret.derive(Keybag.labelFailedTag)),
            "content_key": hex(keys.contentKey),
            "header_key": hex(keys.headerKey),
            "wrapped_file_key": wrapped.hex,
            "header": header.encoded(keys: keys).hex,
            "segment_aad": cipher.associatedData(index: 0, final: true).hex,
            "segment": segment.hex,
            "class_b_public": Array(bPrivate.publicKey.rawRepresentation).hex,
            "class_b_ephemeral_public": ephemeralPublic.hex,
            "class_b_wrapped_file_key": bWrapped.hex,
            "header_v2": pageAligned.encoded(keys: keys).hex,
            "header_v2_truncating": truncating.encoded(keys: keys).hex,
        ]
    }

    @Test func libraryMatchesTheDocumentedVectors() throws {
        let computed = try Self.computed()
        for (name, value) in Self.expected.sorted(by: { $0.key < $1.key }) {
            #expect(computed[name] == value, "\(name)")
        }
    }

    @Test func theVectorsInFormatMdAreTheseVectors() throws {
        let spec = try String(contentsOf: packageRoot.appendingPathComponent("docs/FORMAT.md"), encoding: .utf8)
        for (name, value) in Self.expected {
            // Long values are wrapped in the document; compare without whitespace.
            #expect(spec.filter { !$0.isWhitespace }.contains(value), "FORMAT.md lacks \(name)")
        }
    }
}

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
