import ArgumentParser
import DataProtection
import DataProtectionSystem
import Foundation

struct Daemon: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "Set up keybagd: one lock state for every process.",
        subcommands: [DaemonInstall.self, DaemonUninstall.self])
}

/// Where `dpctl daemon install` writes: a template `keybagd@.service` shared by every root, and
/// per root (the instance: the root's path escaped as `systemd-escape --path` does) a drop-in
/// with its idle lock and, with socket activation, `keybagd@INSTANCE.socket`.
struct UserUnits {
    let directory: String
    let instance: String

    init(root: String) {
        let environment = ProcessInfo.processInfo.environment
        let config =
            environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".config").path
        directory = config + "/systemd/user"
        instance = Self.escapePath(root)
    }

    static let template = "keybagd@.service"
    var service: String { "keybagd@\(instance).service" }
    var socket: String { "keybagd@\(instance).socket" }
    var dropInDirectory: String { directory + "/" + service + ".d" }
    var dropIn: String { dropInDirectory + "/dpctl.conf" }

    /// systemd's path escaping (`systemd-escape --path`): `/` becomes `-`, and every byte other
    /// than ASCII letters, digits, `:`, `_` and a `.` that does not lead becomes `\xNN`.
    static func escapePath(_ path: String) -> String {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        guard !parts.isEmpty else { return "-" }
        var out = ""
        for (index, byte) in LosslessPath.bytes(of: parts.joined(separator: "/")).enumerated() {
            switch byte {
            case UInt8(ascii: "/"): out += "-"
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"),
                UInt8(ascii: ":"), UInt8(ascii: "_"):
                out.append(Character(UnicodeScalar(byte)))
            case UInt8(ascii: ".") where index > 0: out += "."
            default: out += String(format: "\\x%02x", byte)
            }
        }
        return out
    }
}

