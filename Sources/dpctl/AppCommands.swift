import ArgumentParser
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionLifecycle
import DataProtectionSharing
import Foundation
import Synchronization

extension AppIdentifier: ExpressibleByArgument {
    public init?(argument: String) { try? self.init(argument) }
}

/// Parses an app identifier, failing with the rule (not ArgumentParser's generic message).
func appIdentifier(_ text: String) throws -> AppIdentifier { try AppIdentifier(text) }
func groupIdentifier(_ text: String) throws -> AppGroupIdentifier { try AppGroupIdentifier(text) }

struct App: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "app",
        abstract: "Install, run, background and remove apps.",
        discussion: """
            An app is a reverse-DNS identifier with a data container under the data root \
            (Containers/Data/Application/UUID: Documents, Library, tmp, as on iOS). `dpctl app run` \
            runs a command as the app, confined: it sees its own container, its App Groups' \
            containers and the system, nothing else of the data root or of your home.
            """,
        subcommands: [
            AppInstall.self, AppList.self, AppInfo.self, AppRun.self, AppBackground.self, AppForeground.self,
            AppState.self, AppStop.self,
            AppSetProtection.self, AppSetDocumentBrowser.self, AppUninstall.self, AppServeFileSystem.self,
        ])
}

/// Opens the device (locked, unless a passcode file is given) and the container manager.
func containerManager(_ device: DeviceOptions, passcodeFile: String? = nil) async throws -> ContainerManager {
    ContainerManager(files: ProtectedFileManager(keybag: try await device.openDevice(passcodeFile: passcodeFile)))
}

