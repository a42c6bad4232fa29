import ArgumentParser
import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionSQLite
import Foundation
import GRDB
import GRDBSQLite

/// `dp-bench sqlite`: our encrypted SQLite beside SQLCipher 4's, in absolute time, same SQL.
///
/// The same workloads run on plain SQLite and on our encrypted database (this binary, raw key),
/// and on SQLCipher 4 with a raw key (Python `sqlcipher3-binary`, whose SQL runs in C), with the
/// same page size, page cache and journal mode set explicitly on every side. Each side runs
/// `--runs` times on fresh databases, alternating; the table shows each workload's median.
/// Plain SQLite is context (what encryption costs), not the target: the target is ours ≤
/// SQLCipher's time on every workload.
struct SQLiteBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sqlite",
        abstract: "Encrypted SQLite vs SQLCipher 4 on six workloads.",
        usage: "dp-bench sqlite [<options>]",
        discussion:
            "Encrypted SQLite: ours beside SQLCipher 4 on six workloads (absolute times, median of runs), plain SQLite as context."
    )

    @Option(help: "Rows inserted (in transactions of 10,000).")
    var rows = 1_000_000

    @Option(help: "Point selects by primary key.")
    var selects = 100_000

    @Option(help: "Range scans of 100 consecutive keys.")
    var ranges = 10_000

    @Option(help: "Operations of the mixed workload (90 % point reads, 10 % updates, 1,000 per transaction).")
    var mixed = 100_000

    @Option(help: "Runs per side; the table shows each workload's median.")
    var runs = 3

    @Option(help: "Directory for the databases (default: a new one under $TMPDIR).")
    var directory: String?

    @Option(help: "Python with sqlcipher3-binary (default: $DP_PYTHON, else .venv-oracle/bin/python).")
    var python: String?

    static let rawKey = "2DD29CA851E7B56E4697B0E1F08507293D761A05CE4D1B628663F411A8086D99"
    /// The settings every side runs with, set explicitly (they are also both libraries' defaults).
    static let pageSize = 4096
    static let cacheKiB = 2000

    /// A workload: SQL statements run in order, or the mixed loop (`mixed`), which both sides
    /// run the same way with prepared statements: operation i touches key (i × 7919) mod rows + 1,
    /// every tenth is an update, a transaction every `batch` operations.
    struct Group: Codable {
        var name: String
        var statements: [String] = []
        var mixed: Mixed?
    }
    struct Mixed: Codable { var operations: Int; var rows: Int; var batch: Int; var select: String; var update: String }

    var settings: [String] {
        [
            "PRAGMA page_size = \(Self.pageSize)", "PRAGMA cache_size = -\(Self.cacheKiB)",
            "PRAGMA journal_mode = DELETE",
        ]
    }

    func workload() -> [Group] {
        let batch = 10_000
        var inserts: [String] = ["CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, value REAL, payload BLOB)"]
        for b in 0..<(rows + batch - 1) / batch {
            let count = min(batch, rows - b * batch)
            inserts += [
                "BEGIN",
                """
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(count))
                INSERT INTO t(id, name, value, payload)
                SELECT \(b * batch) + i, printf('name-%08d', ((\(b * batch) + i) * 7919) % \(rows)), (\(b * batch) + i) * 0.5, randomblob(64) FROM n
                """,
                "COMMIT",
            ]
        }
        return [
            Group(name: "insert", statements: inserts),
            Group(
                name: "point_select",
                statements: [
                    """
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(selects))
                    SELECT sum((SELECT value FROM t WHERE id = (i * 7919) % \(rows) + 1)) FROM n
                    """
                ]),
            Group(
                name: "range_scan",
                statements: [
                    """
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(ranges))
                    SELECT sum((SELECT sum(value) FROM t WHERE id BETWEEN (i * 7919) % \(rows) AND (i * 7919) % \(rows) + 99)) FROM n
                    """
                ]),
            Group(name: "full_scan", statements: ["SELECT sum(length(name)), sum(value), sum(length(payload)) FROM t"]),
            Group(name: "index_build", statements: ["CREATE INDEX t_name ON t(name)"]),
            Group(
                name: "mixed_90_10",
                mixed: Mixed(
                    operations: mixed, rows: rows, batch: 1_000,
                    select: "SELECT value FROM t WHERE id = ?",
                    update: "UPDATE t SET value = value + 1 WHERE id = ?")),
        ]
    }

    func run() async throws {
        let dir = directory ?? NSTemporaryDirectory() + "dp-bench-sqlite-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if directory == nil { try? FileManager.default.removeItem(atPath: dir) } }
        let groups = workload()
        print(
            "dp-bench sqlite: \(rows) rows, \(selects) point selects, \(ranges) range scans, \(mixed) mixed operations; "
                + "page size \(Self.pageSize), page cache \(Self.cacheKiB) KiB, rollback journal; median of \(runs) runs; databases in \(dir)"
        )

        let interpreter =
            python ?? ProcessInfo.processInfo.environment["DP_PYTHON"]
            ?? packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
        let script = packageRoot.appendingPathComponent("bench/sqlcipher_workload.py").path
        var plainRuns: [[String: Double]] = [], ourRuns: [[String: Double]] = [], peerRuns: [[String: Double]] = []
        var peerVersion: String?
        var databaseBytes = 0
        for run in 0..<runs {
            plainRuns.append(try time(DatabaseQueue(path: dir + "/plain.db"), groups))
            ourRuns.append(
                try time(DatabaseQueue(path: dir + "/ours.db", key: try SQLCipherKey(rawKeyHex: Self.rawKey)), groups))
            databaseBytes = (try? FileManager.default.attributesOfItem(atPath: dir + "/ours.db")[.size] as? Int) ?? 0
            for name in ["plain.db", "ours.db"] { try? FileManager.default.removeItem(atPath: dir + "/" + name) }
            if let peer = try runPeer(interpreter, script, dir, groups) {
                peerRuns.append(peer.keyed)
                peerVersion = peer.version
            }
            print("  run \(run + 1) of \(runs) done")
        }
        func median(_ samples: [[String: Double]], _ name: String) -> Double? {
            let values = samples.compactMap { $0[name] }
            return values.isEmpty ? nil : percentile(values, 50)
        }

        let openMillis = try await classManagedOpenTime(dir)

        var lines = [["WORKLOAD", "PLAIN SQLITE", "OURS", "SQLCIPHER 4", "OURS ÷ SQLCIPHER", "≤ 1.0", "OURS ÷ PLAIN"]]
        var summary: [String] = []
        var worst = 0.0
        for group in groups {
            let p = median(plainRuns, group.name)!, o = median(ourRuns, group.name)!
            var cells = [group.name, String(format: "%.3f s", p), String(format: "%.3f s", o)]
            if let k = median(peerRuns, group.name) {
                cells += [String(format: "%.3f s", k), String(format: "%.2f×", o / k), o / k <= 1.0 ? "yes" : "no"]
                summary.append("\(group.name)_vs_sqlcipher=\(String(format: "%.3f", o / k))")
                worst = max(worst, o / k)
            } else {
                cells += ["n/a", "n/a", "n/a"]
            }
            cells.append(String(format: "%.2f×", o / p))
            lines.append(cells)
        }
        printColumns(lines)
        print("")
        print(
            String(
                format: "database: %.1f MiB, %.0f× the page cache", Double(databaseBytes) / 1_048_576,
                Double(databaseBytes) / Double(Self.cacheKiB * 1024)))
        let probe = try PageCipherProbe.microsecondsPerPage()
        var pageLine =
            "page cipher alone, 4096-byte page: seal \(String(format: "%.2f", probe.seal)) µs, open \(String(format: "%.2f", probe.open)) µs (OpenSSL libcrypto)"
        if let sha = opensslMicros(["sha512"]), let dec = opensslMicros(["-evp", "aes-256-cbc", "-decrypt"]) {
            pageLine += String(format: "; `openssl speed` of the same primitives: open %.2f µs", sha + dec)
            summary.append(String(format: "page_open_us=%.2f openssl_page_open_us=%.2f", probe.open, sha + dec))
        }
        print(pageLine)
        print("open a class-managed database (median of 50): \(String(format: "%.2f", openMillis)) ms (target ≤ 5 ms)")
        if let peerVersion {
            print(
                "peer: SQLCipher \(peerVersion) via Python sqlcipher3; ours: system SQLite \(String(cString: sqlite3_libversion()))"
            )
        }
        if !peerRuns.isEmpty { summary.insert("worst_vs_sqlcipher=\(String(format: "%.3f", worst))", at: 0) }
        summary.append("open_ms=\(String(format: "%.2f", openMillis))")
        print("summary: " + summary.joined(separator: " "))
    }

    /// Seconds per workload on `writer`, after the common settings.
    func time(_ writer: DatabaseQueue, _ groups: [Group]) throws -> [String: Double] {
        var result: [String: Double] = [:]
        try writer.writeWithoutTransaction { db in
            for sql in settings { _ = try GRDB.Row.fetchAll(db, sql: sql) }
        }
        for group in groups {
            let start = ContinuousClock.now
            try writer.writeWithoutTransaction { db in
                for sql in group.statements { _ = try GRDB.Row.fetchAll(db, sql: sql) }
                if let mixed = group.mixed { try runMixed(mixed, db) }
            }
            let elapsed = ContinuousClock.now - start
            result[group.name] = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        }
        try writer.close()
        return result
    }

    /// The mixed loop, with prepared statements (as the Python peer runs it).
    func runMixed(_ mixed: Mixed, _ db: GRDB.Database) throws {
        let select = try db.makeStatement(sql: mixed.select)
        let update = try db.makeStatement(sql: mixed.update)
        var sum = 0.0
        for i in 0..<mixed.operations {
            if i % mixed.batch == 0 { try db.execute(sql: "BEGIN") }
            let key = (i * 7919) % mixed.rows + 1
            if i % 10 == 9 {
                try update.execute(arguments: [key])
            } else {
                sum += try Double.fetchOne(select, arguments: [key]) ?? 0
            }
            if i % mixed.batch == mixed.batch - 1 || i == mixed.operations - 1 { try db.execute(sql: "COMMIT") }
        }
        precondition(sum > 0)
    }

    /// Microseconds `openssl speed` takes for 4096 bytes of `algorithm`.
    func opensslMicros(_ algorithm: [String]) -> Double? {
        guard let result = runTool("openssl", ["speed", "-bytes", "4096", "-seconds", "1", "-mr"] + algorithm) else {
            return nil
        }
        for line in result.output.split(separator: "\n") where line.hasPrefix("+F:") {
            if let bytesPerSecond = line.split(separator: ":").last.flatMap({ Double($0) }), bytesPerSecond > 0 {
                return 4096 / bytesPerSecond * 1e6
            }
        }
        return nil
    }

    struct Peer { var version: String; var keyed: [String: Double] }

    func runPeer(_ python: String, _ script: String, _ dir: String, _ groups: [Group]) throws -> Peer? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [script, dir, Self.rawKey] + settings
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
            let keyed = json["keyed"] as? [String: Double]
        else {
            print("peer failed (exit \(process.terminationStatus)); is sqlcipher3-binary installed in \(python)?")
            return nil
        }
        return Peer(version: json["version"] as? String ?? "?", keyed: keyed)
    }

    /// Median time to open an existing class-managed database and read one row, device unlocked.
    func classManagedOpenTime(_ dir: String) async throws -> Double {
        let root = dir + "/root"
        let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting)
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

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

func printColumns(_ lines: [[String]]) {
    var widths = [Int](repeating: 0, count: lines[0].count)
    for line in lines { for (i, cell) in line.enumerated() { widths[i] = max(widths[i], cell.count) } }
    for line in lines {
        print(
            line.enumerated().map { i, cell in
                i == 0
                    ? cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[i] - cell.count) + cell
            }.joined(separator: "  "))
    }
}
