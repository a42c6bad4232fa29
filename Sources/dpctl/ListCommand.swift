import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import SystemPackage

struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "Show each file's class and each directory's default.",
        discussion: """
            Needs no passcode. A class-managed database shows the class of its key file; \
            BACKUP says whether a backup takes the item: no when it is marked, below a marked \
            directory, or in a place a backup leaves out (an app's Library/Caches and tmp).
            """)

    @OptionGroup var device: DeviceOptions
    @Flag(name: .customShort("R"), help: "List subdirectories recursively.") var recursive = false
    @Flag(help: "Print JSON: an array of {name, class, backup, size, protection, kind, included …} (FORMAT §5.0).")
    var json = false
    @Flag(help: "Sizes in bytes instead of 76.3 MiB.") var bytes = false
    @Argument(help: "Files or directories.") var paths: [String] = ["."]

    func validate() throws { try requirePaths(paths) }

    func run() async throws {
        device.bootstrapLogging()
        // Reading classes needs no key; a keybag is not even required. With one, the BACKUP
        // column also knows the places a backup leaves out (apps' Library/Caches and tmp).
        var probe = ProtectionProbe()
        // Only for paths in the data root, where containers live: opening a device bound to a
        // TPM asks the TPM, which an ls elsewhere has no reason to wait for.
        if let root = try? device.resolvedRoot, paths.contains(where: { Self.path($0, isInside: root) }),
            let keybag = try? await Keybag.open(root: root)
        {
            let policy = ContainerManager(files: ProtectedFileManager(keybag: keybag)).backupExclusionPolicy(
                for: URL(fileURLWithPath: "/"))
            probe.excludedPlaces = policy.excludedPaths.map { "/" + $0 }
        }
        var items: [ListedItem] = []
        for path in paths {
            // With several paths, names are shown under the path given, as `ls a b` does.
            try list(path, prefix: paths.count > 1 ? path : nil, probe: probe, into: &items)
        }
        // The real names (FORMAT §5.0's rules); a damaged item's reason in its own key.
        if json { return printJSON(items) }
        var rows = [["CLASS", "BACKUP", "SIZE", "NAME"]]
        for item in items {
            let size = item.size.map { bytes ? "\($0)" : humanSize($0) } ?? "-"
            rows.append([
                item.class, item.backup, size, LosslessPath.display(item.name) + (item.error.map { "  (\($0))" } ?? ""),
            ])
        }
        printOut(table(rows, rightAligned: [2]))
    }

    /// Whether `path` is `root` or below it (both resolved), or `root` is below `path`.
    static func path(_ path: String, isInside root: String) -> Bool {
        let item = URL(fileURLWithPath: path).standardizedFileURL.resolvingSymlinksInPath().path
        let base = URL(fileURLWithPath: root).standardizedFileURL.resolvingSymlinksInPath().path
        return item == base || item.hasPrefix(base + "/") || base.hasPrefix(item == "/" ? "/" : item + "/")
    }

    private func list(_ path: String, prefix: String?, probe: ProtectionProbe, into items: inout [ListedItem]) throws {
        let url = URL(fileURLWithPath: path)
        func describe(_ item: URL, name: String) {
            let shown = prefix.map { name == "." ? $0 : ($0.hasSuffix("/") ? $0 : $0 + "/") + name } ?? name
            items.append(probe.item(item, name: shown))
        }
        guard let st = POSIXFile.status(url.path) else {
            throw ProtectedFileError.noSuchFile(path: LosslessPath.display(url.path))
        }
        if st.st_mode & S_IFMT == S_IFDIR {
            describe(url, name: ".")
            // Names as bytes (readdir); shown escaped (`\xE9`), like `ls -b`.
            var names: [String] = []
            var pending = [""]
            while let relative = pending.popLast() {
                let directory = relative.isEmpty ? url.path : url.path + "/" + relative
                for name in try POSIXFile.directoryEntries(directory) {
                    let child = relative.isEmpty ? name : relative + "/" + name
                    names.append(child)
                    if recursive, let st = POSIXFile.linkStatus(url.path + "/" + child), st.st_mode & S_IFMT == S_IFDIR
                    {
                        pending.append(child)
                    }
                }
            }
            for name in names.sorted() { describe(url.appendingPathComponent(name), name: name) }
        } else {
            describe(url, name: prefix == nil ? path : ".")
        }
    }
}

/// One item of `ls`: its labels for the table (`class`, `backup`) and, for scripts, the same
/// facts in one machine form each (FORMAT §5.0): `protection` a class's short name, `kind`,
/// `inherited`, `included`, `excludedBy`.
struct ListedItem: Encodable {
    /// The CLASS column: `complete (A)`, `dir default: inherited (until-first-unlock)`, `plain (unprotected)` …
    var `class`: String
    /// The BACKUP column: `yes`, `no (marked)`, `no (inherited)`, `no (by place)`, `?`.
    var backup: String
    /// Bytes of plaintext (protected files) or on disk; `nil` for directories and others.
    var size: Int64?
    var name: String
    var error: String?
    /// The class (`complete` … `none`): a file's, a database's key file's, a directory's default
    /// (its own, or the one it inherits); `nil` for plain files, SQLCipher databases, links, damage.
    var protection: ProtectionClass?
    /// `protected-file`, `database` (class-managed), `sqlcipher-database`, `plain-file`,
    /// `directory`, `dangling-link`, `other` or `damaged`.
    var kind: String
    /// Directories: whether the default is inherited rather than set on the directory.
    var inherited: Bool? = nil
    /// Protected files: whether the file key is bound to this device ("this device only").
    var thisDeviceOnly: Bool? = nil
    /// Whether a backup takes it; `nil` when that could not be read.
    var included: Bool?
    /// Why a backup leaves it out: `attribute` (its own mark), `ancestor` (a marked directory
    /// above it) or `place` (an app's Library/Caches or tmp); `nil` when included.
    var excludedBy: String?

