import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Decoded records kept while their file is the same file: keyed by path, valid while `lstat`
/// reports the same device, inode, size and modification time. Every record the broker keeps
/// is replaced atomically (a new inode) or removed, so a revoked grant or a changed container is
/// seen at the next look — a `stat` instead of a property-list decode on every access.
final class RecordCache<Value: Sendable>: Sendable {
    private struct Entry { var identity: [Int]; var value: Value }
    private let entries = Mutex<[String: Entry]>([:])
    private let capacity: Int

    init(capacity: Int = 4096) { self.capacity = capacity }

    /// The record at `path`, decoded by `decode` unless the cached one is still the file's.
    func value(at path: String, decode: () -> Value?) -> Value? {
        guard let st = POSIXFile.linkStatus(path) else {
            entries.withLock { _ = $0.removeValue(forKey: path) }
            return nil
        }
        let identity = [
            Int(st.st_dev), Int(st.st_ino), Int(st.st_size), Int(st.st_mtim.tv_sec), Int(st.st_mtim.tv_nsec),
        ]
        if let hit = entries.withLock({ $0[path] }), hit.identity == identity { return hit.value }
        guard let value = decode() else { return nil }
        entries.withLock { cache in
            if cache.count >= capacity { cache.removeAll() }
            cache[path] = Entry(identity: identity, value: value)
        }
        return value
    }
}
