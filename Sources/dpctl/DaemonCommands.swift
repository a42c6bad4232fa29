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
        keybagd next to this dpctl, then prints the systemctl commands that start it. With
        --socket-activation it also writes keybagd.socket: systemd then listens on the root's
        socket and starts keybagd on the first connection (the first `dpctl unlock` or app).
        An existing unit with other content is left alone unless --force is given.
        """)

    @OptionGroup var device: DeviceOptions

    @Option(help: ArgumentHelp("Lock after this many seconds without a request.", valueName: "seconds"))
    var idleLock: Int = 900

    @Flag(help: "Start keybagd on the first connection (systemd socket activation); also writes keybagd.socket.")
    var socketActivation = false

    @Flag(help: "Replace an existing unit.")
    var force = false

    func run() async throws {
        let dpctl = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        let keybagd = dpctl.deletingLastPathComponent().appendingPathComponent("keybagd").path
        guard FileManager.default.isExecutableFile(atPath: keybagd) else {
            throw CLIError("no keybagd next to dpctl (\(keybagd)): build it with `swift build -c release --product keybagd`")
        }
        let environment = ProcessInfo.processInfo.environment
        let config = environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".config").path
        let directory = config + "/systemd/user"
        var units = [("keybagd.service", Self.unit(keybagd: keybagd, root: try device.resolvedRoot, idleLock: idleLock,
                                                  activated: socketActivation))]
        if socketActivation {
            let socketName = (KeybagSocket.path(forRoot: try device.resolvedRoot) as NSString).lastPathComponent
            units.append(("keybagd.socket", Self.socketUnit(socketName: socketName, root: try device.resolvedRoot)))
        }
        for (name, unit) in units {
            let unitPath = directory + "/" + name
            if let existing = try? String(contentsOfFile: unitPath, encoding: .utf8), existing != unit, !force {
                throw CLIError("\(unitPath) exists with other content; use --force to replace it")
            }
        }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for (name, unit) in units {
            try unit.write(toFile: directory + "/" + name, atomically: true, encoding: .utf8)
            printOut("wrote \(directory)/\(name)")
        }
        let start = socketActivation ? "keybagd.socket" : "keybagd.service"
        printOut("start it:  systemctl --user daemon-reload && systemctl --user enable --now \(start)")
        printOut("then:      dpctl --root \(try device.resolvedRoot) unlock")
    }

    static func unit(keybagd: String, root: String, idleLock: Int, activated: Bool) -> String {
        let install = activated ? "" : """

        [Install]
        WantedBy=default.target
        """
        return """
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
        \(install)

        """
    }

    /// The socket unit: systemd listens on the root's socket (0600, in a 0700 directory) and
    /// starts keybagd.service on the first connection.
    static func socketUnit(socketName: String, root: String) -> String {
        """
        # Written by `dpctl daemon install --socket-activation`: keybagd for \(root)
        # starts on the first connection to its socket.
        [Unit]
        Description=DataProtection keybag daemon socket

        [Socket]
        ListenStream=%t/dataprotection/\(socketName)
        SocketMode=0600
        DirectoryMode=0700

        [Install]
        WantedBy=sockets.target

        """
    }
}
