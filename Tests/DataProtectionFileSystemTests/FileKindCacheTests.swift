@testable import DataProtectionFileSystem
import DataProtection
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What the server remembers of closed files: only while their length and change time stay the
/// same, and never more than two generations of entries.
struct FileKindCacheTests {
    func status(inode: UInt64, size: Int64, changed: Int) -> stat {
        var st = stat()
        st.st_dev = 7
        st.st_ino = __ino_t(inode)
        st.st_size = __off_t(size)
        st.st_ctim = timespec(tv_sec: changed, tv_nsec: 5)
        return st
    }

    @Test func anEntryHoldsOnlyAtTheLengthAndTimeItWasReadAt() {
        let cache = FileKindCache()
        let protected = ProtectedFilePrefix.Kind.protected(ProtectedFilePrefix(protectionClass: .complete, version: 2, segmentSizeLog2: 12))
        cache.record(protected, for: status(inode: 1, size: 100, changed: 10))
        #expect(cache.kind(of: status(inode: 1, size: 100, changed: 10)) == protected)
        #expect(cache.kind(of: status(inode: 1, size: 101, changed: 10)) == nil)   // written
        #expect(cache.kind(of: status(inode: 1, size: 100, changed: 11)) == nil)   // rewritten, same length
        #expect(cache.kind(of: status(inode: 2, size: 100, changed: 10)) == nil)   // another file
        cache.forget(InodeIdentity(device: 7, inode: 1))
        #expect(cache.kind(of: status(inode: 1, size: 100, changed: 10)) == nil)
    }

    @Test func itIsBoundedAndKeepsWhatIsUsed() {
        let cache = FileKindCache(capacity: 4)
        for inode in 1...4 { cache.record(.plain, for: status(inode: UInt64(inode), size: 1, changed: 1)) }
        cache.record(.damaged, for: status(inode: 5, size: 1, changed: 1))   // 1–4 become the previous generation
        #expect(cache.kind(of: status(inode: 1, size: 1, changed: 1)) == .plain)   // used: back in the current one
        // 5, 1, 6, 7 fill the current generation; at 8 it becomes the previous one, and 2–4 go.
        for inode in 6...8 { cache.record(.plain, for: status(inode: UInt64(inode), size: 1, changed: 1)) }
        #expect(cache.kind(of: status(inode: 2, size: 1, changed: 1)) == nil)
        #expect(cache.kind(of: status(inode: 1, size: 1, changed: 1)) == .plain)
        #expect(cache.kind(of: status(inode: 5, size: 1, changed: 1)) == .damaged)
    }
}
