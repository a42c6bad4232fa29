import Foundation
import Synchronization

/// A size as people read it: `512 B`, `76.3 MiB` (binary units, one decimal), as `ls -h` and
/// restic print them.
/// `1 file`, `2 files`: a count with its noun in the right number.
func counted(_ n: Int, _ singular: String, _ plural: String? = nil) -> String {
    "\(n) " + (n == 1 ? singular : plural ?? singular + "s")
}

func humanSize(_ bytes: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    var value = Double(bytes)
    var unit = 0
    while abs(value) >= 1024, unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
}

/// A progress bar on a terminal (standard error), nothing elsewhere:
///
///     [#####...........]  25%  120/387 files  76.3 MiB/305.2 MiB  7.6 MiB/s  ETA 0:30
///
/// The share is of bytes when the work has a byte total, else of items. Redrawn at most ten
/// times a second; `finish()` clears the line.
final class ProgressLine: Sendable {
    let enabled: Bool
    let unit: String
    private let started = ContinuousClock.now
    /// When the bar was last drawn, and whether `finish()` cleared it for good.
    private let state = Mutex<(lastDrawn: ContinuousClock.Instant?, finished: Bool)>((nil, false))

    init(enabled: Bool, unit: String = "items") {
        self.enabled = enabled
        self.unit = unit
    }

    func update(done: Int, total: Int, bytes: Int64? = nil, totalBytes: Int64? = nil) {
        guard enabled else { return }
        let now = ContinuousClock.now
        let due = state.withLock { state -> Bool in
            if state.finished { return false }
            if let last = state.lastDrawn, now - last < .milliseconds(100) { return false }
            state.lastDrawn = now
            return true
        }
        guard due else { return }
        FileHandle.standardError.write(
            Data(
                "\r\(Self.line(done: done, total: total, bytes: bytes, totalBytes: totalBytes, unit: unit, elapsed: now - started))\u{1B}[K"
                    .utf8))
    }

    func finish() {
        guard enabled,
            state.withLock({
                let was = $0.finished; $0.finished = true; return !was
            })
        else { return }
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
    }

    /// The text of the bar (no terminal codes), for a given elapsed time.
    static func line(
        done: Int, total: Int, bytes: Int64?, totalBytes: Int64?, unit: String, elapsed: Duration
    ) -> String {
        let done = max(0, done), bytes = bytes.map { max(0, $0) }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        guard total > 0 else { return "\(done) \(unit)" + (bytes.map { "  " + humanSize($0) } ?? "") }
        let fraction: Double
        if let bytes, let totalBytes, totalBytes > 0 {
            fraction = min(1, Double(bytes) / Double(totalBytes))
        } else {
            fraction = min(1, Double(done) / Double(total))
        }
        var text = String(format: " %3d%%", Int(fraction * 100)) + "  \(done)/\(total) \(unit)"
        if let bytes, let totalBytes, totalBytes > 0 {
            text += "  \(humanSize(bytes))/\(humanSize(totalBytes))"
            if seconds >= 1 { text += "  \(humanSize(Int64(Double(bytes) / seconds)))/s" }
        }
        if seconds >= 1, fraction > 0.01, fraction < 1 {
            let remaining = Int((seconds / fraction - seconds).rounded())
            text +=
                remaining >= 3600
                ? String(format: "  ETA %d:%02d:%02d", remaining / 3600, remaining / 60 % 60, remaining % 60)
                : String(format: "  ETA %d:%02d", remaining / 60, remaining % 60)
        }
        // The bar takes what is left of 79 columns (a line as wide as the terminal would wrap).
        let width = min(30, 79 - 2 - text.count)
        if width >= 5 {
            let filled = Int(fraction * Double(width))
            text =
                "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "]" + text
        } else {
            text = String(text.drop(while: { $0 == " " }))
        }
        return text
    }
}
