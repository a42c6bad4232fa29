import DataProtection
@testable import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// keybagd with real processes: the daemon, `dpctl` runs, and this test process as the app that
/// holds files open. The daemon runs on a manual clock that only this test moves.
@Suite(.serialized) struct KeybagdTests {
    /// A running daemon for the CLI's root (``KeybagdProcess`` in the test support).
    typealias Daemon = KeybagdProcess

    struct CLIError: Error, CustomStringConvertible { let description: String; init(_ d: String) { description = d } }

    @Test func oneLockStateForEveryProcess() async throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try Daemon(cli: cli)
        defer { daemon.kill() }
        let env = daemon.environment

        // Restarting is rebooting: before first unlock until `dpctl unlock`.
        #expect(try cli.run(["status"], environment: env).out.contains("before-first-unlock"))
        let unlocked = try cli.run(["unlock", "--passcode-file", passcode], environment: env)
        #expect(unlocked.status == 0, "\(unlocked.stderr)")

        // This process is the app: its keybag is the daemon's.
        let keybag = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        #expect(await keybag.lockState == .unlocked)
        let files = ProtectedFileManager(keybag: keybag)
        var urls: [ProtectionClass: URL] = [:]
        for cls in ProtectionClass.allCases {
            urls[cls] = URL(fileURLWithPath: cli.file("\(cls.shortName).txt"))
            try await files.write(Data("class \(cls.shortName)".utf8), to: urls[cls]!, protection: cls)
        }
        // Another process reads what this one wrote: same keys.
        #expect(try cli.run(["cat", urls[.complete]!.path], environment: env).out == "class complete")

        let handleA = try await files.openHandle(forReadingFrom: urls[.complete]!)
        let handleB = try await files.openHandle(forUpdating: urls[.completeUnlessOpen]!)
        let otherSubscriber = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        var eventsHere = await keybag.events().makeAsyncIterator()
        var eventsThere = await otherSubscriber.events().makeAsyncIterator()

        // `dpctl lock` in another process; within the grace period class A still reads.
        #expect(try cli.run(["lock"], environment: env).status == 0)
        #expect(await eventsHere.next() == .willBecomeUnavailable)
        #expect(await eventsThere.next() == .willBecomeUnavailable)
        try daemon.advance(5, root: cli.root)
        #expect(try await handleA.read(at: 0, count: 5) == Data("class".utf8))

