import Synchronization

/// Requests the kernel asked to interrupt (`FUSE_INTERRUPT`: their program got a signal) while
/// they run: a long one (a zero fill) stops at its next step and answers `EINTR`.
final class InterruptedRequests: Sendable {
    private let pending = Mutex<Set<UInt64>>([])

    /// Records an interrupt of request `unique`.
    func insert(_ unique: UInt64) {
        pending.withLock { pending in
            if pending.count > 4096 { pending.removeAll() }   // interrupts of requests long answered
            pending.insert(unique)
        }
    }

    /// Whether the kernel asked to interrupt request `unique`.
    func contains(_ unique: UInt64) -> Bool { pending.withLock { !$0.isEmpty && $0.contains(unique) } }

    /// Request `unique` is answered: an interrupt of it is moot.
    func answered(_ unique: UInt64) { pending.withLock { if !$0.isEmpty { $0.remove(unique) } } }
}