struct AppInstall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "install",
        abstract: "Register an app and create its container.",
        usage: "dpctl app install <id> [<options>]",
        discussion: """
            The default protection class (the com.apple.developer.default-data-protection \
            entitlement; iOS's default is completeUntilFirstUserAuthentication) is set on the \
            container's root, so every file the app creates inherits it. Group containers are \
            created with their first member, at iOS's default class until `dpctl group \
            set-protection` (or a member app) sets theirs.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier: \(AppIdentifier.rule).", valueName: "id")) var identifier:
        String
    @Option(help: ArgumentHelp("The container's default class: \(ProtectionClass.spellings).", valueName: "class"))
    var defaultProtection: ProtectionClass = .default
    @Option(
        name: .customLong("group"),
        help: ArgumentHelp(
            "An App Group the app belongs to (repeatable): \(AppGroupIdentifier.rule).", valueName: "group-id"))
    var groups: [String] = []
    @Flag(help: "Expose Documents to other apps through grants (UISupportsDocumentBrowser; off by default).")
    var documentBrowser = false
    @Flag(
        help:
            "The app reads its files through DataProtection (CurrentApp.files), so `audit --fix` may protect its plain files in place."
    )
    var usesProtectedFiles = false
    @Flag(
        help:
            "The network entitlement: the app reaches the outside world through user-mode networking (slirp4netns), never the host's loopback services; off by default."
    )
    var network = false
    @Option(
        help: ArgumentHelp(
            "Processes and threads the app may have at once (systemd's TasksMax; default \(AppResourceLimits.defaultTasks)).",
            valueName: "n"))
    var tasksMax: Int?
    @Option(
        help: ArgumentHelp(
            "Memory the app may use, as 512M or 2G (systemd's MemoryMax; default half of this machine's). Held where a memory cgroup can be made.",
            valueName: "size"))
    var memoryMax: String?

    func run() async throws {
        let id = try appIdentifier(identifier)
        let groupIDs = try groups.map(groupIdentifier)
        let memory = try memoryMax.map { text in
            guard let bytes = AppResourceLimits.parseSize(text) else {
                throw ValidationError("--memory-max \(text): expected a size such as 512M or 2G")
            }
            return bytes
        }
        let app = try await containerManager(device).install(
            id, defaultProtection: defaultProtection, groups: groupIDs, documentBrowser: documentBrowser,
            usesProtectedFiles: usesProtectedFiles, network: network,
            tasksMax: tasksMax, memoryMax: memory)
        printOut("installed \(app.identifier) in \(app.url.path) (default class \(app.defaultProtection))")
    }
}

struct AppList: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List the installed apps.")
    @OptionGroup var device: DeviceOptions
    @Flag(help: "Print JSON.") var json = false

    func run() async throws {
        let manager = try await containerManager(device)
        let apps = manager.apps()
        if json { return printJSON(apps.map { AppReport($0, manager: manager) }) }
        guard !apps.isEmpty else { return printOut("no apps installed") }
        printOut(
            table(
                [["APP", "CLASS", "GROUPS", "CONTAINER"]]
                    + apps.map {
                        [
                            $0.identifier.rawValue, $0.defaultProtection.shortName,
                            $0.groups.map(\.rawValue).joined(separator: ","), $0.url.path,
                        ]
                    }))
    }
}

struct AppInfo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "info", abstract: "Show an app's container, class, groups, entitlements.")
    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String
    @Flag(help: "Print JSON.") var json = false

    func run() async throws {
        let manager = try await containerManager(device)
        let app = try manager.app(try appIdentifier(identifier))
        let report = AppReport(app, manager: manager)
        if json { return printJSON(report) }
        var lines = [
            "app:              \(report.identifier)",
            "container:        \(report.container)",
            "uuid:             \(report.uuid)",
            "default class:    \(report.defaultProtection)"
                + (report.defaultProtection != report.entitledProtection
                    ? " (entitlement: \(report.entitledProtection))" : ""),
            "document browser: "
                + (report.documentBrowser
                    ? "yes: Documents is EXPOSED — you can grant other apps its items (dpctl grant); never Documents/Inbox"
                    : "no: Documents is not exposed to other apps"),
            "reads files:      "
                + (report.usesProtectedFiles
                    ? "through DataProtection: `audit --fix` may protect its plain files in place"
                    : "as they are on disk, perhaps: `audit --fix` leaves its plain files for you"),
            "network:          "
                + (report.network
                    ? "yes, through user-mode networking (slirp4netns); never the host's loopback" : "none"),
            "limits:           \(report.tasksMax) tasks, \(AppResourceLimits.describe(bytes: report.memoryMax)) of memory"
                + (app.metadata.tasksMax == nil && app.metadata.memoryMax == nil ? " (the defaults)" : ""),
            "installed:        \(report.created)",
        ]
        for group in report.groups {
            lines.append(
                "group:            \(group.identifier) \(group.container ?? "(missing)") class \(group.defaultProtection ?? "-")\(group.protectionSet ? "" : " (not set: iOS's default)")"
            )
        }
        for (key, value) in report.entitlements.sorted(by: { $0.key < $1.key }) {
            lines.append("entitlement:      \(key) = \(value)")
        }
        printOut(lines.joined(separator: "\n"))
    }
}

/// What `app info --json` and `app list --json` print.
struct AppReport: Encodable {
    struct Group: Encodable {
        var identifier: String
        var container: String?
        var defaultProtection: String?
        /// The class's short name, as every dpctl JSON writes a class (FORMAT §5.0).
        var protection: String?
        var protectionSet: Bool
    }
    var identifier: String
    var uuid: String
    var container: String
    var defaultProtection: String
    var entitledProtection: String
    /// `defaultProtection`'s short name, as every dpctl JSON writes a class (FORMAT §5.0);
    /// `defaultProtection` and `entitledProtection` keep Apple's names, as Info.plist has them.
    var protection: String
    var documentBrowser: Bool
    var usesProtectedFiles: Bool
    var network: Bool
    var tasksMax: Int
    var memoryMax: Int64
    var created: String
    var groups: [Group]
    var entitlements: [String: String]

    init(_ app: AppContainer, manager: ContainerManager) {
        identifier = app.identifier.rawValue
        uuid = app.uuid.uuidString
        container = app.url.path
        defaultProtection = app.defaultProtection.iOSName
        entitledProtection = app.entitledProtection.iOSName
        protection = app.defaultProtection.shortName
        documentBrowser = app.supportsDocumentBrowser
        usesProtectedFiles = app.metadata.usesProtectedFiles == true
        network = app.metadata.network == true
        let limits = AppResourceLimits(metadata: app.metadata)
        tasksMax = limits.tasks
        memoryMax = limits.memoryBytes
        created = ISO8601DateFormatter().string(from: app.metadata.created)
        groups = app.groups.map { id in
            let group = try? manager.group(id)
            return Group(
                identifier: id.rawValue, container: group?.url.path,
                defaultProtection: group?.defaultProtection.iOSName,
                protection: group?.defaultProtection.shortName, protectionSet: group?.isProtectionSet ?? false)
        }
        entitlements = app.metadata.entitlements
    }
}

struct AppRun: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run COMMAND as the app, in its sandbox.",
        usage: "dpctl app run <id> [<options>] -- [<command> ...]",
        discussion: """
            Inside, the app sees its container (NSHomeDirectory(); Documents, Library and tmp \
            writable, Documents/Inbox readable and deletable only), its groups' containers, and \
            the system read-only — nothing else of the data root or your home. The containers \
            are served by the protected file system: every file any program of the app writes \
            there is protected, with the container's class or stronger, and the app holds no key. \
            Its only way out is a socket to this process, which tells it the lock state (it can \
            never unlock, lock or erase the device). The app ends when this process ends, and this \
            process exits with the app's status. Needs bubblewrap, Landlock ABI 3 (Linux 6.2) and \
            fuse3.

            The app has iOS's lifecycle: `dpctl app background/foreground ID` and the device's \
            lock move it; in the background with no background task it is suspended after a \
            few seconds; SIGTERM or SIGINT (or `dpctl app stop ID`) sends willTerminate and \
            SIGTERM to every process of the app, then SIGKILL to what is left after the grace \
            period (--grace, 5s by default; a second signal ends it at once).
            """)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Flag(help: "Run the app unconfined (it still gets its places and keys). Says so on standard error.")
    var noSandbox = false
    @Option(
        help: ArgumentHelp(
            "Background time per trip to the background, for background tasks (30s as iOS today; 10m as in iOS 4).",
            valueName: "duration"))
    var backgroundTime = "30s"
    @Option(
        help: ArgumentHelp(
            "How long the app has to end after willTerminate and SIGTERM before it is killed (at most 1h).",
            valueName: "duration"))
    var grace = "5s"
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String
    @Argument(
        parsing: .postTerminator, help: ArgumentHelp("The command and its arguments, after --.", valueName: "command"))
    var command: [String] = []

    func validate() throws {
        guard !command.isEmpty else {
            throw ValidationError("give the command after --: dpctl app run ID -- COMMAND [ARGS...]")
        }
        _ = try parseDuration(backgroundTime)
        try validateGrace(grace)
    }

    func run() async throws {
        let id = try appIdentifier(identifier)
        let manager = try await containerManager(device, passcodeFile: unlock.passcodeFile)
        if noSandbox {
            FileHandle.standardError.write(
                Data("dpctl: running \(id) WITHOUT its sandbox (--no-sandbox): it can reach everything you can\n".utf8))
        }
        let lifecycle = LifecycleService(
            manager: manager,
            settings: LifecycleSettings(
                backgroundTimeBudget: try parseDuration(backgroundTime),
                terminationDeadline: try parseDuration(grace)),
            clock: SystemClock())
        let supervisor = AppSupervisor(
            manager: manager, services: [lifecycle, SharingService(manager: manager)],
            fileSystem: await fileSystemLauncher(passcodeFile: unlock.passcodeFile, keybag: manager.files.keybag))
        let signals = TerminationSignals { lifecycle.terminateAll() }
        defer { signals.cancel() }
        let status = try await supervisor.run(id, command: command, sandboxed: !noSandbox)
        throw ExitCode(status)
    }
}

struct AppSetProtection: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-protection",
        abstract: "Change an app's default class.",
        usage: "dpctl app set-protection <id> <class> [<options>]",
        discussion: """
            As on iOS, a changed default reaches new files only. --reprotect also re-protects \
            every existing file of the container (with progress); locked classes need \
            --passcode-file.
            """)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String
    @Argument(help: ArgumentHelp("The class: \(ProtectionClass.spellings).", valueName: "class"))
    var protectionClass: ProtectionClass
    @Flag(help: "Re-protect the files already in the container too.") var reprotect = false

    func run() async throws {
        let manager = try await containerManager(device, passcodeFile: unlock.passcodeFile)
        let bar = ProgressLine(enabled: isatty(STDERR_FILENO) == 1)
        let app = try appIdentifier(identifier)
        // Re-protection checks every class before it changes a file: asking and trying again is safe.
        let report = try await PasscodePrompt.retrying(manager.files.keybag) {
            try await manager.setDefaultProtection(protectionClass, ofApp: app, reprotect: reprotect) { p in
                bar.update(done: p.completed, total: p.total)
            }
        }
        bar.finish()
        printOut("\(identifier): default class \(protectionClass) for new files")
        if let report {
            printOut(
                "re-protected \(counted(report.filesChanged, "file")) (\(report.filesUnchanged) already \(protectionClass.shortName)), \(report.failures.count) failed"
            )
            for (path, why) in report.failures.sorted(by: { $0.key < $1.key }) { printOut("  failed: \(path): \(why)") }
            if !report.failures.isEmpty { throw ExitCode(ExitStatus.unavailable.rawValue) }
        }
    }
}

struct AppSetDocumentBrowser: AsyncParsableCommand {
    enum Setting: String, ExpressibleByArgument, CaseIterable { case on, off }

    static let configuration = CommandConfiguration(
        commandName: "set-document-browser",
        abstract: "Expose an app's Documents to other apps, or stop.",
        usage: "dpctl app set-document-browser <id> on|off",
        discussion: """
            UISupportsDocumentBrowser, changed without a reinstall: the container is kept. On, you \
            can grant other apps items of its Documents (dpctl grant); off, the grants you made \
            start no new access (the app's own grants are not affected).
            """)
    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String
    @Argument(help: ArgumentHelp("on or off.", valueName: "on|off")) var setting: Setting

    func run() async throws {
        let manager = try await containerManager(device)
        try manager.setSupportsDocumentBrowser(setting == .on, ofApp: try appIdentifier(identifier))
        printOut(
            "\(identifier): document browser \(setting.rawValue)"
                + (setting == .on
                    ? " (Documents is exposed: you can grant other apps its items)"
                    : " (the grants you made start no new access)"))
    }
}

struct AppUninstall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "uninstall",
        abstract: "Remove an app and its container.",
        discussion: "An App Group's container goes with its last member.")
    @OptionGroup var device: DeviceOptions
    @Argument(help: ArgumentHelp("The app's identifier.", valueName: "id")) var identifier: String

    func run() async throws {
        let id = try appIdentifier(identifier)
        try await SharingBroker(manager: containerManager(device)).uninstall(id)
        printOut("uninstalled \(id)")
    }
}

struct Group: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "group",
        abstract: "App Group containers: set their class.",
        subcommands: [GroupSetProtection.self])
}

struct GroupSetProtection: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-protection",
        abstract: "Set an App Group container's class.",
        usage: "dpctl group set-protection <group-id> <class> [<options>]",
        discussion: """
            A group container starts at iOS's default class (completeUntilFirstUserAuthentication) \
            whatever its members' entitlements say: set its class here or from a member app. New \
            files get it; --reprotect changes the existing ones too.
            """)
    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Argument(help: ArgumentHelp("The group's identifier.", valueName: "group-id")) var identifier: String
    @Argument(help: ArgumentHelp("The class: \(ProtectionClass.spellings).", valueName: "class")) var protectionClass:
        ProtectionClass
    @Flag(help: "Re-protect the files already in the group container too.") var reprotect = false

    func run() async throws {
        let manager = try await containerManager(device, passcodeFile: unlock.passcodeFile)
        let group = try groupIdentifier(identifier)
        let report = try await PasscodePrompt.retrying(manager.files.keybag) {
            try await manager.setDefaultProtection(protectionClass, ofGroup: group, reprotect: reprotect)
        }
        printOut("\(identifier): default class \(protectionClass) for new files")
        if let report {
            printOut("re-protected \(counted(report.filesChanged, "file")), \(report.failures.count) failed")
            if !report.failures.isEmpty { throw ExitCode(ExitStatus.unavailable.rawValue) }
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP while an app runs: the first asks the app to terminate (it hears
/// willTerminate and has a few seconds); a second ends this process at once (and the app with it).
final class TerminationSignals {
    private let sources: [any DispatchSourceSignal]
    private final class Count: Sendable {
        private let value = Mutex(0)
        func next() -> Int {
            value.withLock {
                $0 += 1; return $0
            }
        }
    }

    init(_ terminate: @escaping @Sendable () -> Void) {
        let count = Count()
        sources = [SIGTERM, SIGINT, SIGHUP].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                let n = count.next()
                if n == 1 { terminate() } else { Foundation.exit(128 + number) }
            }
            source.resume()
            return source
        }
    }

    func cancel() {
        for source in sources { source.cancel() }
    }
}
