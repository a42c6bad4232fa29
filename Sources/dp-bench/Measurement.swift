import DataProtection
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Wall time of `body`, in seconds.
func seconds(_ body: () async throws -> Void) async rethrows -> Double {
    let clock = ContinuousClock()
    let elapsed = try await clock.measure { try await body() }
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

/// The `p`-th percentile (0…100) of `values`.
func percentile(_ values: [Double], _ p: Double) -> Double {
    guard !values.isEmpty else { return .nan }
    let sorted = values.sorted()
    let rank = Int((p / 100 * Double(sorted.count - 1)).rounded())
    return sorted[min(max(rank, 0), sorted.count - 1)]
}

/// One row of a benchmark table: our figure beside the peer's.
struct Row {
    var metric: String
    var ours: Double
    var peerName: String
    var peer: Double?
    var unit: String
    /// Whether a larger figure is better (throughput) or a smaller one (latency).
    var higherIsBetter = true

    /// ours / peer for throughput, peer / ours for latency: above 1 means we do better.
    var ratio: Double? {
        guard let peer, peer > 0, ours > 0 else { return nil }
        return higherIsBetter ? ours / peer : peer / ours
    }
}

func printTable(_ rows: [Row]) {
    var lines = [["METRIC", "OURS", "PEER", "PEER FIGURE", "RATIO"]]
    for row in rows {
        lines.append([
            row.metric,
            format(row.ours) + " " + row.unit,
            row.peerName,
            row.peer.map { format($0) + " " + row.unit } ?? "n/a",
            row.ratio.map { String(format: "%.2f×", $0) } ?? "n/a",
        ])
    }
    var widths = [Int](repeating: 0, count: 5)
    for line in lines { for (i, cell) in line.enumerated() { widths[i] = max(widths[i], cell.count) } }
    for line in lines {
        print(
            line.enumerated().map { i, cell in
                i == 0 || i == 2
                    ? cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[i] - cell.count) + cell
            }.joined(separator: "  "))
    }
}

func format(_ value: Double) -> String {
    if value >= 100 { return String(format: "%.0f", value) }
    if value >= 10 { return String(format: "%.1f", value) }
    return String(format: "%.2f", value)
}

/// Runs a command with a clean signal state; returns its wall time in seconds and its standard
/// output, or nil when it cannot start or fails.
///
/// Spawned with `posix_spawnp` and an empty signal mask: threads of a Swift process block
/// signals, and a child inheriting that mask never sees `SIGALRM` — `openssl speed` would then
/// run forever.
@discardableResult
func runTool(
    _ executable: String, _ arguments: [String], discardOutput: Bool = false
) -> (seconds: Double, output: String)? {
    var pipe: [Int32] = [0, 0]
    guard Glibc.pipe(&pipe) == 0 else { return nil }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if discardOutput {
        // Nothing of the pipe in the child: a daemon it starts (gocryptfs) must not hold it open.
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addclose(&actions, pipe[1])
    } else {
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 1)
    }
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addclose(&actions, pipe[0])
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var empty = sigset_t(), all = sigset_t()
    sigemptyset(&empty)
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attributes, &empty)
    posix_spawnattr_setsigdefault(&attributes, &all)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    let start = ContinuousClock.now
    let spawned = posix_spawnp(&pid, executable, &actions, &attributes, argv, environ)
    close(pipe[1])
    guard spawned == 0 else { close(pipe[0]); return nil }
    var output = Data()
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = read(pipe[0], &buffer, buffer.count)
        if n <= 0 { break }
        output.append(contentsOf: buffer[0..<n])
    }
    close(pipe[0])
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    let elapsed = ContinuousClock.now - start
    // Exited normally with status 0.
    guard status & 0x7f == 0, (status >> 8) & 0xff == 0 else { return nil }
    return (
        Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18,
        String(decoding: output, as: UTF8.self)
    )
}

/// Whether a command is on PATH.
func toolExists(_ name: String) -> Bool {
    runTool("sh", ["-c", "command -v \(name)"]) != nil
}

/// Fills `buffer` with random bytes from `/dev/urandom` in large reads (one `getrandom` per
/// eight bytes, as `SystemRandomNumberGenerator` does, would dominate the set-up).
func fillRandom(_ buffer: inout [UInt8]) throws {
    let urandom = try FileDescriptor.open("/dev/urandom", .readOnly)
    defer { try? urandom.close() }
    var done = 0
    while done < buffer.count {
        done += try buffer.withUnsafeMutableBytes {
            try urandom.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[done...]))
        }
    }
}

/// Reads a protected file handle front to back in 1 MiB reads, then closes it.
func readAll(_ handle: ProtectedFileHandle) async throws {
    var offset: Int64 = 0
    while true {
        let chunk = try await handle.read(at: offset, count: 1 << 20)
        if chunk.isEmpty { break }
        offset += Int64(chunk.count)
    }
    try await handle.close()
}