    func encode(to encoder: any Encoder) throws {
        enum Key: String, CodingKey {
            case `class`, backup, size, name, error, protection, kind, inherited, thisDeviceOnly, included, excludedBy
        }
        var container = encoder.container(keyedBy: Key.self)
        try container.encode(`class`, forKey: .class)
        try container.encode(backup, forKey: .backup)
        try container.encode(size, forKey: .size)   // null for directories, as before
        try container.encode(name, forKey: .name)
        try container.encodeIfPresent(error, forKey: .error)
        try container.encode(protection?.shortName, forKey: .protection)
        try container.encode(kind, forKey: .kind)
        try container.encodeIfPresent(inherited, forKey: .inherited)
        try container.encodeIfPresent(thisDeviceOnly, forKey: .thisDeviceOnly)
        try container.encode(included, forKey: .included)
        try container.encode(excludedBy, forKey: .excludedBy)
    }
}

/// Describes items for `ls` without a keybag: class, backup, size and the real name (shown
/// escaped by the table, kept as it is for JSON), then the reason when the item is damaged.
struct ProtectionProbe {
    /// Absolute paths a backup leaves out by place, with everything below them.
    var excludedPlaces: [String] = []

    func item(_ url: URL, name: String) -> ListedItem {
        var item = classified(url, name: name)
        switch try? BackupExclusionAttribute.exclusion(of: url) {
        case .included?:
            let byPlace = excludedByPlace(url)
            (item.backup, item.included, item.excludedBy) =
                byPlace ? ("no (by place)", false, "place") : ("yes", true, nil)
        case .excludedByOwnAttribute?:
            (item.backup, item.included, item.excludedBy) = ("no (marked)", false, "attribute")
        case .excludedByAncestor?: (item.backup, item.included, item.excludedBy) = ("no (inherited)", false, "ancestor")
        case nil: (item.backup, item.included, item.excludedBy) = ("?", nil, nil)
        }
        return item
    }

    private func excludedByPlace(_ url: URL) -> Bool {
        guard !excludedPlaces.isEmpty else { return false }
        let path = url.standardizedFileURL.resolvingSymlinksInPath().path
        return excludedPlaces.contains { path == $0 || path.hasPrefix($0 + "/") }
    }

    private func classified(_ url: URL, name: String) -> ListedItem {
        func item(
            _ label: String, _ kind: String, _ protection: ProtectionClass? = nil, size: Int64? = nil,
            name: String = name
        ) -> ListedItem {
            ListedItem(
                class: label, backup: "", size: size, name: name, error: nil, protection: protection, kind: kind,
                included: nil, excludedBy: nil)
        }
        // A link whose target is missing is no damage: it has nothing to protect.
        if POSIXFile.status(url.path) == nil, let st = POSIXFile.linkStatus(url.path), st.st_mode & S_IFMT == S_IFLNK {
            return item("dangling link", "dangling-link")
        }
        // `ProtectedFileManager.protection(ofItemAt:)` needs no key; any keybag-less reading goes
        // through the same parser, so use a static helper.
        do {
            switch try ItemInspector.protection(ofItemAt: url) {
            case .directory(let cls):
                // Which class is inherited, and that it is: the nearest ancestor's default, or
                // iOS's default when none has one.
                let inherited = DirectoryDefault.inherited(forNewItemAt: url.path) ?? .default
                var listed = item(
                    "dir default: " + (cls?.shortName ?? "inherited (\(inherited.shortName))"), "directory",
                    cls ?? inherited, name: name + "/")
                listed.inherited = cls == nil
                return listed
            case .protected(let cls):
                let deviceOnly = (try? ItemInspector.isThisDeviceOnly(url)) == true
                var listed = item(
                    "\(cls.shortName) (\(cls.letter))\(deviceOnly ? ", this device only" : "")", "protected-file", cls,
                    size: Int64(try ItemInspector.plaintextSize(ofItemAt: url)))
                listed.thisDeviceOnly = deviceOnly
                return listed
            case .plain:
                let size = POSIXFile.status(url.path).map { Int64($0.st_size) } ?? 0
                if let cls = databaseClass(url) {
                    return item("\(cls.shortName) (\(cls.letter)), database", "database", cls, size: size)
                }
                // Encrypted with a key of its own (no class: the device's keys do not open it).
                if SQLCipherFileProbe.looksLikeSQLCipher(atPath: url.path) {
                    return item("sqlcipher", "sqlcipher-database", size: size)
                }
                return item("plain (unprotected)", "plain-file", size: size)
            case .other:
                return item("-", "other")
            }
        } catch {
            var listed = item("damaged", "damaged")
            listed.error = LosslessPath.display(String(describing: error))
            return listed
        }
    }

    /// The class of a class-managed database (or of its journal, WAL or shared-memory file):
    /// the class of the key file beside it, whose key encrypts its pages. Not when the
    /// database itself is plain SQLite (a stale key file beside a plain database says nothing).
    private func databaseClass(_ url: URL) -> ProtectionClass? {
        var database = url.path
        for suffix in ["-wal", "-shm", "-journal"] where database.hasSuffix(suffix) {
            database = String(database.dropLast(suffix.count))
        }
        if DatabaseFileKind.isPlainDatabase(database) { return nil }
        guard
            case .protected(let cls)? = try? ItemInspector.protection(
                ofItemAt: URL(fileURLWithPath: database + DatabaseKeyFile.suffix))
        else { return nil }
        return cls
    }
}
