import DataProtectionKeybag
import Synchronization

/// What each class allows at this moment, as the mount sees the device's lock state.
final class ClassGate: Sendable {
    enum State: Sendable {
        /// Every call works (as far as the keybag allows opening).
        case available
        /// A lock is being applied: opens and reads are refused, writes still go (the kernel is
        /// writing back dirty pages of the files whose pages are being dropped).
        case draining
        /// Opens, reads and writes are refused.
        case locked
    }
    private let states = Mutex<[ProtectionClass: State]>([:])

    func state(_ cls: ProtectionClass) -> State { states.withLock { $0[cls] ?? .available } }
    func set(_ cls: ProtectionClass, _ state: State) { states.withLock { $0[cls] = state } }
    func reset() { states.withLock { $0.removeAll() } }

    /// Whether a read (or an open) of a file of `cls` may go on.
    func mayRead(_ cls: ProtectionClass?) -> Bool { cls.map { state($0) == .available } ?? true }
    /// Whether a write to a file of `cls` may go on.
    func mayWrite(_ cls: ProtectionClass?) -> Bool { cls.map { state($0) != .locked } ?? true }
}
