import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSQLite
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// One pass over a tree, applying the file rules (DP1xx, DP2xx, DP3xx, DP403, DP504, DP60x)
/// as it goes: one `fstatat` per item and, per non-empty file, one `openat` and a 160-byte
/// `pread` of its header — all relative to open directories.
struct TreeWalk {
    enum Kind: Equatable {
        case tree
        case app(identifier: String)
        case group(identifier: String)
    }

    let root: String
    let kind: Kind
    let options: AuditOptions
    private(set) var findings: [AuditFinding] = []
    private(set) var examined = 0
    /// The container's own default (rule DP202 compares key files with it); `nil` for a tree.
    private var containerClass: ProtectionClass?
    /// Regular files with more than one name: how many of their names were seen in the tree.
    private var linked: [[UInt64]: (links: Int, seen: Int, path: String)] = [:]

    init(root: String, kind: Kind, options: AuditOptions) {
        self.root = root
        self.kind = kind
        self.options = options
    }

    /// What the metadata at `path` says the directory is (a tree when there is none).
    static func kind(of path: String) -> Kind {
        guard let metadata = try? ContainerMetadata.read(container: path) else { return .tree }
        return metadata.kind == .application ? .app(identifier: metadata.identifier) : .group(identifier: metadata.identifier)
    }

    private var isContainer: Bool { kind != .tree }

