import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import SystemPackage

struct Write: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "write",
        abstract: "Write standard input to a protected file, atomically.",
        usage: "dpctl write <path> [--class <class>] [<options>]",
        discussion: """
            Without --class the file gets the stronger of its directory's default (inherited from the \
            nearest ancestor; until-first-unlock if none) and, when it replaces a protected file, that \
            file's class. complete-unless-open files can be written while locked. Only a regular \
            file is replaced: a link, a device or a FIFO at PATH is refused.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The file to write.") var path: String
    @Option(
        name: .customLong("class"), help: ArgumentHelp("The class: \(ProtectionClass.spellings).", valueName: "class"))
    var protectionClass: ProtectionClass?
    @Flag(
        help: "Bind the file to this device too (like the keychain's ThisDeviceOnly): no backup restores it elsewhere.")
    var thisDeviceOnly = false
    @OptionGroup var unlock: UnlockOptions

    func validate() throws {
        try requirePaths(path)
        if path.hasSuffix("/") {
            throw ValidationError("\(LosslessPath.display(path)) ends with /: name a file, not a directory")
        }
    }

    func run() async throws {
        let files = ProtectedFileManager(
            keybag: try await device.openDevice(passcodeFile: unlock.passcodeFile, standardInputCarriesData: true))
        let url = URL(fileURLWithPath: path)
        var classes = [protectionClass ?? files.defaultProtection(forNewItemAt: url)]
        if case .protected(let existing)? = try? files.protection(ofItemAt: url) { classes.append(existing) }
        try await PasscodePrompt.unlockIfNeeded(files.keybag, creating: classes)
        // A pipe holds 64 KiB by default: each read then takes 64 KiB and a wake-up of the writer.
        // Ask for 1 MiB (the unprivileged limit); a refusal only costs speed.
        _ = fcntl(
            FileDescriptor.standardInput.rawValue, 1031 /* F_SETPIPE_SZ, not imported by Glibc */, Int32(1 << 20))
        try await files.write(
            contentsOf: .standardInput, to: url, protection: protectionClass,
            thisDeviceOnly: thisDeviceOnly ? true : nil)
    }
}

struct Cat: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cat",
        abstract: "Print the plaintext of protected files.",
        usage: "dpctl cat <paths> ... [<options>]",
        discussion: """
            Fails with a one-line reason when the class is unavailable (exit 3) or the file is damaged \
            (exit 4). Every byte printed has been authenticated first, and a truncated or extended file \
            prints nothing. The file is decrypted once, as it is printed: when a segment in the middle \
            was changed, printing stops there (exit 4); standard output redirected to a file is then \
            cut back to where that file's output began, so no partial copy is left. With several \
            files, the first that fails stops the command. --verify-first authenticates the \
            whole file before printing its first byte, at the cost of decrypting it twice (for a pipe \
            whose reader must see all or nothing).
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The files to print, one after the other.") var paths: [String]
    @Flag(help: "Authenticate each whole file before printing anything of it (decrypts it twice).") var verifyFirst =
        false
    @Flag(help: "Refuse a file that is not protected instead of printing it with a warning.") var strict = false
    @OptionGroup var unlock: UnlockOptions

    func validate() throws {
        try requireSomePaths(paths)
    }

    func run() async throws {
        let files = try await device.openFiles(unlock)
        if strict {
            // Refused before anything is printed.
            for path in paths where try files.protection(ofItemAt: URL(fileURLWithPath: path)) == .plain {
                throw CLIError("\(LosslessPath.display(path)) is not a protected file (refused: --strict)")
            }
        }
        let classes = paths.compactMap { path -> ProtectionClass? in
            if case .protected(let cls)? = try? files.protection(ofItemAt: URL(fileURLWithPath: path)) { return cls }
            return nil
        }
        try await PasscodePrompt.unlockIfNeeded(files.keybag, reading: classes)
        for path in paths { try await print(path, files: files) }
    }

    private func print(_ path: String, files: ProtectedFileManager) async throws {
        let url = URL(fileURLWithPath: path)
        let out = FileDescriptor.standardOutput
        if case .plain = try files.protection(ofItemAt: url) {
            // Nothing vouches for these bytes: say so.
            printError(
                "dpctl: warning: \(LosslessPath.display(path)) is not a protected file: printed as it is, unauthenticated"
            )
            try writeAll(out, try await files.contents(of: url))
            return
        }
        // Opening authenticates the header and the final segment: a truncated or extended file
        // fails here, before any output.
        let handle = try await files.openHandle(forReadingFrom: url)
        let output = RetractableOutput(out)
        do {
            let size = try await handle.size()
            if verifyFirst {
                var offset: Int64 = 0
                while offset < size { offset += Int64(try await handle.read(at: offset, count: Self.chunk).count) }
            }
            // Into a pipe, a larger buffer (as for `write`'s input): fewer wake-ups of the
            // reader on the other end. The next chunk is decrypted while this one is written.
            _ = fcntl(out.rawValue, 1031 /* F_SETPIPE_SZ, not imported by Glibc */, Int32(1 << 20))
            var offset: Int64 = 0
            var current = size > 0 ? try await handle.read(at: 0, count: Self.chunk) : Data()
            while !current.isEmpty {
                offset += Int64(current.count)
                let start = offset
                let next = start < size ? Task { try await handle.read(at: start, count: Self.chunk) } : nil
                do {
                    try writeAll(out, current)
                } catch {
                    _ = try? await next?.value
                    throw error
                }
                current = try await next?.value ?? Data()
            }
            try await handle.close()
        } catch {
            output.retract()
            try? await handle.close()
            throw error
        }
    }

    static let chunk = 1 << 20

    private func writeAll(_ fd: FileDescriptor, _ data: Data) throws {
        _ = try data.withUnsafeBytes { try fd.writeAll($0) }
    }
}

