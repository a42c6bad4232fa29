import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

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
    /// The audited directory, open for the walk (links are resolved beneath it).
    private var rootFD: Int32 = -1
    /// The container's own default (rule DP202 compares key files with it); `nil` for a tree.
    private var containerClass: ProtectionClass?
    /// Directories (relative paths) already looked at for an SQLCipher database.
    private var sqlcipherDirectories: [[UInt8]: Bool] = [:]
    /// Regular files with more than one name: how many of their names were seen in the tree.
    private var linked: [[UInt64]: (links: Int, seen: Int, path: String)] = [:]

    /// Whether every program that reads this tree's files reads them through the library (so a
    /// plain file may be converted in place): true for a tree outside containers (the user's own
    /// files, read with `dpctl cat` or the API), for an app declared a user of protected files
    /// (FORMAT §10.1 `UsesProtectedFiles`), and for a group whose members all are.
    let containerReadersUseTheLibrary: Bool

    init(root: String, kind: Kind, options: AuditOptions, containerReadersUseTheLibrary: Bool = true) {
        self.root = root
        self.kind = kind
        self.options = options
        self.containerReadersUseTheLibrary = containerReadersUseTheLibrary
    }

    /// What the metadata at `path` says the directory is (a tree when there is none).
    static func kind(of path: String) -> Kind {
        guard let metadata = try? ContainerMetadata.read(container: path) else { return .tree }
        return metadata.kind == .application
            ? .app(identifier: metadata.identifier) : .group(identifier: metadata.identifier)
    }

    private var isContainer: Bool { kind != .tree }

    mutating func run() throws {
        let fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw AuditError.cannotOpen(root, errno: errno) }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw AuditError.cannotOpen(root, errno: errno) }
        if Self.isDataRoot(Set(DirectoryReader.names(fd))) { throw AuditError.dataRoot(root) }
        rootFD = fd
        let inherited = DirectoryDefault.inherited(forNewItemAt: root) ?? .completeUntilFirstUserAuthentication
        let own = DirectoryReader.attribute(fd, DirectoryDefault.attribute).flatMap {
            ProtectionClass(name: String(decoding: $0, as: UTF8.self))
        }
        if isContainer, own == .noProtection {
            let fix: AuditFix =
                switch kind {
                case .app(let id): .setAppDefault(app: id, .completeUntilFirstUserAuthentication)
                case .group(let id): .setGroupDefault(group: id, .completeUntilFirstUserAuthentication)
                case .tree: .protect(.completeUntilFirstUserAuthentication)
                }
            add(.containerDefaultNone, root, "its default class is None (D)", fix)
        }
        if isContainer { containerClass = own ?? inherited }
        let excludedAbove =
            (try? BackupExclusionAttribute.exclusion(of: URL(fileURLWithPath: root)))?.isExcludedFromBackup ?? false
        walkDirectory(fd, status: st, relative: "", defaultClass: own ?? inherited, excluded: excludedAbove, depth: 0)
        for (_, file) in linked where file.seen < file.links {
            add(
                .linkLeavesContainer, file.path,
                "a hard link: \(file.links) names, \(file.links - file.seen) of them outside \(isContainer ? "the container" : "the tree")",
                .removeLink)
        }
    }

    // MARK: - Directories

    private mutating func walkDirectory(
        _ fd: Int32, status st: stat, relative: String, defaultClass: ProtectionClass, excluded: Bool, depth: Int
    ) {
        examined += 1
        let path = relative.isEmpty ? root : root + "/" + relative
        checkMode(st, path: path)
        let names = DirectoryReader.names(fd)
        let nameSet = Set(names)
        // A data root inside the tree (its keybag, device secret, catalog) is no tree of files:
        // it is audited as a device, never converted.
        if depth > 0, Self.isDataRoot(nameSet) { return }
        // Backup marks: the xattr and CACHEDIR.TAG go together (rule DP302).
        let marked =
            DirectoryReader.attribute(fd, BackupExclusionAttribute.attribute).map { $0 == Array("false".utf8) } ?? false
        let tagged = nameSet.contains(BackupExclusionAttribute.cacheDirectoryTagName) && Self.isCacheDirectoryTag(fd)
        if marked && !tagged {
            add(
                .backupMarkLost, path,
                "marked do-not-back-up, but its CACHEDIR.TAG is gone: tar --exclude-caches, borg and restic --exclude-caches back it up",
                .excludeFromBackup, st)
        } else if tagged && !marked {
            add(
                .backupMarkLost, path,
                "has a CACHEDIR.TAG, but its do-not-back-up attribute is gone: backups that read the attribute include it",
                .excludeFromBackup, st)
        }
        let excludedHere = excluded || marked || isExcludedByContainer(relative)
        guard depth < 512 else { return }
        for name in names.sorted() {
            let childRelative = relative.isEmpty ? name : relative + "/" + name
            guard let child = DirectoryReader.status(fd, name) else { continue }
            switch child.st_mode & S_IFMT {
            case S_IFDIR:
                guard let childFD = DirectoryReader.open(fd, name, directoryOnly: true) else { continue }
                let own = DirectoryReader.attribute(childFD, DirectoryDefault.attribute).flatMap {
                    ProtectionClass(name: String(decoding: $0, as: UTF8.self))
                }
                walkDirectory(
                    childFD, status: child, relative: childRelative, defaultClass: own ?? defaultClass,
                    excluded: excludedHere, depth: depth + 1)
                close(childFD)
            case S_IFLNK:
                examined += 1
                checkLink(fd, name, relative: relative)
            case S_IFREG:
                examined += 1
                checkFile(
                    fd, name, status: child, relative: childRelative, directoryClass: defaultClass,
                    excluded: excludedHere, siblings: nameSet)
            default:
                examined += 1
                // A FIFO, socket or device among data: nothing an app's data needs (the sandbox
                // lets apps make sockets and FIFOs only in tmp).
                let kind =
                    switch child.st_mode & S_IFMT {
                    case S_IFIFO: "a FIFO"
                    case S_IFSOCK: "a socket"
                    case S_IFCHR: "a character device"
                    case S_IFBLK: "a block device"
                    default: "a special file"
                    }
                if !(isContainer && (relative == "tmp" || relative.hasPrefix("tmp/"))) {
                    add(.setIDOrSpecialFile, root + "/" + childRelative, "\(kind), not data", .removeSpecialFile, child)
                }
            }
        }
    }

    // MARK: - Files

    private mutating func checkFile(
        _ directory: Int32, _ name: String, status st: stat, relative: String, directoryClass: ProtectionClass,
        excluded: Bool, siblings: Set<String>
    ) {
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
                add(
                    .staleInboxFile, path,
                    "opened in \(Int(options.now.timeIntervalSince(modified) / 86_400)) days ago and still in the Inbox",
                    .deleteInboxFile, st)
            }
        }
        if Self.isCoordinationRecord(name, relative: relative) { return }   // plain by design (FORMAT.md §10.5)
        guard st.st_size > 0, let fd = DirectoryReader.open(directory, name) else { return }
        defer { close(fd) }
        // What was opened is what was looked at (not swapped since the fstatat).
        var opened = stat()
        guard fstat(fd, &opened) == 0, opened.st_mode & S_IFMT == S_IFREG, opened.st_ino == st.st_ino,
            opened.st_dev == st.st_dev
        else { return }
        let header = DirectoryReader.prefix(fd, count: ProtectedFileHeader.size)
        let fixClass =
            directoryClass == .noProtection ? ProtectionClass.completeUntilFirstUserAuthentication : directoryClass

        if ProtectedFileHeader.looksProtected(header) {
            // A header that does not parse is no protection at all (damaged, or forged to hide plaintext).
            guard header.count >= ProtectedFileHeader.size, (try? ProtectedFileHeader.parse(header, path: path)) != nil,
                let cls = ProtectionClass(rawValue: header[12])
            else {
                add(
                    .plainFile, path, "its header looks protected but does not parse: damaged or forged",
                    .inspectDamagedFile, st)
                return
            }
            if name.hasSuffix(DatabaseKeyFile.suffix),
                siblings.contains(String(name.dropLast(DatabaseKeyFile.suffix.count)))
            {
                let reference = containerClass ?? directoryClass
                if cls < reference {
                    let database = LosslessPath.display(String(name.dropLast(DatabaseKeyFile.suffix.count)))
                    add(
                        .weakDatabaseKey, path,
                        "the key of \(database) is class \(cls.letter) (\(cls.shortName)); \(containerClass == nil ? "its directory's" : "the container's") default is \(reference.letter)",
                        .protect(reference), st)
                }
            } else if cls == .noProtection {
                add(.classNone, path, "class D (none)", .protect(fixClass), st)
            } else if cls < directoryClass {
                add(
                    .weakerThanDirectory, path,
                    "class \(cls.letter) (\(cls.shortName)) in a directory whose default is \(directoryClass.letter) (\(directoryClass.shortName))",
                    .protect(directoryClass), st)
            }
        } else {
            checkUnprotected(
                fd, directory, name, status: st, header: header, path: path, relative: relative, fixClass: fixClass,
                siblings: siblings)
        }
        if Int64(st.st_size) >= options.largeFileThreshold, !excluded, Self.isBackedUpLocation(relative),
            DirectoryReader.attribute(fd, BackupExclusionAttribute.attribute) != Array("false".utf8)
        {
            add(.largeFileBackedUp, path, "\(Self.megabytes(Int64(st.st_size))) and backed up", .excludeFromBackup, st)
        }
    }

    private mutating func checkUnprotected(
        _ fd: Int32, _ directory: Int32, _ name: String, status st: stat, header: [UInt8], path: String,
        relative: String, fixClass: ProtectionClass, siblings: Set<String>
    ) {
        let size = Int64(st.st_size)
        if name == BackupExclusionAttribute.cacheDirectoryTagName,
            header.starts(with: Array(BackupExclusionAttribute.cacheDirectoryTagSignature.utf8))
        {
            return
        }
        if SQLitePages.isPlaintextDatabase(header) {
            add(
                .plaintextDatabase, path, "an SQLite database in plaintext (\(Self.megabytes(size)))",
                .encryptDatabase(fixClass), st)
            return
        }
        for suffix in ["-wal", "-journal", "-shm"] where name.hasSuffix(suffix) {
            let database = String(name.dropLast(suffix.count))
            // Only what SQLite writes passes for a side file: the WAL or journal magic, a wal-index.
            guard siblings.contains(database), SQLitePages.isSideFile(header, suffix: suffix) else { continue }
            if siblings.contains(database + DatabaseKeyFile.suffix), suffix != "-shm",
                SQLitePages.sidecarHoldsPlaintext(size: size, read: { DirectoryReader.read(fd, count: $0, at: $1) })
            {
                add(
                    .plaintextDatabaseSidecar, path,
                    "holds plaintext pages of the encrypted database \(LosslessPath.display(database))",
                    .removeStaleFile, st)
            }
            return   // a side file: its database's rule speaks for it (a -shm holds page numbers, no rows)
        }
        // An encrypted database: its key file beside it is a protected file.
        if siblings.contains(name + DatabaseKeyFile.suffix),
            Self.isProtectedFile(directory, name + DatabaseKeyFile.suffix)
        {
            return
        }
        if case .group = kind, relative.hasPrefix("Library/Preferences/"), name.hasSuffix(".plist") {
            checkPlainPreferences(fd, size: size, path: path)
        }
        // An SQLCipher database: encrypted with its own key, which SQLCipher must go on opening.
        if SQLCipherFileProbe.looksLikeSQLCipher(head: DirectoryReader.read(fd, count: 1024, at: 0), size: size) {
            add(
                .databaseWithItsOwnKey, path,
                "an SQLCipher database (\(Self.megabytes(size))), encrypted with a key of its own",
                .keepDatabaseKeyProtected, st)
            return
        }
        // Converted in place only where every reader goes through the library: not a database's
        // passphrase file (SQLCipher reads it), not the files of an app that reads them as they are.
        let someoneElseReadsIt =
            !containerReadersUseTheLibrary
            || (size <= Self.smallFileLimit
                && directoryHoldsSQLCipherDatabase(directory, relative: relative, siblings: siblings))
        add(
            .plainFile, path, "not in the protected format (\(Self.megabytes(size)))",
            someoneElseReadsIt ? .protectOnceNoOtherProgramReadsIt(fixClass) : .protect(fixClass), st)
    }

    /// Files up to this size next to an SQLCipher database may be its passphrase.
    static let smallFileLimit: Int64 = 64 * 1024

    /// Whether an entry of `directory` (the file's at `relative`) looks like an SQLCipher database
    /// (the first 256 checked), looked at once per directory. A small plain file is not one.
    private mutating func directoryHoldsSQLCipherDatabase(
        _ directory: Int32, relative: String, siblings: Set<String>
    ) -> Bool {
        // The directory's relative path, cut at the last `/` byte (names are bytes).
        let bytes = LosslessPath.bytes(of: relative)
        let key = Array(bytes[..<(bytes.lastIndex(of: UInt8(ascii: "/")) ?? 0)])
        if let known = sqlcipherDirectories[key] { return known }
        var found = false
        for sibling in siblings.sorted().prefix(256) {
            guard let fd = DirectoryReader.open(directory, sibling) else { continue }
            defer { close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { continue }
            if SQLCipherFileProbe.looksLikeSQLCipher(
                head: DirectoryReader.read(fd, count: 1024, at: 0), size: Int64(st.st_size))
            {
                found = true; break
            }
        }
        sqlcipherDirectories[key] = found
        return found
    }

    /// A group's preferences written in the clear: secrets in them are found (rule DP403).
    /// Protected preferences are not read — an audit never decrypts; an app checks its own
    /// with ``Auditor/secrets(inPreferences:at:)``.
    private mutating func checkPlainPreferences(_ fd: Int32, size: Int64, path: String) {
        guard size <= 1 << 20 else { return }
        let bytes = DirectoryReader.read(fd, count: Int(size), at: 0)
        findings += Self.onLargeStack { () -> [AuditFinding] in
            // A property list can nest as deep as its bytes allow: parsed on a thread whose stack
            // holds any that fits in 1 MB, so a hostile one cannot crash the audit.
            guard
                let plist = try? PropertyListSerialization.propertyList(from: Data(bytes), format: nil)
                    as? [String: Any]
            else { return [] }
            return Auditor.secrets(inPreferences: plist, at: path)
        }
    }

    /// Runs `body` on a thread with a 512 MB stack (reserved, not used) and waits for it.
    static func onLargeStack<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Mutex<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }
        thread.stackSize = 512 << 20
        thread.start()
        done.wait()
        return result.withLock { $0! }
    }

    // MARK: - Links and modes

    private mutating func checkLink(_ directory: Int32, _ name: String, relative: String) {
        guard let target = DirectoryReader.linkTarget(directory, name) else { return }
        let linkRelative = relative.isEmpty ? name : relative + "/" + name
        let path = root + "/" + linkRelative
        var outside = Self.leavesRoot(target: target, linkDirectory: relative, root: root)
        // A relative link may pass through other links (`a -> s/..` with `s -> .`): the kernel
        // resolves it beneath the root and says whether it leaves (EXDEV).
        if outside == nil, !target.hasPrefix("/"),
            (try? LosslessPath.withCString(linkRelative) { relative in
                Result { () throws(Errno) in
                    try SystemCall.openat2(rootFD, relative, Self.pathOnly | O_CLOEXEC, resolve: .beneath)
                }
            }).map({ opened in
                if case .success(let fd) = opened { close(fd) }
                return opened == .failure(.improperLink)
            }) == true
        {
            outside = "outside it, through other links"
        }
        if let outside {
            add(
                .linkLeavesContainer, path, "a symbolic link to \(LosslessPath.display(target)), \(outside)",
                .removeLink)
        }
    }

    private mutating func checkMode(_ st: stat, path: String) {
        let mode = UInt16(st.st_mode & 0o7777)
        if mode & 0o6000 != 0, mode & 0o022 == 0 {   // with 022 too, DP602's chmod drops both
            let bits = [mode & 0o4000 != 0 ? "set-user-ID" : nil, mode & 0o2000 != 0 ? "set-group-ID" : nil].compactMap
            { $0 }.joined(separator: " and ")
            add(
                .setIDOrSpecialFile, path, "mode \(String(mode, radix: 8)): \(bits)", .setMode(mode & 0o1777 & ~0o022),
                st)
        }
        if mode & 0o022 != 0 {
            let who = mode & 0o002 != 0 ? "every user" : "its group"
            add(
                .writableByOthers, path, "mode \(String(mode, radix: 8)): writable by \(who)", .setMode(mode & 0o755),
                st)
        }
    }

    // MARK: - Helpers

    private mutating func add(_ rule: AuditRule, _ path: String, _ detail: String, _ fix: AuditFix, _ st: stat? = nil) {
        let identity = st.map(FileIdentity.init(status:))
        findings.append(AuditFinding(rule, path: path, detail: detail, fix: fix, identity: identity))
    }

    /// `nil` when the link stays below `root` by its text alone; otherwise where it goes. A link
    /// is judged by what it says, not followed.
    static func leavesRoot(target: String, linkDirectory: String, root: String) -> String? {
        var components: [Substring]
        if target.hasPrefix("/") {
            guard target == root || target.hasPrefix(root + "/") else { return "outside it" }
            components = []
            for part in target.dropFirst(root.count).split(separator: "/") {
                if part == ".." {
                    if components.popLast() == nil { return "outside it" }
                } else if part != "." {
                    components.append(part)
                }
            }
            return nil
        }
        components = linkDirectory.split(separator: "/")
        for part in target.split(separator: "/") {
            if part == ".." {
                if components.popLast() == nil {
                    return "above the top of \(URL(fileURLWithPath: root).lastPathComponent)"
                }
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

    /// `O_PATH` (Glibc's module does not export it): a descriptor that only names the item.
    static let pathOnly: Int32 = O_PATH

    /// What marks a directory as a data root (FORMAT.md §1): its device secret and keybag.
    static let dataRootMarkers = ["device.secret", "keybag"]
    /// The data root's own files, which must be the user's alone (rule DP603).
    static let dataRootFiles = ["device.secret", "keybag", "backup-keybag", "keybag.lock", "layout"]

    static func isDataRoot(_ names: Set<String>) -> Bool { dataRootMarkers.allSatisfy(names.contains) }

    /// A file coordination change record (`.coordination/<digest>.change`): plain by design.
    static func isCoordinationRecord(_ name: String, relative: String) -> Bool {
        name.hasSuffix(".change")
            && (relative.hasPrefix(".coordination/") || relative.hasPrefix("Library/.coordination/"))
    }

    private static func isProtectedFile(_ directory: Int32, _ name: String) -> Bool {
        guard let fd = DirectoryReader.open(directory, name) else { return false }
        defer { close(fd) }
        return ProtectedFileHeader.looksProtected(DirectoryReader.prefix(fd, count: 16))
    }

    /// `Documents` and `Library` (not `Library/Caches`) are what backups take (as iOS backs up).
    static func isBackedUpLocation(_ relative: String) -> Bool {
        (relative.hasPrefix("Documents/") || relative.hasPrefix("Library/")) && !relative.hasPrefix("Library/Caches/")
    }

    private static func isCacheDirectoryTag(_ directory: Int32) -> Bool {
        guard let fd = DirectoryReader.open(directory, BackupExclusionAttribute.cacheDirectoryTagName) else {
            return false
        }
        defer { close(fd) }
        return DirectoryReader.prefix(fd, count: 43).starts(
            with: Array(BackupExclusionAttribute.cacheDirectoryTagSignature.utf8))
    }

    static func megabytes(_ bytes: Int64) -> String {
        bytes >= 1_000_000 ? String(format: "%.1f MB", Double(bytes) / 1e6) : "\(bytes) bytes"
    }
}
