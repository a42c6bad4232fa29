@testable import dpctl
import Testing

/// Human sizes and the progress bar's text, with a given elapsed time (no clock is read).
@Suite struct ProgressAndSizeTests {
    @Test func sizesReadAsLsDashHPrintsThem() {
        #expect(humanSize(0) == "0 B")
        #expect(humanSize(1023) == "1023 B")
        #expect(humanSize(1024) == "1.0 KiB")
        #expect(humanSize(80_000_000) == "76.3 MiB")
        #expect(humanSize(5 << 40) == "5.0 TiB")
    }

    @Test func theBarShowsBytesRateAndTimeLeft() {
        let line = ProgressLine.line(done: 120, total: 387, bytes: 80_000_000, totalBytes: 320_000_000, unit: "files", elapsed: .seconds(10))
        #expect(line == "[####............]  25%  120/387 files  76.3 MiB/305.2 MiB  7.6 MiB/s  ETA 0:30", "\(line)")
        #expect(line.count <= 79)
        let long = ProgressLine.line(done: 1, total: 10_000, bytes: 1 << 24, totalBytes: 1 << 30, unit: "files", elapsed: .seconds(60))
        #expect(long.hasSuffix("ETA 1:03:00") && long.count <= 79, "\(long)")   // hours:minutes:seconds
        // Items only (no byte total): the share is of items; no rate or ETA in the first second.
        #expect(ProgressLine.line(done: 5, total: 10, bytes: nil, totalBytes: nil, unit: "items", elapsed: .milliseconds(500))
                == "[###############...............]  50%  5/10 items")
        #expect(ProgressLine.line(done: 7, total: 0, bytes: nil, totalBytes: nil, unit: "items", elapsed: .seconds(3)) == "7 items")
    }
}
