import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// Without `XDG_RUNTIME_DIR` (su, sudo, cron, many ssh set-ups) keybagd's socket falls back to
/// `/tmp/dataprotection-UID`, which another local user can create first. A hostile second user
/// plays keybagd there; the victim's dpctl must send it nothing — no passcode, no file key.
@Suite(.serialized) struct KeybagdImpersonationTests {
    /// A victim of its own (a fresh uid) with a device, and a hostile uid.
    struct Victim {
        let uid: Int, attacker: Int
        let home: String, root: String, passcode: String
        var fallback: String { "/tmp/dataprotection-\(uid)" }
        var socket: String { fallback + "/keybagd-\(KeybagSocket.rootDigest(root)).sock" }

        init() throws {
            uid = Int.random(in: 40_000...49_999)
            attacker = uid + 10_000
            home = NSTemporaryDirectory() + "dp-victim-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            root = home + "/root"
            passcode = home + "/passcode"
            try Data("123456".utf8).write(to: URL(fileURLWithPath: passcode))
            #expect(chown(home, uid_t(uid), gid_t(uid)) == 0 && chown(passcode, uid_t(uid), gid_t(uid)) == 0)
            try? FileManager.default.removeItem(atPath: fallback)
            let made = try dpctl(["init", "--passcode-file", passcode])
            #expect(made.status == 0, "\(made.err)")
        }

        /// `dpctl --root ROOT ARGS…` as the victim, without `XDG_RUNTIME_DIR`.
        func dpctl(_ args: [String]) throws -> ChildProcess {
            try ChildProcess.run("env", ["-u", "XDG_RUNTIME_DIR", "setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups",
                                         CLI.executable.path, "--root", root] + args)
        }

        /// Runs a program as the attacker.
        func asAttacker(_ arguments: [String]) throws -> Process {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(attacker)", "--regid=\(attacker)", "--clear-groups"] + arguments
            process.standardOutput = Pipe()
            try process.run()
            return process
        }
    }

    /// A fake keybagd: accepts every connection and records every byte it is sent in `log`.
    static let fakeDaemon = """
        import os, socket, sys, threading
        directory, path, log = sys.argv[1], sys.argv[2], sys.argv[3]
        os.makedirs(directory, exist_ok=True); os.chmod(directory, 0o777)
        s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o777); s.listen(16)
        open(log, "wb").close(); os.chmod(log, 0o666)
        print("ready", flush=True)
        def serve(c):
            while True:
                data = c.recv(65536)
                if not data: break
                with open(log, "ab") as f: f.write(data)
        while True:
            c, _ = s.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()
        """

    @Test func aHostileUsersFakeDaemonInTheTmpFallbackGetsNothing() throws {
        let victim = try Victim()
        defer { try? FileManager.default.removeItem(atPath: victim.fallback); try? FileManager.default.removeItem(atPath: victim.home) }
        let log = NSTemporaryDirectory() + "dp-fake-\(UUID().uuidString).log"
        let fake = try victim.asAttacker(["/usr/bin/python3", "-c", Self.fakeDaemon, victim.fallback, victim.socket, log])
        defer { kill(fake.processIdentifier, SIGKILL); fake.waitUntilExit() }
        let ready = (fake.standardOutput as! Pipe).fileHandleForReading.availableData
        #expect(String(decoding: ready, as: UTF8.self).hasPrefix("ready"))

        for args in [["status"], ["unlock", "--passcode-file", victim.passcode], ["write", victim.home + "/secret", "--class", "complete",
                                                                                   "--passcode-file", victim.passcode]] {
            let result = try victim.dpctl(args)
            #expect(result.status == 1, "\(args): \(result.status) \(result.out) \(result.err)")
            #expect(result.err.contains("refused to connect") && result.err.contains("belongs to uid \(victim.attacker)"), "\(args): \(result.err)")
        }
        let received = (try? Data(contentsOf: URL(fileURLWithPath: log))) ?? Data()
        #expect(received.isEmpty, "the fake daemon received \(received.count) bytes")
        #expect(!FileManager.default.fileExists(atPath: victim.home + "/secret"))
    }

    /// A daemon of this user for another root, reachable on this root's socket path (a link
    /// to its socket): it answers with another keybag's ID, and gets nothing else.
    @Test func aDaemonServingAnotherKeybagIsRefused() throws {
        let mine = CLI.make(), theirs = CLI.make()
        let passcode = mine.writeFile("p", "123456")
        #expect(try mine.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try theirs.run(["init", "--passcode-file", theirs.writeFile("p", "123456")]).status == 0)
        let daemon = try KeybagdProcess(cli: theirs)
        defer { daemon.stop() }
        let expected = (daemon.socket as NSString).deletingLastPathComponent + "/keybagd-\(KeybagSocket.rootDigest(mine.root)).sock"
        #expect(link(daemon.socket, expected) == 0, "\(String(cString: strerror(errno)))")
        defer { unlink(expected) }
        let refused = try mine.run(["unlock", "--passcode-file", passcode], environment: daemon.environment)
        #expect(refused.status == 1, "\(refused.stderr)")
        #expect(refused.stderr.contains("serves keybag") && refused.stderr.contains("nothing else was sent"), "\(refused.stderr)")
        #expect(try theirs.run(["status", "--check"], environment: daemon.environment).status == 3, "the other device was unlocked")
    }
}