        // After the grace period: A fails with the typed error, B keeps reading and writing,
        // a new B file can be created, C and D keep working.
        try daemon.advance(6, root: cli.root)
        await #expect {
            _ = try await handleA.read(at: 0, count: 5)
        } throws: { error in
            guard case ProtectedFileError.unavailable(_, .complete, .locked, false) = error else { return false }
            return true
        }
        try await handleB.append(Data(" + while locked".utf8))
        #expect(try await handleB.read(at: 0, count: 100) == Data("class complete-unless-open + while locked".utf8))
        let download = URL(fileURLWithPath: cli.file("download.bin"))
        try await files.write(Data("pushed while locked".utf8), to: download, protection: .completeUnlessOpen)
        #expect(try await files.contents(of: urls[.completeUntilFirstUserAuthentication]!) == Data("class until-first-unlock".utf8))
        #expect(try await files.contents(of: urls[.noProtection]!) == Data("class none".utf8))
        let cat = try cli.run(["cat", urls[.complete]!.path], environment: env)
        #expect(cat.status == 3, "\(cat.stderr)")

        // Unlock from another process: every subscriber hears it, the A handle works again.
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: env).status == 0)
        #expect(await eventsHere.next() == .didBecomeAvailable)
        #expect(await eventsThere.next() == .didBecomeAvailable)
        #expect(try await handleA.read(at: 0, count: 5) == Data("class".utf8))
        #expect(try await files.contents(of: download) == Data("pushed while locked".utf8))
        try await handleB.close()

        // This process now holds the class C file key in its cache (the daemon's state page
        // vouches for it): reads need no round trip.
        let classC = urls[.completeUntilFirstUserAuthentication]!
        #expect(try await files.contents(of: classC) == Data("class until-first-unlock".utf8))

        // Killing the daemon: a clear error at once, not a hang — cached keys included, since the
        // page shows the daemon gone; the restarted one is "rebooted".
        daemon.kill()
        await #expect {
            _ = try await handleA.read(at: 0, count: 5)
        } throws: { error in
            String(describing: error).contains("keybagd")
        }
        await #expect {
            _ = try await files.contents(of: classC)
        } throws: { error in
            String(describing: error).contains("keybagd")
        }
        let restarted = try Daemon(cli: cli)
        defer { restarted.kill() }
        // The restarted daemon is before first unlock: this process's cached class C key is void.
        await #expect {
            _ = try await files.contents(of: classC)
        } throws: { error in
            guard case ProtectedFileError.unavailable(_, .completeUntilFirstUserAuthentication, .beforeFirstUnlock, false) = error else {
                return false
            }
            return true
        }
        #expect(try cli.run(["status"], environment: restarted.environment).out.contains("before-first-unlock"))
        #expect(try cli.run(["cat", urls[.completeUntilFirstUserAuthentication]!.path], environment: restarted.environment).status == 3)
        try await handleA.close()
    }

    @Test func idleLock() async throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try Daemon(cli: cli, arguments: ["--idle-lock", "300"])
        defer { daemon.stop() }
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        let keybag = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        var events = await keybag.events().makeAsyncIterator()
        try daemon.advance(299, root: cli.root)
        #expect(await keybag.lockState == .unlocked)     // a request: the idle time starts again
        try daemon.advance(301, root: cli.root)
        #expect(await events.next() == .willBecomeUnavailable)
        #expect(await keybag.lockState == .locked)
    }

    @Test func anotherUserIsRefusedAndToldWhy() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try Daemon(cli: cli)
        defer { daemon.kill() }
        // The socket is 0600 in a 0700 directory: another user cannot even reach it. Open both
        // up to show that the daemon itself checks the peer (SO_PEERCRED) as well.
        chmod(daemon.runtime, 0o755)
        chmod((daemon.socket as NSString).deletingLastPathComponent, 0o755)
        chmod(daemon.socket, 0o666)
        chmod(cli.work.path, 0o755)
        // dpctl, as the other user, refuses a directory that is not its own before it sends anything.
        let other = try cli.run(["status"], environment: daemon.environment, shellPrefix: nil, asUser: "nobody")
        #expect(other.status != 0)
        #expect(other.stderr.contains("refused to connect") && other.stderr.contains("belongs to uid 0"), "\(other.stderr)")
        // A raw client of that user reaches the socket: the daemon answers one error frame saying why.
        let raw = try ChildProcess.run("setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", """
            import socket, sys
            s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])
            s.sendall(b"\\x00\\x00\\x00\\x02\\x01\\x00")
            print(s.recv(4096))
            """, daemon.socket])
        #expect(raw.out.contains("refused") && raw.out.contains("uid 65534"), "\(raw.out) \(raw.err)")
    }
}

/// The desktop's lock signals, from stand-ins on private D-Bus buses (Debian's dbus-daemon),
/// reach keybagd and lock it; an unlock within the grace period unlocks it again.
@Suite(.serialized) struct DesktopLockTests {
    typealias Bus = PrivateBus

