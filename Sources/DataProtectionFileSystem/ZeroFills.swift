import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Zero fills under way — a write far past a protected file's end, a truncation or `fallocate`
/// up: sealed zero segments, not holes. Their bytes count against the disk's free space until
/// they end, so that fills running at once never promise the same room twice; and a program
/// (a PID namespace: an app) may have only ``longFillsPerProgram`` long ones at a time, each
/// holding a serving thread, so that no app's fills leave the others unserved.
final class ZeroFills: Sendable {
    /// Long fills (beyond ``ProtectedFileSystem/zeroFillStep``) one program may have at once;
    /// the next gets `EAGAIN`.
    static let longFillsPerProgram = 4

    private struct State {
        var bytes: Int64 = 0
        var long: [UInt64: Int] = [:]
    }
    private let state = Mutex(State())

    /// A fill under way: what ``end(_:)`` gives back.
    struct Fill {
        let bytes: Int64
        let program: UInt64?
    }

    /// Counts a fill needing `bytes` of a disk with `free` bytes available (`ENOSPC` if fills
    /// under way leave less), long or not, by `program` (`EAGAIN` past its long fills).
    func begin(bytes: Int64, free: Int64, long: Bool, program: UInt64) throws(FUSEErrno) -> Fill {
        try state.withLock { state throws(FUSEErrno) -> Fill in
            guard bytes <= free - state.bytes else { throw FUSEErrno(ENOSPC) }
            if long {
                guard state.long[program, default: 0] < Self.longFillsPerProgram else { throw FUSEErrno(EAGAIN) }
                state.long[program, default: 0] += 1
            }
            state.bytes += bytes
            return Fill(bytes: bytes, program: long ? program : nil)
        }
    }

    func end(_ fill: Fill) {
        state.withLock { state in
            state.bytes -= fill.bytes
            if let program = fill.program, let count = state.long[program] { state.long[program] = count > 1 ? count - 1 : nil }
        }
    }
}
