import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The classes of new files: a directory's default, never below its floor; SQLite's files at
/// least their database's class, a WAL index at most class C.
extension ProtectedFileSystem {
    /// The default class of a new file in `directory`: the nearest directory default, from
    /// `directory` up to the served directory's root, then what the root inherits — never below
    /// the directory's floor (``FileNode/floor``, fixed when the node was made: no walk decides it).
    func defaultClass(in directory: FileNode) -> ProtectionClass {
        max(nearestDefault(from: directory) ?? rootDefault, directory.floor ?? .noProtection)
    }

    /// The nearest directory default from `directory` up (`nil` when none, or when the way up
    /// is lost: the floor still holds).
    func nearestDefault(from directory: FileNode) -> ProtectionClass? {
        var node = directory
        for _ in 0..<4096 {
            if let own = directoryDefault(of: node) { return own }
            if node.id == nodes.root.id { return nil }
            guard let parent = try? nodes.node(node.parent.withLock({ $0 })) else { return nil }
            node = parent
        }
        return nil
    }

    /// The class of a new file `name` in `directory`: the directory's default — and, for SQLite's
    /// files beside a database (`NAME-wal`, `NAME-shm`, `NAME-journal`), at least the database's
    /// class, as Apple's SQLite gives a database's journals its protection: a class-A database's
    /// WAL is never written at the directory's weaker class, whichever program opens it.
    ///
    /// Except a database's WAL index (`NAME-shm` beside a protected file `NAME`): never class A,
    /// at most class C, under any default or floor (``ProtectionClass/walIndexClass``); it cannot be renamed or
    /// linked to another name below a floor (``refuseBelowFloor(_:named:in:)``).
    func newFileClass(named name: [UInt8], in directory: FileNode) -> ProtectionClass {
        let inherited = defaultClass(in: directory)
        for suffix in Self.databaseSidecarSuffixes
        where name.count > suffix.count && name.suffix(suffix.count).elementsEqual(suffix) {
            let database = Array(name.dropLast(suffix.count))
            var st = stat()
            guard withName(database, { fstatat(directory.fd, $0, &st, AT_SYMLINK_NOFOLLOW) }) == 0,
                st.st_mode & S_IFMT == S_IFREG
            else { break }
            guard case .protected(let prefix)? = kinds.kind(of: st) ?? readKind(named: database, in: directory, st)
            else { break }
            let cls = max(inherited, prefix.protectionClass)
            return suffix == Self.walIndexSuffix ? cls.walIndexClass : cls
        }
        return inherited
    }

    static let walIndexSuffix = Array("-shm".utf8)
    static let databaseSidecarSuffixes = [Array("-wal".utf8), walIndexSuffix, Array("-journal".utf8)]

    /// Whether `name` is a WAL index's (`NAME-shm`, `NAME` not empty).
    static func isWALIndexName(_ name: [UInt8]) -> Bool {
        name.count > walIndexSuffix.count && name.suffix(walIndexSuffix.count).elementsEqual(walIndexSuffix)
    }

    /// What a WAL index starts with: its header's version, 3007000, in the machine's byte order
    /// (SQLite's `wal.c`, `WALINDEX_MAX_VERSION`).
    static let walIndexVersion = withUnsafeBytes(of: UInt32(3_007_000)) { Array($0) }

    /// A WAL index made class A (by an earlier version, or a class change) is given class C when
    /// SQLite opens it for writing, before it maps it (``ProtectionClass/walIndexClass``): its key is at hand
    /// then. Only what is one: a single link, named `NAME-shm` beside a protected regular file
    /// `NAME`, whose content is a WAL index's (its version first, or as much of it as SQLite
    /// left when it cut the file short, or nothing) — so no other file is lowered by being named
    /// or linked so.
    func lowerWALIndexClass(_ node: FileNode, writable: Bool) {
        guard writable, node.open.withLock({ $0.protectionClass }) == .complete else { return }
        let name = node.lastSeen.withLock { $0.name }
        guard Self.isWALIndexName(name), let st = try? node.status(), st.st_nlink == 1,
            let parent = try? nodes.node(node.parent.withLock { $0 })
        else { return }
        let database = Array(name.dropLast(Self.walIndexSuffix.count))
        var beside = stat()
        guard withName(database, { fstatat(parent.fd, $0, &beside, AT_SYMLINK_NOFOLLOW) }) == 0,
            beside.st_mode & S_IFMT == S_IFREG,
            case .protected? = kinds.kind(of: beside) ?? readKind(named: database, in: parent, beside)
        else { return }
        guard let engine = try? engine(of: node, writing: false),
            let head = try? node.open.withLock({ _ in try engine.read(at: 0, count: 4) }),
            Self.walIndexVersion.starts(with: Array(head))
        else { return }
        do {
            try rewrap(node, to: ProtectionClass.complete.walIndexClass)
            logger.info(
                "the WAL index \(describe(node)) is now class C (class A's lock would revoke it under the program mapping it)"
            )
        } catch {
            logger.notice("the WAL index \(describe(node)) stays class A: \(error.rawValue)")
        }
    }

    /// Refuses (`EPERM`) giving a protected file below `directory`'s floor a name there that is
    /// not a WAL index's: the one kind of file allowed below a floor stays one (FORMAT.md §14).
    func refuseBelowFloor(_ cls: ProtectionClass?, named name: [UInt8], in directory: FileNode) throws(Errno) {
        guard let cls, let floor = directory.floor, cls < floor, !Self.isWALIndexName(name) else { return }
        throw Errno(rawValue: EPERM)
    }

    /// A directory's own default (`user.dataprotection.class`), read once and kept while the
    /// directory's change time stays the same (the attribute may be changed directly in the
    /// served directory).
    func directoryDefault(of node: FileNode) -> ProtectionClass? {
        let changed = (try? node.status())?.st_ctim
        if let cached = node.directoryDefault.withLock({ $0 }), let changed, cached.changed.tv_sec == changed.tv_sec,
            cached.changed.tv_nsec == changed.tv_nsec
        {
            return cached.cls
        }
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = (try? SystemCall.getxattr(node.reopenPath, ProtectedFileSystem.classAttribute, &buffer)) ?? 0
        let cls = n > 0 ? ProtectionClass(name: String(decoding: buffer[0..<n], as: UTF8.self)) : nil
        if let changed { node.directoryDefault.withLock { $0 = (changed, cls) } }
        return cls
    }
}
