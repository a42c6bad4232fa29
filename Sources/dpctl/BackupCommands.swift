import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Synchronization

struct Exclude: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exclude",
        abstract: "Mark files \"do not back up\" (isExcludedFromBackup).",
        discussion: """
            Sets the extended attribute user.xdg.robots.backup=false. A directory's mark covers \
            everything below it; a marked directory also gets a CACHEDIR.TAG, so that \
            `tar|restic|borg --exclude-caches` leave it out too. All or nothing: when one \
            path cannot be marked, the others are left as they were.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "Files or directories (they must exist).") var paths: [String]
    @Flag(help: "Do not write a CACHEDIR.TAG into a marked directory.") var noCachedirTag = false

    func validate() throws {
        try requireSomePaths(paths)
    }

    func run() async throws {
        // All or nothing: a failure at one path (an immutable file, a file system without
        // extended attributes) names it and puts the ones before it back as they were.
        for path in paths where POSIXFile.linkStatus(path) == nil { throw ProtectedFileError.noSuchFile(path: path) }
        try BackupExclusionAttribute.set(
            excluded: true, for: paths.map { URL(fileURLWithPath: $0) }, cacheDirectoryTag: !noCachedirTag)
    }
}

struct Include: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "include",
        abstract: "Remove the \"do not back up\" mark.",
        discussion:
            "The CACHEDIR.TAG dpctl wrote goes too. An item below a marked directory stays excluded until that directory is included."
    )

    @OptionGroup var device: DeviceOptions
    @Argument(help: "Files or directories.") var paths: [String]

    func validate() throws {
        try requireSomePaths(paths)
    }

    func run() async throws {
        for path in paths where POSIXFile.linkStatus(path) == nil { throw ProtectedFileError.noSuchFile(path: path) }
        try BackupExclusionAttribute.set(excluded: false, for: paths.map { URL(fileURLWithPath: $0) })
        for path in paths {
            if case .excludedByAncestor(let ancestor) = try BackupExclusionAttribute.exclusion(
                of: URL(fileURLWithPath: path))
            {
                printError(
                    "dpctl: note: \(LosslessPath.display(path)) is still excluded by its ancestor \(LosslessPath.display(ancestor.path))"
                )
            }
        }
    }
}

struct Exclusions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exclusions",
        abstract: "Print marked items as a backup tool's exclude list.",
        usage: "dpctl exclusions <path> [--format <format>] [--json]",
        discussion: """
            list: absolute paths.  tar: for `tar -X FILE -cf out.tar /abs/path`.  \
            restic: for `restic backup --exclude-file FILE`.  borg: for `borg create --exclude-from FILE`.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The tree to scan.") var path: String
    @Option(help: "list | tar | restic | borg") var format: String = "list"
    @Flag(
        help:
            "Print a JSON array of {path, reason}: marked (its own mark) or inherited (the tree given is below a marked directory)."
    )
    var json = false

    struct Entry: Encodable { var path: String, reason: String }

    func validate() throws {
        try requirePaths(path)
        if ExclusionList.Format(rawValue: format) == nil {
            throw ValidationError("unknown format \(format): use list, tar, restic or borg")
        }
    }

    func run() async throws {
        guard let format = ExclusionList.Format(rawValue: format) else {
            throw CLIError("unknown format \(format): use list, tar, restic or borg")
        }
        let list = try ExclusionList(scanning: URL(fileURLWithPath: path))
        if json {
            return printJSON(
                try list.excluded.map { url in
                    let inherited: Bool
                    if case .excludedByAncestor = try BackupExclusionAttribute.exclusion(of: url) {
                        inherited = true
                    } else {
                        inherited = false
                    }
                    return Entry(path: url.path, reason: inherited ? "inherited" : "marked")
                })
        }
        // Names go out as the bytes they are (a name that is not UTF-8 stays that name).
        FileHandle.standardOutput.write(Data(LosslessPath.bytes(of: try list.rendered(as: format))))
    }
}