    mutating func run() throws {
        let fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw AuditError.cannotOpen(root, errno: errno) }
        defer { close(fd) }
        guard let st = POSIXFile.status(root) else { throw AuditError.cannotOpen(root, errno: errno) }
        let inherited = Self.inheritedDefault(above: root)
        let own = DirectoryReader.attribute(fd, DirectoryDefault.attribute).flatMap { ProtectionClass(name: String(decoding: $0, as: UTF8.self)) }
        if isContainer, own == .noProtection {
            let fix: AuditFix = switch kind {
            case .app(let id): .setAppDefault(app: id, .completeUntilFirstUserAuthentication)
            case .group(let id): .setGroupDefault(group: id, .completeUntilFirstUserAuthentication)
            case .tree: .protect(.completeUntilFirstUserAuthentication)
            }
            add(.containerDefaultNone, root, "its default class is None (D)", fix)
        }
        if isContainer { containerClass = own ?? inherited }
        let excludedAbove = Self.excludedAbove(root)
        walkDirectory(fd, status: st, relative: "", defaultClass: own ?? inherited, excluded: excludedAbove, depth: 0)
        for (_, file) in linked where file.seen < file.links {
            add(.linkLeavesContainer, file.path, "a hard link: \(file.links) names, \(file.links - file.seen) of them outside \(isContainer ? "the container" : "the tree")", .removeLink)
        }
    }

    // MARK: - Directories

    private mutating func walkDirectory(_ fd: Int32, status st: stat, relative: String, defaultClass: ProtectionClass, excluded: Bool, depth: Int) {
        examined += 1
        let path = relative.isEmpty ? root : root + "/" + relative
        checkMode(st, path: path)
        let names = DirectoryReader.names(fd)
        let nameSet = Set(names)
        // Backup marks: the xattr and CACHEDIR.TAG go together (rule DP302).
        let marked = DirectoryReader.attribute(fd, BackupExclusionAttribute.attribute).map { $0 == Array("false".utf8) } ?? false
        let tagged = nameSet.contains(BackupExclusionAttribute.cacheDirectoryTagName) && Self.isCacheDirectoryTag(fd)
        if marked && !tagged {
            add(.backupMarkLost, path, "marked do-not-back-up, but its CACHEDIR.TAG is gone: tar --exclude-caches, borg and restic --exclude-caches back it up", .excludeFromBackup)
        } else if tagged && !marked {
            add(.backupMarkLost, path, "has a CACHEDIR.TAG, but its do-not-back-up attribute is gone: backups that read the attribute include it", .excludeFromBackup)
        }
        let excludedHere = excluded || marked || isExcludedByContainer(relative)
        guard depth < 512 else { return }
        for name in names.sorted() {
            let childRelative = relative.isEmpty ? name : relative + "/" + name
            guard let child = DirectoryReader.status(fd, name) else { continue }
            switch child.st_mode & S_IFMT {
            case S_IFDIR:
                guard let childFD = DirectoryReader.open(fd, name, directoryOnly: true) else { continue }
                let own = DirectoryReader.attribute(childFD, DirectoryDefault.attribute).flatMap { ProtectionClass(name: String(decoding: $0, as: UTF8.self)) }
                walkDirectory(childFD, status: child, relative: childRelative, defaultClass: own ?? defaultClass, excluded: excludedHere, depth: depth + 1)
                close(childFD)
            case S_IFLNK:
                examined += 1
                checkLink(fd, name, relative: relative)
            case S_IFREG:
                examined += 1
                checkFile(fd, name, status: child, relative: childRelative, directoryClass: defaultClass, excluded: excludedHere, siblings: nameSet)
            default:
                examined += 1
            }
        }
    }

    // MARK: - Files

    private mutating func checkFile(_ directory: Int32, _ name: String, status st: stat, relative: String, directoryClass: ProtectionClass,
                                    excluded: Bool, siblings: Set<String>) {
        let path = root + "/" + relative
        checkMode(st, path: path)
        if st.st_nlink > 1 {
            let key = [UInt64(st.st_dev), UInt64(st.st_ino)]
            let entry = linked[key] ?? (Int(st.st_nlink), 0, path)
            linked[key] = (entry.links, entry.seen + 1, entry.path)
        }
        if isContainer, relative == DataRootLayout.containerMetadataFileName { return }
        if case .app = kind, relative.hasPrefix(AppContainer.inboxStorageName + "/") {
            let modified = Date(timeIntervalSince1970: TimeInterval(st.st_mtim.tv_sec))
            if options.now.timeIntervalSince(modified) > options.inboxMaxAge {
                add(.staleInboxFile, path, "opened in \(Int(options.now.timeIntervalSince(modified) / 86_400)) days ago and still in the Inbox", .deleteInboxFile)
            }
        }
        guard st.st_size > 0, let fd = DirectoryReader.open(directory, name) else { return }
        defer { close(fd) }
        let header = DirectoryReader.prefix(fd, count: ProtectedFileHeader.size)
        let fixClass = directoryClass == .noProtection ? ProtectionClass.completeUntilFirstUserAuthentication : directoryClass

        if ProtectedFileHeader.looksProtected(header) {
            guard header.count > 12, let cls = ProtectionClass(rawValue: header[12]) else { return }   // damaged: not this audit's to judge
            if name.hasSuffix(DatabaseKeyFile.suffix), siblings.contains(String(name.dropLast(DatabaseKeyFile.suffix.count))) {
                let reference = containerClass ?? directoryClass
                if cls < reference {
                    add(.weakDatabaseKey, path, "the key of \(String(name.dropLast(DatabaseKeyFile.suffix.count))) is class \(cls.letter) (\(cls.shortName)); \(containerClass == nil ? "its directory's" : "the container's") default is \(reference.letter)", .protect(reference))
                }
            } else if cls == .noProtection {
                add(.classNone, path, "class D (none)", .protect(fixClass))
            } else if cls < directoryClass {
                add(.weakerThanDirectory, path, "class \(cls.letter) (\(cls.shortName)) in a directory whose default is \(directoryClass.letter) (\(directoryClass.shortName))", .protect(directoryClass))
            }
        } else {
            checkUnprotected(fd, name, header: header, size: Int64(st.st_size), path: path, relative: relative, fixClass: fixClass, siblings: siblings)
        }
        if Int64(st.st_size) >= options.largeFileThreshold, !excluded, Self.isBackedUpLocation(relative),
           DirectoryReader.attribute(fd, BackupExclusionAttribute.attribute) != Array("false".utf8) {
            add(.largeFileBackedUp, path, "\(Self.megabytes(Int64(st.st_size))) and backed up", .excludeFromBackup)
        }
    }

    private mutating func checkUnprotected(_ fd: Int32, _ name: String, header: [UInt8], size: Int64, path: String, relative: String,
                                           fixClass: ProtectionClass, siblings: Set<String>) {
        if name == BackupExclusionAttribute.cacheDirectoryTagName, header.starts(with: Array(BackupExclusionAttribute.cacheDirectoryTagSignature.utf8)) { return }
        if SQLitePages.isPlaintextDatabase(header) {
            add(.plaintextDatabase, path, "an SQLite database in plaintext (\(Self.megabytes(size)))", .encryptDatabase)
            return
        }
        for suffix in ["-wal", "-journal", "-shm"] where name.hasSuffix(suffix) {
            let database = String(name.dropLast(suffix.count))
            guard siblings.contains(database) else { continue }
            if siblings.contains(database + DatabaseKeyFile.suffix), suffix != "-shm",
               SQLitePages.sidecarHoldsPlaintext(size: size, read: { DirectoryReader.read(fd, count: $0, at: $1) }) {
                add(.plaintextDatabaseSidecar, path, "holds plaintext pages of the encrypted database \(database)", .removeStaleFile)
            }
            return   // a side file: its database's rule speaks for it (a -shm holds page numbers, no rows)
        }
        if siblings.contains(name + DatabaseKeyFile.suffix) { return }   // an encrypted database with its key file
        if case .group = kind, relative.hasPrefix("Library/Preferences/"), name.hasSuffix(".plist") {
            checkPlainPreferences(fd, size: size, path: path)
        }
        add(.plainFile, path, "not in the protected format (\(Self.megabytes(size)))", .protect(fixClass))
    }

    /// A group's preferences written in the clear: secrets in them are found (rule DP403).
    /// Protected preferences are not read — an audit never decrypts; an app checks its own
    /// with ``Auditor/secrets(inPreferences:at:)``.
    private mutating func checkPlainPreferences(_ fd: Int32, size: Int64, path: String) {
        guard size <= 4 << 20 else { return }
        let bytes = DirectoryReader.read(fd, count: Int(size), at: 0)
        guard let plist = try? PropertyListSerialization.propertyList(from: Data(bytes), format: nil) as? [String: Any] else { return }
        findings += Auditor.secrets(inPreferences: plist, at: path)
    }

    // MARK: - Links and modes

    private mutating func checkLink(_ directory: Int32, _ name: String, relative: String) {
        guard let target = DirectoryReader.linkTarget(directory, name) else { return }
        let path = root + "/" + (relative.isEmpty ? name : relative + "/" + name)
        if let outside = Self.leavesRoot(target: target, linkDirectory: relative, root: root) {
            add(.linkLeavesContainer, path, "a symbolic link to \(LosslessPath.display(target)), \(outside)", .removeLink)
        }
    }

    private mutating func checkMode(_ st: stat, path: String) {
        let mode = UInt16(st.st_mode & 0o7777)
        if mode & 0o022 != 0 {
            let who = mode & 0o002 != 0 ? "every user" : "its group"
            add(.writableByOthers, path, "mode \(String(mode, radix: 8)): writable by \(who)", .setMode(mode & ~0o022))
        }
    }

    // MARK: - Helpers

    private mutating func add(_ rule: AuditRule, _ path: String, _ detail: String, _ fix: AuditFix) {
        findings.append(AuditFinding(rule, path: path, detail: detail, fix: fix))
    }

    /// `nil` when the link stays below `root` by its text alone; otherwise where it goes. A link
    /// is judged by what it says, not followed.
    static func leavesRoot(target: String, linkDirectory: String, root: String) -> String? {
        var components: [Substring]
        if target.hasPrefix("/") {
            guard target == root || target.hasPrefix(root + "/") else { return "outside it" }
            components = []
            for part in target.dropFirst(root.count).split(separator: "/") {
                if part == ".." { if components.popLast() == nil { return "outside it" } } else if part != "." { components.append(part) }
            }
            return nil
        }
        components = linkDirectory.split(separator: "/")
        for part in target.split(separator: "/") {
            if part == ".." {
                if components.popLast() == nil { return "above the top of \(URL(fileURLWithPath: root).lastPathComponent)" }
            } else if part != "." {
                components.append(part)
            }
        }
        return nil
    }

    /// Whether the container keeps this directory out of backups by its layout (an app's
    /// `Library/Caches` and `tmp`, a group's `Library/Caches`).
    private func isExcludedByContainer(_ relative: String) -> Bool {
        switch kind {
        case .app: relative == "Library/Caches" || relative == "tmp"
        case .group: relative == "Library/Caches"
        case .tree: false
        }
    }

    /// `Documents` and `Library` (not `Library/Caches`) are what backups take (seed 002).
    static func isBackedUpLocation(_ relative: String) -> Bool {
        (relative.hasPrefix("Documents/") || relative.hasPrefix("Library/")) && !relative.hasPrefix("Library/Caches/")
    }

    private static func isCacheDirectoryTag(_ directory: Int32) -> Bool {
        guard let fd = DirectoryReader.open(directory, BackupExclusionAttribute.cacheDirectoryTagName) else { return false }
        defer { close(fd) }
        return DirectoryReader.prefix(fd, count: 43).starts(with: Array(BackupExclusionAttribute.cacheDirectoryTagSignature.utf8))
    }

    /// The default class a new item directly in `path` would get from its ancestors (iOS's
    /// default, C, when none has one).
    static func inheritedDefault(above path: String) -> ProtectionClass {
        var url = URL(fileURLWithPath: path).deletingLastPathComponent()
        while true {
            if let bytes = try? POSIXFile.getAttribute(DirectoryDefault.attribute, path: url.path),
               let cls = ProtectionClass(name: String(decoding: bytes, as: UTF8.self)) { return cls }
            if url.path == "/" { return .completeUntilFirstUserAuthentication }
            url.deleteLastPathComponent()
        }
    }

    /// Whether an ancestor of `path` is marked do-not-back-up.
    static func excludedAbove(_ path: String) -> Bool {
        var url = URL(fileURLWithPath: path).deletingLastPathComponent()
        while url.path != "/" {
            if (try? POSIXFile.getAttribute(BackupExclusionAttribute.attribute, path: url.path)) == Array("false".utf8) { return true }
            url.deleteLastPathComponent()
        }
        return false
    }

    static func megabytes(_ bytes: Int64) -> String {
        bytes >= 1_000_000 ? String(format: "%.1f MB", Double(bytes) / 1e6) : "\(bytes) bytes"
    }
}