    /// `Tests/oracle/desktop_lock_standin.py`: owns the screensaver's or logind's name, emits on command.
    final class StandIn: @unchecked Sendable {
        let process = Process()
        let input = Pipe()
        let output = Pipe()
        init(bus: String, environment: [String: String]) throws {
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            let python = ProcessInfo.processInfo.environment["DP_PYTHON"] ?? root.appendingPathComponent(".venv-oracle/bin/python").path
            process.executableURL = URL(fileURLWithPath: python)
            process.arguments = [root.appendingPathComponent("Tests/oracle/desktop_lock_standin.py").path, bus]
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
            process.standardInput = input
            process.standardOutput = output
            try process.run()
            guard readLine() == "ready" else { throw KeybagdTests.CLIError("the \(bus) stand-in did not start (jeepney in the venv?)") }
        }
        func readLine() -> String {
            var line = Data()
            while let byte = try? output.fileHandleForReading.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) { line += byte }
            return String(decoding: line, as: UTF8.self)
        }
        func send(_ command: String) {
            input.fileHandleForWriting.write(Data((command + "\n").utf8))
            _ = readLine()   // "sent"
        }
        deinit { process.terminate() }
    }

    @Test func screensaverLogindAndSuspendLockTheDaemon() async throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let sessionBus = try Bus(), systemBus = try Bus()
        let buses = ["DBUS_SESSION_BUS_ADDRESS": sessionBus.address, "DBUS_SYSTEM_BUS_ADDRESS": systemBus.address]
        let screensaver = try StandIn(bus: "session", environment: buses)
        let logind = try StandIn(bus: "system", environment: buses)
        let daemon = try KeybagdTests.Daemon(cli: cli, extraEnvironment: buses)
        defer { daemon.stop() }
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        let keybag = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        var events = await keybag.events().makeAsyncIterator()

        // The screensaver turns on: locked. Off again within the grace period: unlocked again.
        screensaver.send("active true")
        #expect(await events.next() == .willBecomeUnavailable)
        #expect(await keybag.lockState == .locked)
        screensaver.send("active false")
        #expect(await events.next() == .didBecomeAvailable)
        #expect(await keybag.lockState == .unlocked)

        // logind's LockedHint: locked; after the grace period an unlock of the desktop is not
        // enough — the keybag waits for the passcode.
        logind.send("locked true")
        #expect(await events.next() == .willBecomeUnavailable)
        try daemon.advance(11, root: cli.root)
        logind.send("locked false")
        #expect(await keybag.lockState == .locked)
        #expect(await !keybag.isProtectedDataAvailable)
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(await events.next() == .didBecomeAvailable)

        // Before suspend: locked.
        logind.send("sleep true")
        #expect(await events.next() == .willBecomeUnavailable)
        #expect(await keybag.lockState == .locked)
    }

    @Test func withoutDBusTheDaemonSaysSoOnceAndKeepsWorking() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let none = ["DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus", "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/system_bus_socket"]
        let daemon = try KeybagdTests.Daemon(cli: cli, extraEnvironment: none, captureErrors: true)
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try cli.run(["lock"], environment: daemon.environment).status == 0)
        daemon.kill()
        let log = daemon.errors()
        #expect(log.contains("no D-Bus session bus here"), "\(log)")
        #expect(log.contains("no D-Bus system bus here"), "\(log)")
        #expect(log.components(separatedBy: "no desktop lock signals").count == 2)
    }
}

/// Bad frames close their own connection and nothing else.
@Suite(.serialized) struct KeybagdProtocolTests {
    @Test(arguments: [
        [UInt8]([0xFF, 0xFF, 0xFF, 0xFF]),                       // length over 64 KiB
        [0, 0, 0, 0],                                            // empty frame
        [0, 0, 0, 2, 9, 1],                                      // another protocol version
        [0, 0, 0, 2, 1, 200],                                    // unknown operation
        [0, 0, 0, 4, 1, 9, 1, 2],                                // unwrap with a truncated body
        [0, 0, 0, 3, 1, 1, 0],                                   // hello with a trailing byte
    ])
    func aMalformedFrameClosesThatConnectionOnly(frame: [UInt8]) throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdTests.Daemon(cli: cli)
        defer { daemon.stop() }
        let healthy = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket))
        let bad = try #require(try KeybagSocket.connect(daemon.socket))
        defer { close(bad) }
        _ = frame.withUnsafeBytes { send(bad, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        // The daemon closes the bad connection: reading gives end of stream (or an error frame
        // for a request it could parse far enough to answer), never a hang.
        var byte: UInt8 = 0
        var received = 0
        var rc = recv(bad, &byte, 1, 0)
        while rc == 1 { received += 1; rc = recv(bad, &byte, 1, 0) }
        #expect(rc == 0, "the daemon closed the connection (not a 5 s timeout)")
        #expect(received < 64)
        // Every other connection goes on.
        var hello = try healthy.call(.hello)
        #expect(try KeybagWire.uuid(&hello) != UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
        #expect(try cli.run(["status"], environment: daemon.environment).out.contains("keybagd"))
    }
}

