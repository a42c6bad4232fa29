import DataProtection
import Foundation
import Testing

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

func temporaryDirectory() -> URL {
    let url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dp-sqlite-tests-" + UUID().uuidString)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

struct ToolResult {
    let status: Int32
    let out: String
    let err: String
    /// Output lines, each a JSON array printed by the oracle.
    var rows: [[Any]] {
        out.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [Any] }
    }
}

func run(_ executable: String, _ arguments: [String], stdin: String? = nil) throws -> ToolResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe(), err = Pipe(), input = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = input
    try process.run()
    if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
    try input.fileHandleForWriting.close()
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    let errData = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return ToolResult(status: process.terminationStatus, out: String(decoding: outData, as: UTF8.self),
                      err: String(decoding: errData, as: UTF8.self))
}

/// Real SQLCipher 4 through Python (`Tests/oracle/sqlcipher_oracle.py`, PyPI sqlcipher3-binary).
enum SQLCipher4 {
    static var python: String {
        if let explicit = ProcessInfo.processInfo.environment["DP_PYTHON"] { return explicit }
        return packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
    }

    static func run(_ db: String, key: String, _ options: [String] = [], _ sql: String...) throws -> ToolResult {
        let script = packageRoot.appendingPathComponent("Tests/oracle/sqlcipher_oracle.py").path
        let result = try DataProtectionSQLiteTests.run(python, [script, db, key] + options + sql)
        if result.status != 0 && result.err.contains("No module named") {
            Issue.record("the SQLCipher oracle needs the venv scripts/test creates (sqlcipher3-binary): \(result.err)")
        }
        return result
    }
}

/// Debian's `sqlcipher` shell: SQLCipher 3.4.1, the version-3 format.
enum SQLCipher3 {
    static func run(_ db: String, script: String) throws -> ToolResult {
        try DataProtectionSQLiteTests.run("/usr/bin/sqlcipher", ["-batch", db], stdin: script)
    }
}

/// A device with passcode "1234", weak scrypt parameters and a virtual clock.
struct TestDevice {
    let keybag: Keybag
    let clock: ManualClock
    let root: String
    let dir: URL

    static func make(grace: TimeInterval = 10) async throws -> TestDevice {
        let base = temporaryDirectory()
        let clock = ManualClock()
        let root = base.appendingPathComponent("root").path
        let keybag = try await Keybag.create(root: root, passcode: "1234", kdf: .insecureFastForTesting, gracePeriod: grace, clock: clock)
        let dir = base.appendingPathComponent("data")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return TestDevice(keybag: keybag, clock: clock, root: root, dir: dir)
    }

    /// The same device after a restart: before first unlock.
    func restarted() async throws -> TestDevice {
        TestDevice(keybag: try await Keybag.open(root: root, clock: clock), clock: clock, root: root, dir: dir)
    }

    /// Locks and lets the grace period pass; returns once the keybag has discarded the keys.
    func lockPastGrace() async {
        await keybag.lock()
        clock.advance(by: await keybag.gracePeriod + 1)
        _ = await keybag.isProtectedDataAvailable   // the keybag expires the grace on any query
    }

    func url(_ name: String) -> URL { dir.appendingPathComponent(name) }
}

func isUnavailable(_ error: any Error, writing: Bool? = nil) -> Bool {
    guard case ProtectedFileError.unavailable(_, _, _, let w) = error else { return false }
    return writing == nil || writing == w
}
