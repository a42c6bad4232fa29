import ArgumentParser
import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB
import GRDBSQLite

/// `dp-bench sqlite`: the cost of encryption on one SQL workload, ours beside SQLCipher's.
///
/// The same SQL runs on plain SQLite and on our encrypted database (this binary, raw key), and
/// on SQLCipher 4 without and with a key (Python `sqlcipher3-binary`, whose SQL runs in C). Each
/// side's overhead is keyed ÷ unkeyed time, so the two libraries' builds of SQLite cancel out.
struct SQLiteBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sqlite",
        abstract: "Encrypted SQLite: our overhead over plain SQLite beside SQLCipher 4's, and the open time of a class-managed database.")

    @Option(help: "Rows inserted (in transactions of 10,000).")
    var rows = 1_000_000

    @Option(help: "Point selects by primary key.")
    var selects = 100_000

    @Option(help: "Directory for the databases (default: a new one under $TMPDIR).")
    var directory: String?

    @Option(help: "Python with sqlcipher3-binary (default: $DP_PYTHON, else .venv-oracle/bin/python).")
    var python: String?

    static let rawKey = "2DD29CA851E7B56E4697B0E1F08507293D761A05CE4D1B628663F411A8086D99"

    struct Group: Codable { var name: String; var statements: [String] }

    func workload() -> [Group] {
        let batch = 10_000
        var inserts: [String] = ["CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, value REAL, payload BLOB)"]
        for b in 0..<(rows + batch - 1) / batch {
            let count = min(batch, rows - b * batch)
            inserts += ["BEGIN",
                        """
                        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(count))
                        INSERT INTO t(id, name, value, payload)
                        SELECT \(b * batch) + i, printf('name-%08d', ((\(b * batch) + i) * 7919) % \(rows)), (\(b * batch) + i) * 0.5, randomblob(64) FROM n
                        """,
                        "COMMIT"]
        }
        return [
            Group(name: "insert", statements: inserts),
            Group(name: "point_select", statements: ["""
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(selects))
                SELECT sum((SELECT value FROM t WHERE id = (i * 7919) % \(rows) + 1)) FROM n
                """]),
            Group(name: "full_scan", statements: ["SELECT sum(length(name)), sum(value), sum(length(payload)) FROM t"]),
            Group(name: "index_build", statements: ["CREATE INDEX t_name ON t(name)"]),
        ]
    }

    func run() async throws {
        let dir = directory ?? NSTemporaryDirectory() + "dp-bench-sqlite-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if directory == nil { try? FileManager.default.removeItem(atPath: dir) } }
        let groups = workload()
        print("dp-bench sqlite: \(rows) rows, \(selects) point selects; databases in \(dir)")

        func time(_ writer: DatabaseQueue) throws -> [String: Double] {
            var result: [String: Double] = [:]
            for group in groups {
                let start = ContinuousClock.now
                try writer.writeWithoutTransaction { db in
                    for sql in group.statements { _ = try GRDB.Row.fetchAll(db, sql: sql) }
                }
                let elapsed = ContinuousClock.now - start
                result[group.name] = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            }
            try writer.close()
            return result
        }
        let plain = try time(DatabaseQueue(path: dir + "/plain.db"))
        let ours = try time(DatabaseQueue(path: dir + "/ours.db", key: try SQLCipherKey(rawKeyHex: Self.rawKey)))

        // SQLCipher 4, same SQL, same run.
        let interpreter = python ?? ProcessInfo.processInfo.environment["DP_PYTHON"]
            ?? packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
        let script = packageRoot.appendingPathComponent("bench/sqlcipher_workload.py").path
        let peer = try runPeer(interpreter, script, dir, groups)

        let openMillis = try await classManagedOpenTime(dir)

        var lines = [["WORKLOAD", "PLAIN SQLITE", "OURS", "OUR OVERHEAD", "SQLCIPHER", "SQLCIPHER+KEY", "SQLCIPHER OVERHEAD", "OURS ≤ SQLCIPHER", "OURS ÷ SQLCIPHER+KEY"]]
        var summary: [String] = []
        for group in groups {
            let p = plain[group.name]!, o = ours[group.name]!
            let ourRatio = o / p
            var cells = [group.name, String(format: "%.3f s", p), String(format: "%.3f s", o), String(format: "%.2f×", ourRatio)]
            summary.append("\(group.name)_overhead=\(String(format: "%.3f", ourRatio))")
            if let peer, let sp = peer.plain[group.name], let sk = peer.keyed[group.name] {
                let theirRatio = sk / sp
                cells += [String(format: "%.3f s", sp), String(format: "%.3f s", sk), String(format: "%.2f×", theirRatio),
                          ourRatio <= theirRatio ? "yes" : "no", String(format: "%.2f×", o / sk)]
                summary.append("\(group.name)_sqlcipher_overhead=\(String(format: "%.3f", theirRatio))")
                summary.append("\(group.name)_vs_sqlcipher_keyed=\(String(format: "%.3f", o / sk))")
            } else {
                cells += ["n/a", "n/a", "n/a", "n/a", "n/a"]
            }
            lines.append(cells)
        }
        printColumns(lines)
        print("")
        let probe = try PageCipherProbe.microsecondsPerPage()
        var pageLine = "page cipher alone, 4096-byte page: seal \(String(format: "%.2f", probe.seal)) µs, open \(String(format: "%.2f", probe.open)) µs (swift-crypto)"
        if let sha = opensslMicros(["sha512"]), let enc = opensslMicros(["-evp", "aes-256-cbc"]), let dec = opensslMicros(["-evp", "aes-256-cbc", "-decrypt"]) {
            pageLine += String(format: "; the same primitives in OpenSSL (SQLCipher's provider): seal %.2f µs, open %.2f µs", sha + enc, sha + dec)
            summary.append(String(format: "page_open_us=%.2f openssl_page_open_us=%.2f", probe.open, sha + dec))
        }
        print(pageLine)
        print("open a class-managed database (median of 50): \(String(format: "%.2f", openMillis)) ms (target ≤ 5 ms)")
        if let peer { print("peer: SQLCipher \(peer.version) via Python sqlcipher3; ours: system SQLite \(String(cString: sqlite3_libversion()))") }
        summary.append("open_ms=\(String(format: "%.2f", openMillis))")
        print("summary: " + summary.joined(separator: " "))
    }

    /// Microseconds `openssl speed` takes for 4096 bytes of `algorithm`.
    func opensslMicros(_ algorithm: [String]) -> Double? {
        guard let result = runTool("openssl", ["speed", "-bytes", "4096", "-seconds", "1", "-mr"] + algorithm) else { return nil }
        for line in result.output.split(separator: "\n") where line.hasPrefix("+F:") {
            if let bytesPerSecond = line.split(separator: ":").last.flatMap({ Double($0) }), bytesPerSecond > 0 {
                return 4096 / bytesPerSecond * 1e6
            }
        }
        return nil
    }

    struct Peer { var version: String; var plain: [String: Double]; var keyed: [String: Double] }

    func runPeer(_ python: String, _ script: String, _ dir: String, _ groups: [Group]) throws -> Peer? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script, dir, Self.rawKey]
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        do { try process.run() } catch {
            print("peer unavailable (\(python)): \(error)")
            return nil
        }
        input.fileHandleForWriting.write(try JSONEncoder().encode(groups))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0,
              let json = try JSONSerialization.jsonObject(with: data) as? [String: Any],
              let plain = json["plain"] as? [String: Double], let keyed = json["keyed"] as? [String: Double] else {
            print("peer failed (exit \(process.terminationStatus)); is sqlcipher3-binary installed in \(python)?")
            return nil
        }
        return Peer(version: json["version"] as? String ?? "?", plain: plain, keyed: keyed)
    }

    /// Median time to open an existing class-managed database and read one row, device unlocked.
    func classManagedOpenTime(_ dir: String) async throws -> Double {
        let root = dir + "/root"
        let keybag = try await Keybag.create(root: root, passcode: "1234", kdf: .insecureFastForTesting)
        let url = URL(fileURLWithPath: dir + "/managed.db")
        let first = try await ProtectedDatabase.open(at: url, keybag: keybag, protection: .complete, mode: .queue)
        try await first.write { db in try db.execute(sql: "CREATE TABLE t(x); INSERT INTO t VALUES (1)") }
        try await first.close()
        var samples: [Double] = []
        for _ in 0..<50 {
            let start = ContinuousClock.now
            let db = try await ProtectedDatabase.open(at: url, keybag: keybag, mode: .queue)
            _ = try await db.read { try Int.fetchOne($0, sql: "SELECT x FROM t") }
            let elapsed = ContinuousClock.now - start
            samples.append((Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18) * 1000)
            try await db.close()
        }
        return percentile(samples, 50)
    }
}

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

func printColumns(_ lines: [[String]]) {
    var widths = [Int](repeating: 0, count: lines[0].count)
    for line in lines { for (i, cell) in line.enumerated() { widths[i] = max(widths[i], cell.count) } }
    for line in lines {
        print(line.enumerated().map { i, cell in
            i == 0 ? cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
                : String(repeating: " ", count: widths[i] - cell.count) + cell
        }.joined(separator: "  "))
    }
}
