import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Zero fills under way — a write far past a protected file's end, a truncation or `fallocate`
/// up: sealed zero segments, not holes. Their bytes count against the disk's free space until
/// they end, so that fills running at once never promise the same room twice; and a program
/// (a PID namespace: an app) may have only ``fillsPerProgram`` at a time, ``longFillsPerProgram``
/// of them long, each holding a serving thread, so that no app's fills leave the others unserved.
final class ZeroFills: Sendable {
    /// Fills one program may have at once; the next gets `EAGAIN`.
    static let fillsPerProgram = 8
    /// Long fills (beyond ``ProtectedFileSystem/zeroFillStep``) among them.
    static let longFillsPerProgram = 4

    private struct State {
        var bytes: Int64 = 0
        var all: [UInt64: Int] = [:]
        var long: [UInt64: Int] = [:]
    }
    private let state = Mutex(State())

    /// A fill under way: what ``end(_:)`` gives back.
    struct Fill {
        let bytes: Int64
        let program: UInt64
        let long: Bool
    }

    /// Counts a fill needing `bytes` of a disk with `free` bytes available (`ENOSPC` if fills
    /// under way leave less), long or not, by `program` (`EAGAIN` past its long fills).
    func begin(bytes: Int64, free: Int64, long: Bool, program: UInt64) throws(Errno) -> Fill {
        try state.withLock { state throws(Errno) -> Fill in
            guard bytes <= free - state.bytes else { throw Errno(rawValue: ENOSPC) }
            guard state.all[program, default: 0] < Self.fillsPerProgram,
                !long || state.long[program, default: 0] < Self.longFillsPerProgram
            else { throw Errno(rawValue: EAGAIN) }
            state.all[program, default: 0] += 1
            if long { state.long[program, default: 0] += 1 }
            state.bytes += bytes
            return Fill(bytes: bytes, program: program, long: long)
        }
    }

    func end(_ fill: Fill) {
        state.withLock { state in
            state.bytes -= fill.bytes
            Self.decrement(&state.all, fill.program)
            if fill.long { Self.decrement(&state.long, fill.program) }
        }
    }

    private static func decrement(_ counts: inout [UInt64: Int], _ program: UInt64) {
        if let count = counts[program] { counts[program] = count > 1 ? count - 1 : nil }
    }
}