struct BackupPassword: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup-password",
        abstract: "Set the password that restores backups elsewhere.",
        usage: "dpctl backup-password [--password-file <file>] [<options>]",
        discussion:
            "The class keys are wrapped under it into the data root's backup keybag. Needs the device unlocked (--passcode-file when a passcode is set, or the passcode asked on the terminal). Backups carry this keybag, so they restore on another device with the password, even when they were taken while locked."
    )

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Option(
        help: ArgumentHelp(
            "File holding the new backup password (default: asked twice on the terminal).", valueName: "file"))
    var passwordFile: String?

    func run() async throws {
        try requireOneStandardInput(unlock.passcodeFile, passwordFile)
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        // The passcode first (when the device is locked and a terminal can ask), then the password.
        try await PasscodePrompt.ask(keybag)
        let password = try PasscodePrompt.newSecret("backup password", file: passwordFile, option: "--password-file")
        try await PasscodePrompt.retrying(keybag) { try await keybag.setBackupPassword(password) }
        printOut("backup keybag written: \(keybag.backupKeybagURL.path)")
    }
}

struct Backup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Back up a directory, skipping what iOS skips.",
        usage: "dpctl backup <source> <destination> [<options>]",
        discussion: """
            Backs up SOURCE into the repository DEST, skipping marked items and, in apps' \
            containers, Library/Caches and tmp. Protected files are copied as ciphertext (nothing is decrypted: it works while locked); plain \
            files are sealed as class B objects, so nothing in a backup is readable without this device \
            or the backup password. Unchanged files are not copied again. The data root's backup keybag goes into the backup \
            so that it restores on another device with the backup password.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The directory to back up (an app's container, the data root, any directory).") var source: String
    @Argument(help: "The backup repository (created if needed).") var destination: String
    @Option(help: ArgumentHelp("Check that this backup password opens the backup keybag first.", valueName: "file"))
    var passwordFile: String?
    @Flag(help: "Walk and log only; write nothing.") var dryRun = false
    @Flag(help: "Print the log: Backed up: PATH for each file copied, Not backed up (attribute|blacklist): PATH.")
    var log = false
    @Flag(help: "Print a JSON summary.") var json = false
    @OptionGroup var quiet: QuietOption

    func validate() throws { try requirePaths(source, destination) }

    func run() async throws {
        // The device is opened locked (before first unlock): a backup needs no key.
        let keybag = try await device.openDevice(passcodeFile: nil)
        let root = keybag.root
        if let passwordFile {
            let url = URL(fileURLWithPath: keybag.layout.backupKeybag)
            guard FileManager.default.fileExists(atPath: url.path) else {
                throw CLIError("no backup keybag in \(root): set one with `dpctl backup-password`")
            }
            _ = try BackupKeybag(contentsOf: url).unlock(password: try readPasscode(passwordFile))
        } else if !FileManager.default.fileExists(atPath: keybag.layout.backupKeybag), !dryRun {
            printError(
                "dpctl: warning: no backup password is set: this backup restores only on this device (`dpctl backup-password` sets one)"
            )
        }
        let files = ProtectedFileManager(keybag: keybag)
        // What is left out by place is the container layer's knowledge, not the engine's.
        let policy = ContainerManager(files: files).backupExclusionPolicy(for: URL(fileURLWithPath: source))
        var engine = BackupEngine(
            source: URL(fileURLWithPath: source), repository: BackupRepository(url: URL(fileURLWithPath: destination)),
            files: files, dryRun: dryRun, policy: policy)
        // Class-managed databases are stored as they are (their changed pages only), not sealed whole.
        engine.encryptedDatabases = { url in
            await DatabasePageCheck(forDatabaseAt: url, keybag: keybag).map {
                EncryptedPageCheck(pageSize: $0.pageSize, authenticates: $0.authenticates)
            }
        }
        let configured = engine
        // The log's lines are the progress when they are asked for: no bar to break them.
        let bar = ProgressLine(
            enabled: !json && !quiet.quiet && !log && !dryRun && isatty(STDERR_FILENO) == 1, unit: "files")
        // With --json on standard output, the log goes to standard error: the output stays one JSON document.
        // Ctrl-C stops it between two files (or two MiB): it says how far it got, and the next run resumes.
        let (log, json, dryRun) = (self.log, self.json, self.dryRun)
        let summary: BackupSummary
        // A remote repository: the backup is made into this device's staging area, then sent.
        let remote =
            RemoteLocation.isRemote(destination) ? try remoteRepository(destination, layout: keybag.layout).0 : nil
        do {
            summary = try await runInterruptibly {
                let printLog: (String) -> Void = { line in
                    guard log || dryRun else { return }
                    json ? printError(line) : printOut(line)
                }
                let progress: (BackupProgress) -> Void = {
                    bar.update(done: $0.items, total: $0.totalItems, bytes: $0.bytes, totalBytes: $0.totalBytes)
                }
                if let remote { return try await remote.backUp(with: configured, log: printLog, progress: progress) }
                return try await configured.run(log: printLog, progress: progress)
            }
        } catch {
            bar.finish()
            throw error
        }
        bar.finish()
        if json {
            printJSON(summary)
        } else if !dryRun, !quiet.quiet {
            printOut(
                "backup \(summary.backup): \(counted(summary.files, "file")) (\(summary.protectedFiles) protected), \(summary.filesCopied) copied (\(humanSize(summary.bytesCopied))), skipped \(summary.skippedByAttribute) marked and \(summary.skippedByPolicy) excluded by place"
                    + (summary.skippedDeviceFiles > 0
                        ? "; left out \(counted(summary.skippedDeviceFiles, "file")) of a data root (the device's keys and keybag are never backed up)"
                        : ""))
        }
    }
}

struct Restore: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore",
        abstract: "Restore one backup into a new directory.",
        usage: "dpctl restore <backup> <destination> [<options>]",
        discussion: """
            BACKUP is REPOSITORY/backups/ID, or the repository itself for its latest finished \
            backup (`dpctl backups REPOSITORY` lists them). Protected files from another device \
            are rewrapped for this one with the backup password; their content is not decrypted. \
            A file whose stored content is missing or damaged is left out and named, everything \
            else is restored, and the exit status is 4 (--all-or-nothing restores nothing then).
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The backup: REPOSITORY/backups/ID, or REPOSITORY for its latest.") var backup: String
    @Argument(help: "Where to restore (must not exist, or be empty).") var destination: String
    @Option(help: ArgumentHelp("The backup password (for files from another device).", valueName: "file"))
    var passwordFile: String?
    @OptionGroup var unlock: UnlockOptions
    @Flag(
        help:
            "Apply permission bits as backed up instead of clamping them with the umask (set-id and sticky bits are never restored)."
    )
    var keepModes = false
    @Option(
        help: ArgumentHelp(
            "Restore only this path of the backup (relative to the backed-up directory; a directory with all below it). Repeatable.",
            valueName: "path"))
    var include: [String] = []
    @Flag(
        help: "Restore nothing unless every file is intact (the default restores the intact ones and names the rest).")
    var allOrNothing = false
    @Flag(help: "Print a JSON summary.") var json = false
    @OptionGroup var quiet: QuietOption

    func validate() throws { try requirePaths(backup, destination); try requirePaths(include) }

    func run() async throws {
        try requireOneStandardInput(unlock.passcodeFile, passwordFile)
        let files = try await device.openFiles(unlock)
        let bar = ProgressLine(enabled: !json && !quiet.quiet && isatty(STDERR_FILENO) == 1)
        let password = try passwordFile.map(readPasscode)
        let (backup, remote) = try await resolveBackup(
            self.backup, files: files, password: password, quiet: quiet.quiet)
        defer { remote?.discardMirror() }
        // A failed restore leaves nothing behind: asking for the passcode and trying again is
        // safe. Its log is printed once, for the attempt that restored.
        let logged = Mutex<[String]>([])
        let options = RestoreOptions(keepModes: keepModes, include: include, allOrNothing: allOrNothing)
        let destination = URL(fileURLWithPath: self.destination)
        let summary = try await PasscodePrompt.retrying(files.keybag) {
            logged.withLock { $0.removeAll() }
            // Ctrl-C stops it; what was written goes, and it says so.
            return try await runInterruptibly {
                try await RestoreEngine(backup: backup)
                    .restore(
                        to: destination, files: files, password: password, options: options,
                        log: { line in logged.withLock { $0.append(line) } },
                        progress: {
                            bar.update(done: $0.items, total: $0.totalItems, bytes: $0.bytes, totalBytes: $0.totalBytes)
                        })
            }
        }
        bar.finish()
        for line in logged.withLock({ $0 }) { json ? printError(line) : printOut(line) }
        if json {
            printJSON(summary)
        } else if !quiet.quiet {
            printOut(
                "restored \(counted(summary.files, "file")), \(counted(summary.directories, "directory", "directories")), \(counted(summary.symlinks, "link")); \(counted(summary.adoptedFiles, "protected file")) rewrapped for this device"
                    + (summary.skippedOutwardLinks > 0
                        ? "; \(counted(summary.skippedOutwardLinks, "link")) leading outside left out" : ""))
        }
        if !summary.damagedFiles.isEmpty {
            // The log named each one already; the count and the status say it was not whole.
            printError(
                "dpctl: \(counted(summary.damagedFiles.count, "damaged file")) not restored, everything else was (`dpctl verify` names the damaged objects)"
            )
            throw ExitCode(ExitStatus.damaged.rawValue)
        }
    }
}

struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Check that a backup is authentic and complete.",
        usage: "dpctl verify <backup> [--json] [<options>]",
        discussion: """
            BACKUP is REPOSITORY/backups/ID, or the repository for its latest finished backup. \
            Needs no passcode on the device that made the backup (on another device, the backup \
            password); naming the files of a damaged object needs the device unlocked once since \
            it started. Exits 4 when anything is damaged.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The backup: REPOSITORY/backups/ID, or REPOSITORY for its latest.") var backup: String
    @Option(help: ArgumentHelp("The backup password (for a backup made on another device).", valueName: "file"))
    var passwordFile: String?
    @OptionGroup var unlock: UnlockOptions
    @Flag(help: "Print the result as JSON (damage still exits 4).") var json = false
    @OptionGroup var quiet: QuietOption

    func validate() throws { try requirePaths(backup) }

    func run() async throws {
        try requireOneStandardInput(unlock.passcodeFile, passwordFile)
        let files = try await device.openFiles(unlock)
        let password = try passwordFile.map(readPasscode)
        let result: BackupVerification
        do {
            let (backup, remote) = try await resolveBackup(
                self.backup, files: files, password: password, quiet: quiet.quiet)
            defer { remote?.discardMirror() }
            result = try await RestoreEngine(backup: backup).verification(files: files, password: password)
        } catch  where json {
            // A forged, incomplete or missing backup: scripts still get a JSON answer.
            printJSON(
                VerificationFailure(
                    backup: self.backup, authentic: false,
                    error: LosslessPath.display(DisplayedPaths.apply(String(describing: error)))))
            throw error
        }
        if json {
            printJSON(result)
        } else if result.isIntact {
            if !quiet.quiet { printOut("ok: \(result.backup): \(result.objectsChecked) objects verified") }
        } else {
            for problem in result.problems { printOut("damaged: \(LosslessPath.display(problem.description))") }
            if !result.filesNamed {
                printError("dpctl: note: the files of these objects are named once the device has been unlocked")
            }
        }
        if !result.isIntact {
            throw ExitCode(ExitStatus.damaged.rawValue)
        }
    }
}

/// `verify --json` when no verification could run (FORMAT §5.0).
struct VerificationFailure: Encodable {
    var backup: String
    var authentic: Bool
    var error: String
}

struct Backups: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backups",
        abstract: "List a repository's backups (as restic snapshots).",
        discussion: """
            Read without any key: nothing listed is authenticated until `dpctl verify` checks \
            it. ELSEWHERE says whether a backup carries a backup keybag (restores on another \
            device with the backup password); an interrupted backup shows as incomplete.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The backup repository.") var repository: String
    @Flag(help: "Print the list as JSON.") var json = false

    func validate() throws { try requirePaths(repository) }

    func run() async throws {
        var listings: [BackupListing]
        device.bootstrapLogging()
        if RemoteLocation.isRemote(repository) {
            // Fetched into this device's mirror (small files only), listed with the remote's paths.
            let keybag = try await Keybag.open(root: try device.resolvedRoot)
            let (remote, _) = try remoteRepository(repository, layout: keybag.layout)
            listings = try await remote.fetchForReading().listBackups()
            for i in listings.indices { listings[i].path = remote.remotePath(of: listings[i].path) }
        } else {
            let url = URL(fileURLWithPath: repository)
            guard BackupRepository.isRepository(url) else {
                throw CLIError("\(repository) is not a backup repository (it has no backups/ and objects/)")
            }
            listings = BackupRepository(url: url).listBackups()
        }
        if json { return printJSON(listings) }
        guard !listings.isEmpty else { printOut("no backups in \(repository)"); return }
        // Only to say "this device": opened as it is, never unlocked (no attempt is counted).
        let thisDevice = try? await Keybag.open(root: try device.resolvedRoot).id
        let formatter = ISO8601DateFormatter()
        var rows = [["ID", "CREATED (UTC)", "OBJECTS", "ELSEWHERE", "DEVICE", "STATE"]]
        for listing in listings {
            rows.append([
                LosslessPath.display(listing.id), listing.created.map { formatter.string(from: $0) } ?? "?",
                listing.objects.map(String.init) ?? "?",
                listing.carriesBackupKeybag ? "yes" : "no",
                listing.device.map { $0 == thisDevice ? "this device" : String($0.uuidString.prefix(8)).lowercased() }
                    ?? "?",
                listing.isComplete ? "complete" : "incomplete",
            ])
        }
        printOut(table(rows, rightAligned: [2]))
        printOut(
            "\(listings.filter(\.isComplete).count) complete backup(s); restore and verify take the latest that authenticates for \(LosslessPath.display(repository))"
        )
    }
}

/// The backup a command was given: the backup itself, or a repository's latest one that
/// authenticates (a newer one that does not is named on standard error and passed over).
func resolveBackup(
    _ path: String, files: ProtectedFileManager, password: String?, quiet: Bool
) async throws -> (URL, RemoteRepository?) {
    if RemoteLocation.isRemote(path) {
        let (backup, remote) = try await fetchRemoteBackup(path, files: files, password: password, quiet: quiet)
        return (backup, remote)
    }
    let url = URL(fileURLWithPath: path)
    guard POSIXFile.status(url.path) != nil else { throw ProtectedFileError.noSuchFile(path: url.path) }
    guard BackupRepository.isRepository(url) else { return (url, nil) }
    let latest = try await BackupRepository(url: url).latestAuthenticBackup(files: files, password: password) {
        skipped, why in
        printError(
            "dpctl: warning: passing over \(LosslessPath.display(skipped.lastPathComponent)): \(LosslessPath.display(String(describing: why)))"
        )
    }
    if !quiet { printError("dpctl: using the latest backup, \(LosslessPath.display(latest.lastPathComponent))") }
    return (latest, nil)
}
