import DataProtection
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A backing inode's identity: its device and inode numbers.
struct InodeIdentity: Hashable, Sendable {
    let device: UInt64, inode: UInt64

    init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    init(_ st: stat) {
        self.init(device: UInt64(st.st_dev), inode: UInt64(st.st_ino))
    }
}

/// What regular files are by their first bytes (protected, with class and segment size; plain;
/// damaged), by backing inode, valid while the file's length and change time stay those they
/// were read at: a lookup or a listing costs one `fstat` per file instead of a read of its header.
/// Entries outlive the kernel's nodes (a listing after the kernel evicted its inodes reads no
/// header again) and are bounded: two generations of at most ``capacity`` entries each; a full
/// current generation becomes the previous one, and the previous one goes.
///
/// Only sizes, listings and the class attribute trust it: opening a file always reads its header.
final class FileKindCache: Sendable {
    struct Entry: Sendable {
        let size: Int64
        let changed: timespec
        let kind: ProtectedFilePrefix.Kind

        func matches(_ st: stat) -> Bool {
            size == Int64(st.st_size) && changed.tv_sec == st.st_ctim.tv_sec && changed.tv_nsec == st.st_ctim.tv_nsec
        }
    }

    private struct Generations {
        var current: [InodeIdentity: Entry] = [:]
        var previous: [InodeIdentity: Entry] = [:]
    }

    /// Entries per generation (about 100 bytes each).
    let capacity: Int
    private let generations = Mutex(Generations())

    init(capacity: Int = 1 << 17) {
        self.capacity = max(1, capacity)
    }

    /// The kind recorded for the file `st` describes, if it was recorded at this length and change time.
    func kind(of st: stat) -> ProtectedFilePrefix.Kind? {
        let identity = InodeIdentity(st)
        return generations.withLock { state -> ProtectedFilePrefix.Kind? in
            if let entry = state.current[identity] { return entry.matches(st) ? entry.kind : nil }
            guard let entry = state.previous.removeValue(forKey: identity), entry.matches(st) else { return nil }
            Self.insert(entry, for: identity, into: &state, capacity: capacity)
            return entry.kind
        }
    }

    /// Records what the file `st` describes is, at its length and change time.
    func record(_ kind: ProtectedFilePrefix.Kind, for st: stat) {
        let entry = Entry(size: Int64(st.st_size), changed: st.st_ctim, kind: kind)
        generations.withLock { Self.insert(entry, for: InodeIdentity(st), into: &$0, capacity: capacity) }
    }

    /// Forgets what a file was (its header changed in a way its length and time may not show).
    func forget(_ identity: InodeIdentity) {
        generations.withLock { state in
            state.current[identity] = nil
            state.previous[identity] = nil
        }
    }

    private static func insert(
        _ entry: Entry, for identity: InodeIdentity, into state: inout Generations, capacity: Int
    ) {
        if state.current[identity] == nil, state.current.count >= capacity {
            state.previous = state.current
            state.current = [:]
        }
        state.current[identity] = entry
    }
}
