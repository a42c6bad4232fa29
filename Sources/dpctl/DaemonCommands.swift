import ArgumentParser
import DataProtection
import Foundation

struct Daemon: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "Set up keybagd, the daemon that holds the keys for every process.",
        subcommands: [DaemonInstall.self])
}

struct DaemonInstall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "install",
        abstract: "Write a systemd user unit that runs keybagd for this data root.",
        discussion: """
        Writes $XDG_CONFIG_HOME/systemd/user/keybagd.service (default ~/.config/...) running the
        keybagd next to this dpctl, then prints the systemctl commands that start it. An existing
        unit with other content is left alone unless --force is given.
        """)

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Lock after this many seconds without a request.", valueName: "seconds"))
    var idleLock: Int = 900

    @Flag(help: "Replace an existing unit.")
    var force = false

    func run() async throws {
        try await reportingErrors {
            let dpctl = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            let keybagd = dpctl.deletingLastPathComponent().appendingPathComponent("keybagd").path
            guard FileManager.default.isExecutableFile(atPath: keybagd) else {
                throw CLIError("no keybagd next to dpctl (\(keybagd)): build it with `swift build -c release --product keybagd`")
            }
            let environment = ProcessInfo.processInfo.environment
            let config = environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
                ?? FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".config").path
            let directory = config + "/systemd/user"
            let unitPath = directory + "/keybagd.service"
            let unit = Self.unit(keybagd: keybagd, root: device.resolvedRoot, idleLock: idleLock)
            if let existing = try? String(contentsOfFile: unitPath, encoding: .utf8), existing != unit, !force {
                throw CLIError("\(unitPath) exists with other content; use --force to replace it")
            }
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try unit.write(toFile: unitPath, atomically: true, encoding: .utf8)
            printOut("wrote \(unitPath)")
            printOut("start it:  systemctl --user daemon-reload && systemctl --user enable --now keybagd.service")
            printOut("then:      dpctl --root \(device.resolvedRoot) unlock")
        }
    }

    static func unit(keybagd: String, root: String, idleLock: Int) -> String {
        """
        # Written by `dpctl daemon install`. keybagd holds the keys of \(root)
        # for every process of this user; see `keybagd --help`.
        [Unit]
        Description=DataProtection keybag daemon (one lock state for every process)

        [Service]
        Type=simple
        ExecStart=\(keybagd) --root \(root) --idle-lock \(idleLock)
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
}
