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
