import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionSystem
import Foundation

struct Forget: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "forget",
        abstract: "Forget backups a policy does not keep.",
        usage: "dpctl forget <repository> [<id> ...] [--keep-daily N ...] [<options>]",
        discussion: """
            Each device's backups of each directory are decided on their own, newest first: \
            --keep-last N keeps the last N; --keep-hourly/daily/weekly/monthly/yearly N keep the \
            newest backup of each of the last N hours, days, ISO weeks, months and years that \
            have one (local time). Only backups that authenticate count; others are left alone \
            and named (give their IDs to remove them). Objects stay until `dpctl prune`.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The backup repository.") var repository: String
    @Argument(help: "Backups to remove by ID, whatever they are (instead of a policy).") var ids: [String] = []
    @Option(help: ArgumentHelp("Keep the last N backups.", valueName: "N")) var keepLast: Int?
    @Option(help: ArgumentHelp("Keep the newest backup of each of the last N hours.", valueName: "N")) var keepHourly:
        Int?
    @Option(help: ArgumentHelp("Keep the newest backup of each of the last N days.", valueName: "N")) var keepDaily:
        Int?
    @Option(help: ArgumentHelp("Keep the newest backup of each of the last N weeks.", valueName: "N")) var keepWeekly:
        Int?
    @Option(help: ArgumentHelp("Keep the newest backup of each of the last N months.", valueName: "N")) var keepMonthly:
        Int?
    @Option(help: ArgumentHelp("Keep the newest backup of each of the last N years.", valueName: "N")) var keepYearly:
        Int?
    @Flag(help: "Say what would be removed; remove nothing.") var dryRun = false
    @Flag(help: "Print the decisions as JSON.") var json = false
    @Option(help: ArgumentHelp("The backup password (for backups made on another device).", valueName: "file"))
    var passwordFile: String?
    @OptionGroup var unlock: UnlockOptions

    var policy: BackupRetentionPolicy {
        BackupRetentionPolicy(
            keepLast: keepLast ?? 0, keepHourly: keepHourly ?? 0, keepDaily: keepDaily ?? 0,
            keepWeekly: keepWeekly ?? 0,
            keepMonthly: keepMonthly ?? 0, keepYearly: keepYearly ?? 0)
    }

    func validate() throws {
        try requirePaths(repository)
        if [keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly].contains(where: { ($0 ?? 1) < 1 }) {
            throw ValidationError("a --keep-… count is 1 or more")
        }
        if !ids.isEmpty, policy.keepsSomething { throw ValidationError("give backup IDs or --keep-… rules, not both") }
        if ids.isEmpty, !policy.keepsSomething {
            throw ValidationError(
                "give at least one --keep-… rule (e.g. --keep-daily 7), or the IDs of backups to remove")
        }
    }

    func run() async throws {
        let repository = BackupRepository(url: URL(fileURLWithPath: self.repository))
        let report: ForgetReport
        if ids.isEmpty {
            try requireOneStandardInput(unlock.passcodeFile, passwordFile)
            let files = try await device.openFiles(unlock)
            let password = try passwordFile.map(readPasscode)
            let remote =
                RemoteLocation.isRemote(self.repository)
                ? try remoteRepository(self.repository, layout: files.keybag.layout).0 : nil
            // Each backup's directory is in its sealed manifest: class B, the device unlocked once.
            report = try await PasscodePrompt.retrying(files.keybag) {
                if let remote {
                    return try await remote.forget(policy: policy, files: files, password: password, dryRun: dryRun)
                }
                return try await repository.forget(policy: policy, files: files, password: password, dryRun: dryRun)
            }
        } else if RemoteLocation.isRemote(self.repository) {
            let keybag = try await device.openDevice(passcodeFile: nil)
            report = try await remoteRepository(self.repository, layout: keybag.layout).0.forget(
                ids: ids, dryRun: dryRun)
        } else {
            report = try repository.forget(ids: ids, dryRun: dryRun)
        }
        if json { return printJSON(report) }
        let formatter = ISO8601DateFormatter()
        func rows(_ items: [ForgetReport.Item], reasons: Bool) -> [[String]] {
            items.map {
                [
                    LosslessPath.display($0.id), $0.created.map { formatter.string(from: $0) } ?? "?",
                    LosslessPath.display($0.source ?? ""),
                ] + (reasons ? [$0.reasons.joined(separator: ", ")] : [])
            }
        }
        if !report.kept.isEmpty {
            printOut("keep \(counted(report.kept.count, "backup")):")
            printOut(table([["ID", "CREATED (UTC)", "DIRECTORY", "KEPT AS"]] + rows(report.kept, reasons: true)))
        }
        printOut(
            "\(dryRun ? "would remove" : "removed") \(counted(report.removed.count, "backup"))\(report.removed.isEmpty ? "" : ":")"
        )
        if !report.removed.isEmpty {
            printOut(table([["ID", "CREATED (UTC)", "DIRECTORY"]] + rows(report.removed, reasons: false)))
        }
        for item in report.leftAlone {
            printError("dpctl: left alone: \(LosslessPath.display(item.id)): \(LosslessPath.display(item.reason))")
        }
        if !dryRun, !report.removed.isEmpty { printOut("their objects stay until `dpctl prune \(self.repository)`") }
    }
}

struct Prune: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prune",
        abstract: "Remove unused objects and interrupted backups.",
        usage: "dpctl prune <repository> [--dry-run] [--json]",
        discussion: """
            Holds the repository's writer lock for its whole run: a backup running into the \
            repository makes it exit 75 (busy) at once, and a backup started during it is \
            refused the same way; nothing is removed that a finished backup lists. Needs no key.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The backup repository.") var repository: String
    @Flag(help: "Say what would be removed; remove nothing.") var dryRun = false
    @Flag(help: "Print the result as JSON.") var json = false

    func validate() throws { try requirePaths(repository) }

    func run() async throws {
        let report: PruneReport
        if RemoteLocation.isRemote(repository) {
            let keybag = try await device.openDevice(passcodeFile: nil)
            report = try await remoteRepository(repository, layout: keybag.layout).0.prune(dryRun: dryRun)
        } else {
            report = try BackupRepository(url: URL(fileURLWithPath: repository)).prune(dryRun: dryRun)
        }
        if json { return printJSON(report) }
        let verb = dryRun ? "would remove" : "removed"
        printOut(
            "\(verb) \(counted(report.objectsRemoved, "object")) (\(humanSize(report.bytesRemoved))) no backup uses"
                + " and \(counted(report.incompleteBackupsRemoved.count, "interrupted backup"))"
                + (report.forgottenBackupsRemoved.isEmpty
                    ? "" : " (and what \(counted(report.forgottenBackupsRemoved.count, "interrupted forget")) left)")
                + ";"
                + " kept \(counted(report.objectsKept, "object")) (\(humanSize(report.bytesKept)))")
    }
}