/// Socket activation, judged by systemd's own `systemd-socket-activate` (Debian's systemd).
@Suite struct SocketActivationTests {
    @Test func systemdStartsKeybagdOnTheFirstConnection() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let runtime = cli.file("run")
        try FileManager.default.createDirectory(atPath: runtime + "/dataprotection", withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        chmod(runtime, 0o700)
        let socketName = (KeybagSocket.path(forRoot: cli.root) as NSString).lastPathComponent
        let socket = runtime + "/dataprotection/" + socketName
        // Spawned directly (posix_spawn), not with Foundation's Process: its exit monitoring
        // blocks once the child execs into keybagd, as systemd-socket-activate does.
        var pipe: [Int32] = [0, 0]
        #expect(Glibc.pipe(&pipe) == 0)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipe[1], 2)
        posix_spawn_file_actions_addclose(&actions, pipe[0])
        let arguments = ["/usr/bin/systemd-socket-activate", "-l", socket, "-E", "XDG_RUNTIME_DIR=\(runtime)",
                         CLI.executable.deletingLastPathComponent().appendingPathComponent("keybagd").path, "--root", cli.root]
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for arg in argv { free(arg) } }
        var pid: pid_t = 0
        #expect(posix_spawn(&pid, arguments[0], &actions, nil, &argv, environ) == 0)
        close(pipe[1])
        let errors = FileHandle(fileDescriptor: pipe[0], closeOnDealloc: true)
        func stopActivated() {
            guard pid > 0 else { return }
            Glibc.kill(pid, SIGTERM)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            pid = 0
        }
        defer { stopActivated() }
        // systemd-socket-activate says when it listens; nothing else runs yet.
        var line = Data()
        while let byte = try errors.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) { line += byte }
        #expect(String(decoding: line, as: UTF8.self).hasPrefix("Listening on \(socket)"))
        #expect(!FileManager.default.fileExists(atPath: KeybagStatePage.path(forSocket: socket)))

        // The first client starts the daemon: before first unlock, as after a reboot.
        let env = ["XDG_RUNTIME_DIR": runtime]
        let status = try cli.run(["status"], environment: env)
        #expect(status.out.contains("before-first-unlock") && status.out.contains("keys held by:     keybagd"), "\(status.out)")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: env).status == 0)
        // This process finds it too, with its state page.
        let client = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: socket))
        #expect(client.fastGeneration(of: .complete) == 0)
        var info = stat()
        #expect(stat(socket, &info) == 0 && info.st_mode & 0o777 == 0o600)

        // Stopped, the daemon leaves the socket to systemd.
        stopActivated()
        #expect(FileManager.default.fileExists(atPath: socket))
        #expect(client.fastGeneration(of: .complete) == nil)
    }
}

@Suite struct DaemonInstallTests {
    @Test func installWritesATemplateAndAnInstanceForThisRoot() throws {
        let cli = CLI.make()
        let config = cli.file("config")
        let env = ["XDG_CONFIG_HOME": config]
        let result = try cli.run(["daemon", "install", "--idle-lock", "600", "--from-build-directory"], environment: env)
        #expect(result.status == 0, "\(result.stderr)")
        let units = config + "/systemd/user/"
        let template = try String(contentsOfFile: units + "keybagd@.service", encoding: .utf8)
        let keybagd = CLI.executable.deletingLastPathComponent().appendingPathComponent("keybagd").path
        #expect(template.contains("ExecStart=\(keybagd) --root \"%f\" --idle-lock ${KEYBAGD_IDLE_LOCK}"))
        // The instance is the root as systemd escapes it: systemd's own tool agrees.
        let escaped = try ChildProcess.run("systemd-escape", ["--path", cli.root]).out.trimmingCharacters(in: .newlines)
        let dropIn = try String(contentsOfFile: units + "keybagd@\(escaped).service.d/dpctl.conf", encoding: .utf8)
        #expect(dropIn.contains("Environment=KEYBAGD_IDLE_LOCK=600"))
        #expect(result.out.contains("systemctl --user enable --now 'keybagd@\(escaped).service'"))
        // A second root installs beside the first.
        let other = cli.file("other root")
        let second = try cli.run(["--root", other, "daemon", "install", "--from-build-directory"], environment: env)
        #expect(second.status == 0, "\(second.stderr)")
        let otherEscaped = try ChildProcess.run("systemd-escape", ["--path", other]).out.trimmingCharacters(in: .newlines)
        #expect(FileManager.default.fileExists(atPath: units + "keybagd@\(otherEscaped).service.d/dpctl.conf"))
        // The units are valid for systemd itself (its verifier fails on a bad setting).
        let runtime = cli.file("run")
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let verify = try ChildProcess.run("systemd-analyze", ["verify", "--user", units + "keybagd@\(escaped).service"],
                                          environment: env.merging(["XDG_RUNTIME_DIR": runtime]) { $1 })
        #expect(verify.status == 0, "\(verify.err)")

        // Uninstalling one root keeps the template for the other; the last takes it.
        #expect(try cli.run(["daemon", "uninstall"], environment: env).status == 0)
        #expect(!FileManager.default.fileExists(atPath: units + "keybagd@\(escaped).service.d"))
        #expect(FileManager.default.fileExists(atPath: units + "keybagd@.service"))
        #expect(try cli.run(["--root", other, "daemon", "uninstall"], environment: env).status == 0)
        #expect(!FileManager.default.fileExists(atPath: units + "keybagd@.service"))
        #expect(try cli.run(["daemon", "uninstall"], environment: env).status == 1)
    }

