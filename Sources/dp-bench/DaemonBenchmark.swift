import ArgumentParser
import DataProtection
@_spi(Testing) import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dp-bench daemon`: the cost of keeping the keys in keybagd, beside the embedded keybag.
struct DaemonBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "keybagd round trips and opens vs the embedded keybag.",
        discussion:
            "keybagd: file-key unwrap round trips (p50/p99) and protected-file opens per second, beside the embedded keybag."
    )

    @Option(help: "Unwrap round trips measured.")
    var unwraps = 20_000

    @Option(help: "Protected files opened (and closed), cycling over 1,000 files.")
    var opens = 20_000

    func run() async throws {
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "dp-bench-daemon-\(UUID().uuidString.prefix(8))")
        let runtime = base.appendingPathComponent("run")
        try FileManager.default.createDirectory(
            at: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: base) }
        let root = base.appendingPathComponent("root").path
        let embedded = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting)
        let files = ProtectedFileManager(keybag: embedded)
        var urls: [URL] = []
        for i in 0..<1000 {
            let url = base.appendingPathComponent("f\(i)")
            try await files.write(
                Data(repeating: UInt8(i & 0xFF), count: 4096), to: url,
                protection: .completeUntilFirstUserAuthentication)
            urls.append(url)
        }

        // The daemon, a real process, serving the same root.
        let daemonBinary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
            .appendingPathComponent("keybagd")
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
        while let byte = try out.fileHandleForReading.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) {
            line += byte
        }
        let ready = String(decoding: line, as: UTF8.self)
        guard ready.hasPrefix("ready ") else {
            throw ValidationError("keybagd (\(daemonBinary.path)) did not start: \(ready)")
        }
        let remote = try Keybag.open(root: root, daemonSocket: String(ready.dropFirst(6)))
        try await remote.unlock(passcode: "123456")
        print(
            "dp-bench daemon: keybagd pid \(process.processIdentifier), \(unwraps) unwraps (class A keys: a round trip each), \(opens) opens of 4 KiB class C files, then of class A files"
        )

        // Class A keys are never cached in a client: each unwrap is a real round trip. Class C
        // keys are cached by the client while the daemon's state page vouches for them.
        let (_, wrappedA) = try await remote.wrapNewFileKey(for: .complete)
        let (_, wrappedC) = try await remote.wrapNewFileKey(for: .completeUntilFirstUserAuthentication)
        func latencies(_ keybag: Keybag, _ wrapped: WrappedFileKey) async throws -> [Double] {
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
        let daemonLatency = try await latencies(remote, wrappedA)
        let embeddedLatency = try await latencies(embedded, wrappedA)
        let cachedLatency = try await latencies(remote, wrappedC)
        var urlsA: [URL] = []
        for i in 0..<200 {
            let url = base.appendingPathComponent("a\(i)")
            try await files.write(Data(repeating: UInt8(i & 0xFF), count: 4096), to: url, protection: .complete)
            urlsA.append(url)
        }

        func opensPerSecond(_ keybag: Keybag, _ urls: [URL]) async throws -> Double {
            let manager = ProtectedFileManager(keybag: keybag)
            let elapsed = try await seconds {
                for i in 0..<opens {
                    let handle = try await manager.openHandle(forReadingFrom: urls[i % urls.count])
                    try await handle.close()
                }
            }
            return Double(opens) / elapsed
        }
        let daemonOpens = try await opensPerSecond(remote, urls)
        let embeddedOpens = try await opensPerSecond(embedded, urls)
        let daemonOpensA = try await opensPerSecond(remote, urlsA)
        let embeddedOpensA = try await opensPerSecond(embedded, urlsA)

        let rows = [
            Row(
                metric: "file-key unwrap round trip p50", ours: percentile(daemonLatency, 50),
                peerName: "embedded keybag",
                peer: percentile(embeddedLatency, 50), unit: "µs", higherIsBetter: false),
            Row(
                metric: "file-key unwrap round trip p99", ours: percentile(daemonLatency, 99),
                peerName: "embedded keybag",
                peer: percentile(embeddedLatency, 99), unit: "µs", higherIsBetter: false),
            Row(
                metric: "protected-file opens (class C)", ours: daemonOpens, peerName: "embedded keybag",
                peer: embeddedOpens, unit: "opens/s"),
            Row(
                metric: "  class C key from the client cache p50", ours: percentile(cachedLatency, 50),
                peerName: "embedded keybag",
                peer: percentile(embeddedLatency, 50), unit: "µs", higherIsBetter: false),
            Row(
                metric: "  protected-file opens (class A, uncached)", ours: daemonOpensA, peerName: "embedded keybag",
                peer: embeddedOpensA,
                unit: "opens/s"),
        ]
        printTable(rows)
        print("")
        print(
            "targets: p99 ≤ 200 µs (\(format(percentile(daemonLatency, 99))) µs), ≥ 20,000 opens/s (\(format(daemonOpens)))"
        )
        print(
            String(
                format:
                    "summary: unwrap_p50_us=%.1f unwrap_p99_us=%.1f embedded_unwrap_p50_us=%.1f opens_per_s=%.0f embedded_opens_per_s=%.0f cached_unwrap_p50_us=%.2f class_a_opens_per_s=%.0f embedded_class_a_opens_per_s=%.0f",
                percentile(daemonLatency, 50), percentile(daemonLatency, 99), percentile(embeddedLatency, 50),
                daemonOpens, embeddedOpens,
                percentile(cachedLatency, 50), daemonOpensA, embeddedOpensA))
    }
}
