import ArgumentParser
import DataProtection
import DataProtectionKeybag
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `dp-bench daemon`: the cost of keeping the keys in keybagd, beside the embedded keybag.
struct DaemonBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "keybagd: file-key unwrap round trips (p50/p99) and protected-file opens per second, beside the embedded keybag.")

    @Option(help: "Unwrap round trips measured.")
    var unwraps = 20_000

    @Option(help: "Protected files opened (and closed), cycling over 1,000 files.")
    var opens = 20_000

    func run() async throws {
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dp-bench-daemon-\(UUID().uuidString.prefix(8))")
        let runtime = base.appendingPathComponent("run")
        try FileManager.default.createDirectory(at: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: base) }
        let root = base.appendingPathComponent("root").path
        let embedded = try await Keybag.create(root: root, passcode: "1234", kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: embedded)
        var urls: [URL] = []
        for i in 0..<1000 {
            let url = base.appendingPathComponent("f\(i)")
            try await files.write(Data(repeating: UInt8(i & 0xFF), count: 4096), to: url, protection: .completeUntilFirstUserAuthentication)
            urls.append(url)
        }

        // The daemon, a real process, serving the same root.
        let daemonBinary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("keybagd")
        let process = Process()
        process.executableURL = daemonBinary
        process.arguments = ["--root", root]
        process.environment = ProcessInfo.processInfo.environment.merging(["XDG_RUNTIME_DIR": runtime.path]) { $1 }
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer { kill(process.processIdentifier, SIGTERM); process.waitUntilExit() }
        var line = Data()
        while let byte = try out.fileHandleForReading.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) { line += byte }
        let ready = String(decoding: line, as: UTF8.self)
        guard ready.hasPrefix("ready ") else { throw ValidationError("keybagd (\(daemonBinary.path)) did not start: \(ready)") }
        let remote = try Keybag.open(root: root, daemonSocket: String(ready.dropFirst(6)))
        try await remote.unlock(passcode: "1234")
        print("dp-bench daemon: keybagd pid \(process.processIdentifier), \(unwraps) unwraps, \(opens) opens of 4 KiB class C files")

        let (_, wrapped) = try await remote.wrapNewFileKey(for: .completeUntilFirstUserAuthentication)
        func latencies(_ keybag: Keybag) async throws -> [Double] {
            var samples: [Double] = []
            samples.reserveCapacity(unwraps)
            let clock = ContinuousClock()
            for _ in 0..<unwraps {
                let start = clock.now
                _ = try await keybag.unwrapFileKey(wrapped)
                let d = clock.now - start
                samples.append(Double(d.components.seconds) * 1e6 + Double(d.components.attoseconds) / 1e12)
            }
            return samples
        }
        let daemonLatency = try await latencies(remote)
        let embeddedLatency = try await latencies(embedded)

        func opensPerSecond(_ keybag: Keybag) async throws -> Double {
            let manager = ProtectedFileManager(keybag: keybag)
            let elapsed = try await seconds {
                for i in 0..<opens {
                    let handle = try await manager.openHandle(forReadingFrom: urls[i % urls.count])
                    try await handle.close()
                }
            }
            return Double(opens) / elapsed
        }
        let daemonOpens = try await opensPerSecond(remote)
        let embeddedOpens = try await opensPerSecond(embedded)

        let rows = [
            Row(metric: "file-key unwrap round trip p50", ours: percentile(daemonLatency, 50), peerName: "embedded keybag",
                peer: percentile(embeddedLatency, 50), unit: "µs", higherIsBetter: false),
            Row(metric: "file-key unwrap round trip p99", ours: percentile(daemonLatency, 99), peerName: "embedded keybag",
                peer: percentile(embeddedLatency, 99), unit: "µs", higherIsBetter: false),
            Row(metric: "protected-file opens", ours: daemonOpens, peerName: "embedded keybag", peer: embeddedOpens, unit: "opens/s"),
        ]
        printTable(rows)
        print("")
        print("targets: p99 ≤ 200 µs (\(format(percentile(daemonLatency, 99))) µs), ≥ 20,000 opens/s (\(format(daemonOpens)))")
        print(String(format: "summary: unwrap_p50_us=%.1f unwrap_p99_us=%.1f embedded_unwrap_p50_us=%.1f opens_per_s=%.0f embedded_opens_per_s=%.0f",
                     percentile(daemonLatency, 50), percentile(daemonLatency, 99), percentile(embeddedLatency, 50), daemonOpens, embeddedOpens))
    }
}
