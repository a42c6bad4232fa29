import ArgumentParser
import DataProtection
import DataProtectionBackup
import Foundation

struct Exclude: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mark a file or directory \"do not back up\" (iOS's isExcludedFromBackup).",
        discussion: """
            Sets the extended attribute user.xdg.robots.backup=false. A directory's mark covers \
            everything below it; a marked directory also gets a CACHEDIR.TAG, so that \
            `tar|restic|borg --exclude-caches` leave it out too.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The file or directory (it must exist).") var path: String
    @Flag(help: "Do not write a CACHEDIR.TAG into a marked directory.") var noCachedirTag = false

    func run() async throws {
        try await reportingErrors {
            try BackupMark.set(excluded: true, for: URL(fileURLWithPath: path), cacheDirectoryTag: !noCachedirTag)
        }
    }
}

struct Include: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove the \"do not back up\" mark (and the CACHEDIR.TAG dpctl wrote).",
        discussion: "An item below a marked directory stays excluded until that directory is included.")

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The file or directory.") var path: String

    func run() async throws {
        try await reportingErrors {
            let url = URL(fileURLWithPath: path)
            try BackupMark.set(excluded: false, for: url)
            if case .excludedByAncestor(let ancestor) = try BackupMark.exclusion(of: url) {
                FileHandle.standardError.write(Data("dpctl: note: \(path) is still excluded by its ancestor \(ancestor.path)\n".utf8))
            }
        }
    }
}

struct Exclusions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the marked items below PATH as an exclude list for a backup tool.",
        discussion: """
            list: absolute paths.  tar: for `tar -X FILE -cf out.tar /abs/path`.  \
            restic: for `restic backup --exclude-file FILE`.  borg: for `borg create --exclude-from FILE`.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The tree to scan.") var path: String
    @Option(help: "list | tar | restic | borg") var format: String = "list"

    func run() async throws {
        try await reportingErrors {
            guard let format = ExclusionList.Format(rawValue: format) else {
                throw CLIError("unknown format \(format): use list, tar, restic or borg")
            }
            let list = try ExclusionList(scanning: URL(fileURLWithPath: path))
            FileHandle.standardOutput.write(Data(try list.rendered(as: format).utf8))
        }
    }
}