/// Standard output, remembered where it started when it is a regular file, so that a failed
/// command can cut it back (`ftruncate`) instead of leaving a partial copy behind. A pipe or a
/// terminal cannot take back what was written.
struct RetractableOutput {
    let fd: FileDescriptor
    private let start: Int64?

    init(_ fd: FileDescriptor) {
        self.fd = fd
        var info = stat()
        if fstat(fd.rawValue, &info) == 0, info.st_mode & S_IFMT == S_IFREG {
            let append = fcntl(fd.rawValue, F_GETFL) & O_APPEND != 0
            let position = append ? Int64(info.st_size) : Int64(lseek(fd.rawValue, 0, SEEK_CUR))
            start = position >= 0 ? position : nil
        } else {
            start = nil
        }
    }

    /// Cuts a regular file back to where the command started writing.
    func retract() {
        guard let start else { return }
        _ = ftruncate(fd.rawValue, off_t(start))
    }
}

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

struct Protect: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "protect",
        abstract: "Change files' classes or directories' defaults.",
        usage: "dpctl protect [-R] <paths> ... --class <class> [<options>]",
        discussion: """
            With -R, every file below a directory gets the class and every directory gets it as \
            default. Every class needed is checked first: while one is unavailable (locked), \
            nothing changes and the command exits 3.
            """)

    @OptionGroup var device: DeviceOptions
    @Flag(name: .customShort("R"), help: "Re-protect whole trees.") var recursive = false
    @OptionGroup var quiet: QuietOption
    @Argument(help: "Files or directories.") var paths: [String]
    @Option(
        name: .customLong("class"), help: ArgumentHelp("The class: \(ProtectionClass.spellings).", valueName: "class"))
    var protectionClass: ProtectionClass
    @OptionGroup var unlock: UnlockOptions

    func validate() throws {
        try requireSomePaths(paths)
    }

    func run() async throws {
        let files = try await device.openFiles(unlock)
        let urls = paths.map { URL(fileURLWithPath: $0) }
        guard recursive else {
            // Every path exists and reads, and every class needed is available, before the first change.
            for url in urls { _ = try files.protection(ofItemAt: url) }
            try await PasscodePrompt.retrying(files.keybag) {
                try await files.checkClassesAvailable(forReprotecting: urls, to: protectionClass)
            }
            for url in urls { try await files.setProtection(protectionClass, ofItemAt: url) }
            return
        }
        let bar = ProgressLine(enabled: !quiet.quiet && isatty(STDERR_FILENO) == 1)
        // Every tree is walked and every class checked before the first change: asking and trying again is safe.
        let target = protectionClass
        let total: ReprotectionReport
        do {
            total = try await PasscodePrompt.retrying(files.keybag) {
                // Ctrl-C stops it between two files, each whole, and says how far it got.
                try await runInterruptibly {
                    try await files.reprotectItems(at: urls, to: target) { progress in
                        bar.update(done: progress.completed, total: progress.total)
                    }
                }
            }
        } catch {
            bar.finish()
            throw error
        }
        bar.finish()
        if !quiet.quiet {
            printOut(
                "\(total.filesChanged) files changed, \(total.filesUnchanged) already \(protectionClass.shortName), \(total.directories) directories"
            )
        }
        for (path, reason) in total.failures.sorted(by: { $0.key < $1.key }) {
            // The reason names the file already, in most cases.
            let line = reason.contains(path) ? reason : "\(path): \(reason)"
            printError("dpctl: \(LosslessPath.display(line))")
        }
        if !total.failures.isEmpty { throw ExitCode(1) }
    }
}

struct Copy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cp",
        abstract: "Copy a file or tree, keeping the stronger class.",
        usage: "dpctl cp <source> <destination> [--class <class>] [<options>]",
        discussion: """
            The copy gets the stronger of the source's class and the destination's default. A \
            tree is never copied into itself; its links are copied as links, and it appears \
            whole or not at all (a FIFO or device inside stops the copy).
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "Source.") var source: String
    @Argument(help: "Destination: a new name, or an existing directory to copy into (as cp does).") var destination:
        String
    @Option(name: .customLong("class"), help: "Give the copy this class instead (the only way to lower it).")
    var protectionClass: ProtectionClass?
    @OptionGroup var unlock: UnlockOptions

    func validate() throws { try requirePaths(source, destination) }

    func run() async throws {
        let files = try await device.openFiles(unlock)
        try await PasscodePrompt.unlockIfNeeded(files.keybag, reading: PasscodePrompt.classes(below: source))
        try await files.copyItem(
            at: URL(fileURLWithPath: source), to: URL(fileURLWithPath: Self.target(of: source, at: destination)),
            protection: protectionClass)
    }

    /// Where the copy goes: into `destination` when it is a directory (or a link to one), under
    /// the source's name, as `cp` does; else `destination` itself. A `DIR/` that is no directory
    /// is an error, never a file named so.
    static func target(of source: String, at destination: String) throws -> String {
        if let st = POSIXFile.status(destination), st.st_mode & S_IFMT == S_IFDIR {
            let name = POSIXFile.split(source).name
            guard name != "/", name != ".", name != ".." else {
                throw CLIError(
                    "\(LosslessPath.display(source)): name the copy (\(LosslessPath.display(destination))/NAME)",
                    status: .usage)
            }
            return (destination.hasSuffix("/") ? destination : destination + "/") + name
        }
        if destination.hasSuffix("/") {
            throw ProtectedFileError.fileSystem(
                FileSystemError(
                    "copy", path: LosslessPath.display(destination),
                    errno: POSIXFile.linkStatus(destination) == nil ? .noSuchFileOrDirectory : .notDirectory))
        }
        return destination
    }
}