    /// A keybagd in a build directory (this test's own, a debug build) is no place for a unit:
    /// refused (64) and nothing written, unless asked for; uninstall disables the units through
    /// systemctl before it removes them (a stand-in systemctl on PATH records what it saw).
    @Test func aBuildDirectoryIsRefusedAndUninstallDisablesFirst() throws {
        let cli = CLI.make()
        let config = cli.file("config")
        let refused = try cli.run(["daemon", "install"], environment: ["XDG_CONFIG_HOME": config])
        #expect(refused.status == 64, "\(refused.stderr)")
        #expect(refused.stderr.contains("inside a build directory") && refused.stderr.contains("scripts/install")
                && refused.stderr.contains("--from-build-directory"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: config + "/systemd"))

        #expect(try cli.run(["daemon", "install", "--from-build-directory"], environment: ["XDG_CONFIG_HOME": config]).status == 0)
        let escaped = try ChildProcess.run("systemd-escape", ["--path", cli.root]).out.trimmingCharacters(in: .newlines)
        let dropIn = config + "/systemd/user/keybagd@\(escaped).service.d/dpctl.conf"
        let fakeBin = cli.file("fake-bin")
        try FileManager.default.createDirectory(atPath: fakeBin, withIntermediateDirectories: true)
        let log = cli.file("systemctl.log")
        try """
        #!/bin/sh
        if [ -e '\(dropIn)' ]; then state=present; else state=absent; fi
        echo "$* units:$state" >>'\(log)'
        """.write(toFile: fakeBin + "/systemctl", atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: fakeBin + "/systemctl")
        let path = fakeBin + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        let uninstall = try cli.run(["daemon", "uninstall"], environment: ["XDG_CONFIG_HOME": config, "PATH": path])
        #expect(uninstall.status == 0, "\(uninstall.stderr)")
        let calls = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(calls.first == "--user disable --now keybagd@\(escaped).service keybagd@\(escaped).socket units:present", "\(calls)")
        #expect(calls.last == "--user daemon-reload units:absent", "\(calls)")
        #expect(!FileManager.default.fileExists(atPath: dropIn))
    }

    @Test func socketActivationAddsASocketUnitOnThisRootsPath() throws {
        let cli = CLI.make()
        let config = cli.file("config")
        let result = try cli.run(["daemon", "install", "--socket-activation", "--from-build-directory"], environment: ["XDG_CONFIG_HOME": config])
        #expect(result.status == 0, "\(result.stderr)")
        let escaped = try ChildProcess.run("systemd-escape", ["--path", cli.root]).out.trimmingCharacters(in: .newlines)
        let socketUnit = try String(contentsOfFile: config + "/systemd/user/keybagd@\(escaped).socket", encoding: .utf8)
        let socketName = (KeybagSocket.path(forRoot: cli.root) as NSString).lastPathComponent
        #expect(socketUnit.contains("ListenStream=%t/dataprotection/\(socketName)"))
        #expect(socketUnit.contains("SocketMode=0600") && socketUnit.contains("DirectoryMode=0700"))
        #expect(result.out.contains("systemctl --user enable --now 'keybagd@\(escaped).socket'"))
    }
}
