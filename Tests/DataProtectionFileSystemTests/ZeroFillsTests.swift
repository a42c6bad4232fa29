@testable import DataProtectionFileSystem
import SystemPackage
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Zero fills under way: their bytes are promised once, and one program may hold only a few
/// serving threads with long ones.
struct ZeroFillsTests {
    @Test func fillsUnderWayCountAgainstTheFreeSpace() throws {
        let fills = ZeroFills()
        let first = try fills.begin(bytes: 600, free: 1000, long: false, program: 1)
        #expect(throws: Errno.self, "the room the first one takes is not promised again") {
            _ = try fills.begin(bytes: 600, free: 1000, long: false, program: 2)
        }
        fills.end(first)
        fills.end(try fills.begin(bytes: 600, free: 1000, long: false, program: 2))
    }

    @Test func oneProgramHasOnlyAFewFillsAtOnce() throws {
        let fills = ZeroFills()
        let held = try (0..<ZeroFills.longFillsPerProgram).map { _ in try fills.begin(bytes: 1, free: 1 << 40, long: true, program: 7) }
        do {
            _ = try fills.begin(bytes: 1, free: 1 << 40, long: true, program: 7)
            Issue.record("a fifth long fill of one program")
        } catch {
            #expect(error.rawValue == EAGAIN)
        }
        var short = try (0..<(ZeroFills.fillsPerProgram - ZeroFills.longFillsPerProgram)).map { _ in
            try fills.begin(bytes: 1, free: 1 << 40, long: false, program: 7)   // short ones still go, up to the limit
        }
        #expect(throws: Errno.self) { _ = try fills.begin(bytes: 1, free: 1 << 40, long: false, program: 7) }
        fills.end(short.removeLast())
        fills.end(try fills.begin(bytes: 1, free: 1 << 40, long: true, program: 8))    // and another program's
        fills.end(held[0])
        fills.end(try fills.begin(bytes: 1, free: 1 << 40, long: true, program: 7))
    }
}
