import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// A second implementation judges ours: `Tests/oracle/dp_format.py`, written from
/// docs/FORMAT.md with pyca/cryptography (OpenSSL), must decrypt what the library writes.
@Suite struct OracleTests {
    /// `DP_PYTHON`, else the venv `scripts/test` creates, else `python3`.
    static var python: String {
        if let explicit = ProcessInfo.processInfo.environment["DP_PYTHON"] { return explicit }
        let venv = packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
        return FileManager.default.isExecutableFile(atPath: venv) ? venv : "/usr/bin/env"
    }

    static func oracle(_ args: [String]) throws -> (status: Int32, out: Data, err: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        let script = packageRoot.appendingPathComponent("Tests/oracle/dp_format.py").path
        process.arguments = (python == "/usr/bin/env" ? ["python3"] : []) + [script] + args
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, outData, String(decoding: errData, as: UTF8.self))
    }

    @Test func oracleRecomputesTheDocumentedVectors() throws {
        let result = try Self.oracle(["vectors"])
        try #require(result.status == 0, "the oracle needs python3 with `cryptography` (scripts/test installs it): \(result.err)")
        let vectors = try JSONSerialization.jsonObject(with: result.out) as? [String: String] ?? [:]
        for (name, value) in FormatVectorTests.expected {
            #expect(vectors[name] == value, "\(name)")
        }
    }

    @Test(arguments: [nil, "123456"] as [String?])
    func oracleDecryptsEveryClass(passcode: String?) async throws {
        let base = temporaryDirectory()
        let root = base.appendingPathComponent("root").path
        let keybag = try await Keybag.create(root: root, passcode: passcode, kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: keybag)
        for cls in ProtectionClass.allCases {
            for size in [0, 5, 65_536, 150_001] {
              for access in [ProtectedFileAccessPattern.sequential, .randomAccess] {   // formats 1 and 2
                let url = base.appendingPathComponent("\(cls.shortName)-\(size)-\(access)")
                let data = randomData(size)
                try await files.write(data, to: url, protection: cls, access: access)
                // Exercise rewrites too: random-access writes re-seal segments with fresh nonces.
                if size > 10 {
                    let handle = try await files.openHandle(forUpdating: url)
                    try await handle.write(Data("patched".utf8), at: Int64(size / 2))
                    try await handle.close()
                }
                let expected = try await files.contents(of: url)
                let result = try Self.oracle(["decrypt", root, url.path] + (passcode.map { ["--passcode", $0] } ?? []))
                #expect(result.status == 0, "\(cls) \(size): \(result.err)")
                #expect(result.out == expected, "\(cls) \(size)")
              }
            }
        }
        // A format-2 file left being written and being truncated (its writer killed): the oracle
        // reads it as the library does.
        let url = base.appendingPathComponent("being-written")
        let handle = try await files.createFile(at: url, protection: .noProtection)
        try await handle.write(randomData(30_000), at: 0)
        try await handle.truncate(atOffset: 12_345)
        let expected = try await files.contents(of: url)
        #expect(expected.count == 12_345)
        let result = try Self.oracle(["decrypt", root, url.path] + (passcode.map { ["--passcode", $0] } ?? []))
        #expect(result.status == 0, "\(result.err)")
        #expect(result.out == expected)
        try await handle.close()
        // The oracle reads the keybag's fields as the library wrote them.
        let fields = try JSONSerialization.jsonObject(with: try Self.oracle(["keybag", root]).out) as? [String: Any]
        #expect(fields?["uuid"] as? String == keybag.id.uuidString)
        #expect(fields?["passcode_set"] as? Bool == (passcode != nil))
        #expect(fields?["grace_ms"] as? Int == 10_000)
        #expect(fields?["minimum_passcode_length"] as? Int == 6)
        // A passcode policy other than the default makes it version 3, which the oracle reads too.
        try await keybag.setMinimumPasscodeLength(9)
        let policy = try JSONSerialization.jsonObject(with: try Self.oracle(["keybag", root]).out) as? [String: Any]
        #expect(policy?["minimum_passcode_length"] as? Int == 9)
        let decrypted = try Self.oracle(["decrypt", root, url.path] + (passcode.map { ["--passcode", $0] } ?? []))
        #expect(decrypted.status == 0 && decrypted.out == expected, "\(decrypted.err)")
    }

    @Test func oracleRejectsATamperedFileToo() async throws {
        let base = temporaryDirectory()
        let root = base.appendingPathComponent("root").path
        let keybag = try await Keybag.create(root: root, passcode: nil, kdf: .insecureFastForTesting)
        let url = base.appendingPathComponent("f")
        try await ProtectedFileManager(keybag: keybag).write(randomData(1000), to: url, protection: .noProtection)
        var bytes = [UInt8](try Data(contentsOf: url))
        bytes[500] ^= 1
        try Data(bytes).write(to: url)
        #expect(try Self.oracle(["decrypt", root, url.path]).status != 0)
    }
}
