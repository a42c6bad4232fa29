import ArgumentParser
import DataProtection
import DataProtectionAudit
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation

struct Audit: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Find data-storage mistakes, and fix them.",
        usage: "dpctl audit [<path>] [<options>]",
        discussion: """
            Plain or weakly protected files, plaintext databases, backed-up offline data, weak \
            App Groups, long-lived grants, loose modes. Audits a directory tree (PATH; a container's directory is audited as that container), \
            an app (--app: its container, its groups' containers, its grants), or the whole device \
            (--all, the default: the data root's modes, every container, every grant). It reads \
            headers, attributes and metadata only: no passcode, works while locked, never decrypts.

            Rules: \(AuditRule.allCases.map { "\($0.id) \($0.name) (\($0.severity.rawValue))" }.joined(separator: ", ")).

            --fix applies the safe fixes after listing them — re-protect (needs the keys: \
            --passcode-file), mark do-not-back-up, tighten modes, drop grants of removed apps — \
            and never deletes data; the rest are listed with the command that fixes them.

            Exit status: 0 no finding at or above --min-severity, 6 findings at or above it \
            (after --fix: those left), 1 the audit could not run.
            """)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("A directory tree to audit.", valueName: "path")) var path: String?
    @Option(
        help: ArgumentHelp("Audit this app: its container, its groups' containers and its grants.", valueName: "id"))
    var app: String?
    @Flag(help: "Audit the whole device (the default).") var all = false
    @Flag(help: "Print JSON.") var json = false
    @Flag(help: "Print a SARIF 2.1.0 log (GitHub code scanning, CI dashboards).") var sarif = false
    @Option(
        help: ArgumentHelp("Report findings of this severity and above: low, medium or high.", valueName: "severity"))
    var minSeverity: AuditSeverity = .low
    @Flag(help: "Apply the safe fixes, after listing them; never deletes data.") var fix = false
    @Option(
        help: ArgumentHelp(
            "Files at least this large (MB) under Documents or Library must be marked do-not-back-up.", valueName: "MB")
    )
    var largeFile: Double = 5
    @Option(help: ArgumentHelp("Inbox files older than this many days are reported.", valueName: "days")) var inboxAge:
        Double = 7

    func validate() throws {
        if [path != nil, app != nil, all].filter({ $0 }).count > 1 {
            throw ValidationError("name one of PATH, --app ID or --all")
        }
        if json && sarif { throw ValidationError("choose --json or --sarif") }
        // At most a petabyte and a century: finite numbers that fit the auditor's integers.
        guard largeFile.isFinite, largeFile > 0, largeFile <= 1e9 else {
            throw ValidationError("--large-file must be a number of MB above 0, at most 1e9")
        }
        guard inboxAge.isFinite, inboxAge >= 0, inboxAge <= 36_500 else {
            throw ValidationError("--inbox-age must be a number of days from 0 to 36500")
        }
    }

    func run() async throws {
        let auditor = Auditor(
            options: AuditOptions(largeFileThreshold: Int64(largeFile * 1_000_000), inboxMaxAge: inboxAge * 86_400))
        // The audit reads the data root without its keybag (a device whose secret cannot be
        // loaded is still audited); the device is opened only to fix, once, after modes.
        let catalog = path == nil ? ContainerCatalog(layout: DataRootLayout(root: try device.resolvedRoot)) : nil
        let (report, base) = try audit(auditor, catalog)
        var final = report
        if fix {
            // A container default set in one pass makes its weaker files findings of the next:
            // up to three passes, until nothing automatic is left.
            var manager: ContainerManager?
            var opened = false
            for pass in 1...3 {
                let chosen = final.findings(atLeast: minSeverity).filter(\.fix.isAutomatic)
                if chosen.isEmpty {
                    if pass == 1 {
                        let pending = final.findings(atLeast: minSeverity).count
                        printError(
                            "nothing to fix automatically\(pending > 0 ? " (\(pending) finding\(pending == 1 ? "" : "s") need a person)" : "")"
                        )
                    }
                    break
                }
                printError("fixing \(chosen.count) finding\(chosen.count == 1 ? "" : "s"):")
                for finding in chosen { printError("  \(finding.rule.id) \(command(for: finding))") }
                // Modes first, with no device: a loose device secret keeps the device from opening.
                var outcomes = await AuditFixer().apply(
                    chosen.filter { if case .setMode = $0.fix { true } else { false } })
                let rest = chosen.filter { if case .setMode = $0.fix { false } else { true } }
                if !rest.isEmpty {
                    if !opened {
                        manager = try? await containerManager(device, passcodeFile: unlock.passcodeFile)
                        opened = true
                    }
                    outcomes += await AuditFixer(manager: manager).apply(rest)
                }
                for outcome in outcomes {
                    if let error = outcome.error { printError("  not fixed: \(finding(outcome.finding)): \(error)") }
                }
                (final, _) = try audit(auditor, catalog)
                if outcomes.allSatisfy({ $0.error != nil }) { break }
            }
        }
        let shown = final.findings(atLeast: minSeverity)
        if json {
            printOut(String(decoding: try final.json(minimum: minSeverity, command: command(for:)), as: UTF8.self))
        } else if sarif {
            printOut(
                String(
                    decoding: try final.sarif(base: base, minimum: minSeverity, command: command(for:)), as: UTF8.self))
        } else {
            printTable(shown, examined: final.itemsExamined, base: base)
        }
        if !shown.isEmpty { throw ExitCode(ExitStatus.findings.rawValue) }
    }

    /// The report and the directory SARIF locations are relative to.
    private func audit(_ auditor: Auditor, _ catalog: ContainerCatalog?) throws -> (AuditReport, String) {
        if let path {
            let url = URL(fileURLWithPath: path)
            return (try auditor.audit(tree: url), url.standardizedFileURL.path)
        }
        guard let catalog else { throw CLIError("no device") }
        guard FileManager.default.fileExists(atPath: catalog.layout.root) else {
            throw CLIError("\(LosslessPath.display(catalog.layout.root)): no data root here")
        }
        if let app { return (try auditor.audit(app: try appIdentifier(app), in: catalog), catalog.layout.root) }
        return (try auditor.auditDevice(catalog), catalog.layout.root)
    }

    private func printTable(_ findings: [AuditFinding], examined: Int, base: String) {
        /// Paths below the audited directory are shown relative to it.
        func shown(_ path: String) -> String {
            LosslessPath.display(path.hasPrefix(base + "/") ? String(path.dropFirst(base.count + 1)) : path)
        }
        guard !findings.isEmpty else {
            printOut("no findings at or above \(minSeverity.rawValue) (\(examined) items examined)")
            return
        }
        var rows = [["SEVERITY", "RULE", "PATH", "FINDING"]]
        for f in findings { rows.append([f.severity.rawValue, f.rule.id, shown(f.path), f.detail]) }
        printOut(table(rows))
        printOut("")
        printOut("why and how to fix:")
        var seen = Set<AuditRule>()
        for f in findings where seen.insert(f.rule).inserted {
            printOut("  \(f.rule.id) \(f.rule.name): \(f.rule.why)")
        }
        for f in findings {
            printOut("  \(f.rule.id) \(shown(f.path)): \(f.fix.isAutomatic ? "[--fix] " : "")\(command(for: f))")
        }
        let counts = AuditSeverity.allCases.reversed().map { s in
            "\(findings.filter { $0.severity == s }.count) \(s.rawValue)"
        }
        printOut(
            "\(findings.count) finding\(findings.count == 1 ? "" : "s") (\(counts.joined(separator: ", "))) in \(examined) items below \(LosslessPath.display(base))"
        )
    }

    private func finding(_ f: AuditFinding) -> String { "\(f.rule.id) \(LosslessPath.display(f.path))" }

    /// The command line that fixes a finding.
    func command(for finding: AuditFinding) -> String {
        let path = shellQuoted(finding.path)
        let root = device.root.map { " --root \(shellQuoted($0))" } ?? ""
        switch finding.fix {
        case .protect(let cls): return "dpctl protect\(root) \(path) --class \(cls.letter)"
        case .excludeFromBackup: return "dpctl exclude\(root) \(path)"
        case .setAppDefault(let app, let cls): return "dpctl app set-protection\(root) \(app) \(cls.letter) --reprotect"
        case .setGroupDefault(let group, let cls):
            return "dpctl group set-protection\(root) \(group) \(cls.letter) --reprotect"
        case .setMode(let mode): return "chmod \(String(mode, radix: 8)) \(path)"
        case .removeGrant(let id), .limitGrant(let id): return "dpctl revoke\(root) \(id.uuidString)"
        case .encryptDatabase(let cls): return "dpctl sql\(root) \(path) --import-plaintext --class \(cls.letter)"
        case .protectOnceNoOtherProgramReadsIt(let cls):
            return
                "dpctl protect\(root) \(path) --class \(cls.letter), once no program reads it directly (a database passphrase, an app that does not use protected files)"
        case .keepDatabaseKeyProtected:
            return
                "keep its key in a protected file (dpctl protect KEYFILE) or move its data to a class-managed database (dpctl sql DB --class C)"
        case .removeStaleFile: return "with no connection open, check and remove \(path)"
        case .moveToKeychain(let key):
            return "move \"\(key)\" to the keychain, then remove it from the group's preferences"
        case .stopExposingDocuments(let app):
            return "reinstall \(app) without --document-browser if it does not need it (back up its data first)"
        case .deleteInboxFile: return "have the app delete \(path) once handled"
        case .removeLink: return "replace or remove the link \(path)"
        case .inspectDamagedFile: return "dpctl cat \(path) says what is wrong; restore it from a backup"
        case .removeSpecialFile: return "remove \(path) once no program uses it"
        }
    }

    /// A path as a shell word that names the same bytes: bare when plain, single-quoted when
    /// printable UTF-8, else `$'…'` with `\\xHH` for every other byte.
    private func shellQuoted(_ path: String) -> String {
        let bytes = LosslessPath.bytes(of: path)
        let plain = bytes.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                || "/._-+:@%".utf8.contains(b)
        }
        if plain { return path }
        if String(validating: bytes, as: UTF8.self) != nil, !bytes.contains(where: { $0 < 0x20 || $0 == 0x7F }) {
            return "'" + path.replacingOccurrences(of: "'", with: "'\\''") + "'"
        }
        return "$'"
            + bytes.map { b in
                b >= 0x20 && b < 0x7F && b != 0x27 && b != 0x5C
                    ? String(UnicodeScalar(b)) : String(format: "\\x%02X", b)
            }.joined() + "'"
    }
}

extension AuditSeverity: ExpressibleByArgument {}
