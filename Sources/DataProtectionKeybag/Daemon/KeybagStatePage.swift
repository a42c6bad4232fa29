import DataProtectionSystem
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The page keybagd publishes next to its socket (`keybagd-<hash>.state`, 4096 bytes, 0600):
/// which classes are available and each class's key generation, so clients check them without
/// a round trip — the way the vDSO lets a process read the time without a system call. It holds
/// no key material. Layout in docs/FORMAT.md §8.1.
///
/// The daemon holds an exclusive `flock` on the file while it lives; a client that can take a
/// shared lock knows the daemon is gone and stops trusting the page. A restarted daemon
/// rewrites the same file (same inode), with a new instance number, so mappings stay valid.
/// `@unchecked Sendable`: the mapping never moves, and every word in it is read and written with acquire and
/// release atomics (`SystemCall.loadAcquire`, `storeRelease`).
package final class KeybagStatePage: @unchecked Sendable {
    static let size = 4096
    /// `\x89DPKS\r\n\x1a`, as a little-endian word.
    static let magic: UInt64 = 0x1A0A_0D53_4B50_4489
    static let version: UInt64 = 1
    private enum Word: Int {
        case magic = 0, version, instance, available, generationA, generationB, generationC, generationD, locked
    }

    private let fd: Int32
    private let words: UnsafeMutablePointer<UInt64>

    private init(fd: Int32, words: UnsafeMutablePointer<UInt64>) {
        self.fd = fd
        self.words = words
    }

    deinit {
        munmap(words, Self.size)
        close(fd)
    }

    /// The page's path for a daemon socket path (`….sock` → `….state`).
    package static func path(forSocket socketPath: String) -> String {
        (socketPath.hasSuffix(".sock") ? String(socketPath.dropLast(5)) : socketPath) + ".state"
    }

    private func load(_ word: Word) -> UInt64 { SystemCall.loadAcquire(words + word.rawValue) }
    private func store(_ word: Word, _ value: UInt64) { SystemCall.storeRelease(words + word.rawValue, value) }

    private static func generationWord(_ cls: ProtectionClass) -> Word {
        switch cls {
        case .complete: .generationA
        case .completeUnlessOpen: .generationB
        case .completeUntilFirstUserAuthentication: .generationC
        case .noProtection: .generationD
        }
    }

    private static func bit(_ cls: ProtectionClass) -> UInt64 {
        switch cls {
        case .complete: 1
        case .completeUnlessOpen: 2
        case .completeUntilFirstUserAuthentication: 4
        case .noProtection: 8
        }
    }

    // MARK: Daemon side

    /// Creates (or takes over) the page for a daemon: locks it exclusively for the daemon's
    /// life, and starts a new instance in which no class key was discarded yet, only
    /// `available` classes can be opened, and the device is `locked` or not.
    package static func publish(
        socketPath: String, available: [ProtectionClass], locked: Bool
    ) throws -> KeybagStatePage {
        let path = path(forSocket: socketPath)
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw KeybagError.daemon("cannot create \(path): \(String(cString: strerror(errno)))") }
        // Clients take a shared lock for an instant to test liveness: retry briefly.
        var locked = false
        for _ in 0..<200 {
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { locked = true; break }
            usleep(5_000)
        }
        guard locked, fchmod(fd, 0o600) == 0, ftruncate(fd, off_t(size)) == 0,
            let raw = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), raw != MAP_FAILED
        else {
            let why = String(cString: strerror(errno))
            close(fd)
            throw KeybagError.daemon("cannot publish \(path): \(why)")
        }
        let page = KeybagStatePage(fd: fd, words: raw.bindMemory(to: UInt64.self, capacity: size / 8))
        page.store(.magic, 0)   // invalid while being rewritten
        page.store(.version, version)
        page.store(.instance, UInt64.random(in: 1...UInt64.max))
        for cls in ProtectionClass.allCases { page.store(generationWord(cls), 0) }
        page.store(.available, available.reduce(0) { $0 | bit($1) })
        page.store(.locked, locked ? 1 : 0)
        page.store(.magic, magic)
        return page
    }

    /// A class key was discarded: its generation grows and it is no longer available.
    /// Called before the daemon answers any other request.
    package func publishDiscard(_ cls: ProtectionClass) {
        store(.available, load(.available) & ~Self.bit(cls))
        store(Self.generationWord(cls), load(Self.generationWord(cls)) &+ 1)
    }

    /// Which classes can be opened now (after an unlock).
    package func publishAvailable(_ classes: [ProtectionClass]) {
        store(.available, classes.reduce(0) { $0 | Self.bit($1) })
        store(.locked, 0)
    }

    /// The device locked: until the next unlock, clients ask the daemon itself about classes
    /// A and B, whose keys go when the grace period ends (the daemon decides that moment).
    package func publishLocked() {
        store(.locked, 1)
    }

    // MARK: Client side

    /// Maps the page of the daemon on `socketPath` read-only; `nil` when there is none (an
    /// older daemon) or it is not a valid page.
    package static func attach(socketPath: String) -> KeybagStatePage? {
        let fd = open(path(forSocket: socketPath), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_uid == getuid(), info.st_size == off_t(size),
            let raw = mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0), raw != MAP_FAILED
        else {
            close(fd)
            return nil
        }
        let page = KeybagStatePage(
            fd: fd, words: UnsafeMutableRawPointer(raw).bindMemory(to: UInt64.self, capacity: size / 8))
        guard page.load(.magic) == magic, page.load(.version) == version else { return nil }
        return page
    }

    /// A consistent reading of the page, or `nil` when its daemon is gone (or the page is
    /// being rewritten): then only the daemon itself can answer.
    package struct Reading: Equatable {
        package let instance: UInt64
        let available: UInt64
        /// Locked (in or past the grace period) or before first unlock.
        package let isLocked: Bool
        let generations: (UInt64, UInt64, UInt64, UInt64)

        package func isAvailable(_ cls: ProtectionClass) -> Bool { available & KeybagStatePage.bit(cls) != 0 }
        package func generation(_ cls: ProtectionClass) -> UInt64 {
            switch cls {
            case .complete: generations.0
            case .completeUnlessOpen: generations.1
            case .completeUntilFirstUserAuthentication: generations.2
            case .noProtection: generations.3
            }
        }
        package static func == (a: Reading, b: Reading) -> Bool {
            a.instance == b.instance && a.available == b.available && a.generations == b.generations
                && a.isLocked == b.isLocked
        }
    }

    package func read() -> Reading? {
        guard load(.magic) == Self.magic else { return nil }
        let reading = Reading(
            instance: load(.instance), available: load(.available), isLocked: load(.locked) != 0,
            generations: (load(.generationA), load(.generationB), load(.generationC), load(.generationD)))
        // The daemon holds an exclusive lock while it lives: a shared lock we can take means it is gone.
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return nil
        }
        return reading
    }
}
