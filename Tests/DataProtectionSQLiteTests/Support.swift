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
