import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing


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
    let result = try ChildProcess.run(executable, arguments, stdin: stdin.map { Data($0.utf8) })
    return ToolResult(status: result.status, out: result.out, err: result.err)
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

/// A device with passcode "123456", weak scrypt parameters and a virtual clock.
func isUnavailable(_ error: any Error, writing: Bool? = nil) -> Bool {
    guard case ProtectedFileError.unavailable(_, _, _, let w) = error else { return false }
    return writing == nil || writing == w
}