struct DaemonInstall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "install",
        abstract: "Write systemd user units running keybagd.",
        usage: "dpctl daemon install [<options>]",
        discussion: """
            Writes the template $XDG_CONFIG_HOME/systemd/user/keybagd@.service (default ~/.config/...), \
            running the keybagd installed next to this dpctl (one in a build directory is refused), and for this root a drop-in with its idle lock; the \
            root is the unit's instance (keybagd@home-me-.local-share-dataprotection.service), so every \
            root gets its own. With --socket-activation it also writes keybagd@INSTANCE.socket: systemd \
            then listens on the root's socket and starts keybagd on the first connection. It prints the \
            systemctl commands that start it. An existing unit with other content is left alone unless \
            --force is given. `dpctl daemon uninstall` removes this root's units.
            """)

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Lock after this many seconds without a request.", valueName: "seconds"))
    var idleLock: Int = 900

    @Flag(
        help: "Start keybagd on the first connection (systemd socket activation); also writes keybagd@INSTANCE.socket.")
    var socketActivation = false

    @Flag(help: "Replace an existing unit.")
    var force = false

    @Flag(
        help: "Use a keybagd inside a build directory (a development set-up: the next clean or build breaks the unit).")
    var fromBuildDirectory = false

    func run() async throws {
        let dpctl = URL(
            fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
                ?? CommandLine.arguments[0])
        let keybagd = dpctl.deletingLastPathComponent().appendingPathComponent("keybagd").path
        guard FileManager.default.isExecutableFile(atPath: keybagd) else {
            throw CLIError("no keybagd next to dpctl (\(keybagd)): install both with scripts/install")
        }
        if let why = Self.buildDirectoryReason(keybagd: keybagd), !fromBuildDirectory {
            throw CLIError(
                "\(keybagd) is \(why); install with scripts/install and run the installed dpctl, "
                    + "or pass --from-build-directory", status: .usage)
        }
        let root = try device.resolvedRoot
        let units = UserUnits(root: root)
        var files = [
            (units.directory + "/" + UserUnits.template, Self.template(keybagd: keybagd)),
            (units.dropIn, Self.dropIn(root: root, idleLock: idleLock)),
        ]
        if socketActivation {
            let socketName = (KeybagSocket.path(forRoot: root) as NSString).lastPathComponent
            files.append((units.directory + "/" + units.socket, Self.socketUnit(socketName: socketName, root: root)))
        }
        for (path, unit) in files {
            if let existing = try? String(contentsOfFile: path, encoding: .utf8), existing != unit, !force {
                throw CLIError("\(path) exists with other content; use --force to replace it")
            }
        }
        try FileManager.default.createDirectory(atPath: units.dropInDirectory, withIntermediateDirectories: true)
        for (path, unit) in files {
            try unit.write(toFile: path, atomically: true, encoding: .utf8)
            printOut("wrote \(path)")
        }
        let start = socketActivation ? units.socket : units.service
        printOut("start it:  systemctl --user daemon-reload && systemctl --user enable --now '\(start)'")
        printOut("then:      dpctl --root \(root) unlock")
    }

    /// Why a keybagd is no place for a unit to point at: inside a SwiftPM build directory
    /// (`.build`, `.build-static` …), or a debug build (this dpctl's, which `swift build` makes
    /// beside it). `nil` for an installed one.
    static func buildDirectoryReason(keybagd: String) -> String? {
        if keybagd.split(separator: "/").contains(where: { $0.hasPrefix(".build") }) {
            return "inside a build directory (`swift package clean` or the next build would break the unit)"
        }
        #if DEBUG
        return "a debug build (slow, and it loads the Swift runtime from the toolchain that built it)"
        #else
        return nil
        #endif
    }

    /// The template: one keybagd per instance, the instance being the escaped root (`%f` is it unescaped).
    static func template(keybagd: String) -> String {
        """
        # Written by `dpctl daemon install`. keybagd@INSTANCE holds the keys of the data root
        # INSTANCE names (systemd-escape --path ROOT) for every process of this user; see
        # `keybagd --help`. The idle lock of each root is in keybagd@INSTANCE.service.d/.
        [Unit]
        Description=DataProtection keybag daemon for %f (one lock state for every process)

        [Service]
        Type=simple
        Environment=KEYBAGD_IDLE_LOCK=900
        ExecStart=\(keybagd) --root "%f" --idle-lock ${KEYBAGD_IDLE_LOCK}
        Restart=on-failure
        NoNewPrivileges=yes
        LockPersonality=yes
        RestrictRealtime=yes
        SystemCallArchitectures=native
        UMask=0077

        [Install]
        WantedBy=default.target

        """
    }

    static func dropIn(root: String, idleLock: Int) -> String {
        """
        # Written by `dpctl daemon install` for \(root).
        [Service]
        Environment=KEYBAGD_IDLE_LOCK=\(idleLock)

        """
    }

    /// The socket unit: systemd listens on the root's socket (0600, in a 0700 directory) and
    /// starts keybagd@INSTANCE.service on the first connection.
    static func socketUnit(socketName: String, root: String) -> String {
        """
        # Written by `dpctl daemon install --socket-activation`: keybagd for \(root)
        # starts on the first connection to its socket.
        [Unit]
        Description=DataProtection keybag daemon socket for \(root)

        [Socket]
        ListenStream=%t/dataprotection/\(socketName)
        SocketMode=0600
        DirectoryMode=0700

        [Install]
        WantedBy=sockets.target

        """
    }
}

struct DaemonUninstall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "uninstall",
        abstract: "Remove this data root's keybagd units.",
        discussion:
            "The template unit goes with the last root. Stops and disables them first through `systemctl --user` when a user manager answers."
    )

    @OptionGroup var device: DeviceOptions

    func run() async throws {
        let root = try device.resolvedRoot
        let units = UserUnits(root: root)
        // Best effort: without a user manager (a container, a test) there is nothing to stop.
        _ = runQuietly("systemctl", ["--user", "disable", "--now", units.service, units.socket])
        var removed: [String] = []
        for path in [units.directory + "/" + units.socket, units.dropInDirectory]
        where FileManager.default.fileExists(atPath: path) {
            try FileManager.default.removeItem(atPath: path)
            removed.append(path)
        }
        let others = ((try? FileManager.default.contentsOfDirectory(atPath: units.directory)) ?? [])
            .filter { $0.hasPrefix("keybagd@") && $0 != UserUnits.template }
        let template = units.directory + "/" + UserUnits.template
        if others.isEmpty, FileManager.default.fileExists(atPath: template) {
            try FileManager.default.removeItem(atPath: template)
            removed.append(template)
        }
        guard !removed.isEmpty else { throw CLIError("no keybagd units for \(root) in \(units.directory)") }
        for path in removed { printOut("removed \(path)") }
        _ = runQuietly("systemctl", ["--user", "daemon-reload"])
    }

    /// Runs a command with its output discarded; whether it succeeded.
    private func runQuietly(_ tool: String, _ arguments: [String]) -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [tool] + arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return false }
        process.waitUntilExit()
        return process.terminationStatus == 0
    }
}
