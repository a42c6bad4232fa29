import DataProtectionContainers
import DataProtection
import DataProtectionBackup
import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// The sandbox, attacked from inside with real processes: app A against app B's container, the
/// device's own files, its Inbox, groups it is not in, and the keys of the device.
@Suite(.serialized) struct SandboxTests {
    @Test func anAppCannotReachAnotherAppsContainerNorTheDevice() throws {
        let world = try AppWorld.make()
        try world.install("com.example.a")
        let b = try world.install("com.example.b")
        let secret = b + "/Documents/secret.txt"
        try Data("B's secret".utf8).write(to: URL(fileURLWithPath: secret))
        let root = world.cli.root
        let script = [
            attempt("read-b", "cat '\(secret)'"),
            attempt("list-b", "ls '\(b)/Documents'"),
            attempt("stat-b", "stat '\(secret)'"),
            attempt("chmod-b", "chmod 777 '\(secret)'"),
            attempt("write-b", "echo owned > '\(secret)'"),
            attempt("create-b", "echo x > '\(b)/Documents/planted.txt'"),
            attempt("list-apps", "ls '\(root)/Containers/Data/Application'"),
            attempt("read-secret", "cat '\(root)/device.secret'"),
            attempt("read-keybag", "cat '\(root)/keybag'"),
            attempt("list-root", "ls '\(root)'"),
            attempt("list-home", "ls /root"),
            attempt("own-docs", "echo mine > Documents/mine.txt"),
            attempt("own-caches", "echo c > Library/Caches/c"),
            attempt("container-root", "echo x > planted-at-root.txt"),
            attempt("metadata-write", "echo x >> .dataprotection-container.plist"),
            attempt("metadata-chmod", "chmod 666 .dataprotection-container.plist"),
            attempt("signal-init", "kill -0 1"),
            attempt("execute-from-container", "cp /bin/true tmp/t && tmp/t"),
        ].joined(separator: "\n")
        let run = try world.shell("com.example.a", script)
        #expect(run.status == 0, "\(run.stderr)")
        let seen = outcomes(run.out)
        for name in ["read-b", "list-b", "stat-b", "chmod-b", "write-b", "create-b", "list-apps", "read-secret", "read-keybag",
                     "list-root", "list-home", "container-root", "metadata-write", "metadata-chmod", "signal-init", "execute-from-container"] {
            #expect(seen[name] == "denied", "\(name): \(seen[name] ?? "not tried")")
        }
        #expect(seen["own-docs"] == "ok")
        #expect(seen["own-caches"] == "ok")
        // B's data is as it was.
        #expect(try String(contentsOfFile: secret, encoding: .utf8) == "B's secret")
        #expect(try FileManager.default.attributesOfItem(atPath: secret)[.posixPermissions] as? Int == 0o644)
        #expect(!FileManager.default.fileExists(atPath: b + "/Documents/planted.txt"))
    }

    @Test func theInboxIsReadableAndDeletableNotWritable() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        try Data("from another app".utf8).write(to: URL(fileURLWithPath: a + "/.Inbox/attachment.txt"))
        try Data("keep".utf8).write(to: URL(fileURLWithPath: a + "/.Inbox/other.txt"))
        let script = [
            attempt("read", "cat Documents/Inbox/attachment.txt"),
            attempt("list", "ls Documents/Inbox"),
            attempt("create", "echo x > Documents/Inbox/new.txt"),
            attempt("append", "echo x >> Documents/Inbox/other.txt"),
            attempt("truncate", "truncate -s 0 Documents/Inbox/other.txt"),
            attempt("mkdir", "mkdir Documents/Inbox/sub"),
            attempt("rename-in", "echo y > Documents/y.txt && mv Documents/y.txt Documents/Inbox/y.txt"),
            attempt("copy-out", "cp Documents/Inbox/attachment.txt Documents/edit.txt"),
            attempt("delete", "rm Documents/Inbox/attachment.txt"),
        ].joined(separator: "\n")
        let run = try world.shell("com.example.a", script)
        let seen = outcomes(run.out)
        #expect(seen["read"] == "ok" && seen["list"] == "ok" && seen["copy-out"] == "ok" && seen["delete"] == "ok", "\(seen)")
        for name in ["create", "append", "truncate", "mkdir", "rename-in"] { #expect(seen[name] == "denied", "\(name)") }
        #expect(try String(contentsOfFile: a + "/.Inbox/other.txt", encoding: .utf8) == "keep")
        #expect(!FileManager.default.fileExists(atPath: a + "/.Inbox/attachment.txt"))
        #expect(!FileManager.default.fileExists(atPath: a + "/.Inbox/new.txt"))
    }

    @Test func membersShareTheGroupContainerAndNobodyElseReachesIt() throws {
        let world = try AppWorld.make()
        try world.install("com.example.writer", ["--group", "group.com.example.notes"])
        try world.install("com.example.reader", ["--group", "group.com.example.notes"])
        try world.install("com.example.outsider", ["--group", "group.com.example.other"])
        let group = try world.groupContainer(of: "com.example.writer", "group.com.example.notes")
        #expect(try world.groupContainer(of: "com.example.reader", "group.com.example.notes") == group)

        let write = try world.shell("com.example.writer", attempt("write", "echo shared > '\(group)/note.txt'") + "\n"
                                    + attempt("link-out", "ln '\(group)/note.txt' Documents/kept.txt"))
        let wrote = outcomes(write.out)
        #expect(wrote["write"] == "ok", "\(write.stderr)")
        #expect(wrote["link-out"] == "denied")
        let read = try world.shell("com.example.reader", "cat '\(group)/note.txt'")
        #expect(read.out == "shared\n", "\(read.stderr)")

        let outsider = try world.shell("com.example.outsider", [attempt("read", "cat '\(group)/note.txt'"), attempt("list", "ls '\(group)'"),
                                                                attempt("stat", "stat '\(group)'")].joined(separator: "\n"))
        #expect(Set(outcomes(outsider.out).values) == ["denied"], "\(outsider.out)")
        // The API answers as iOS does: nil for a group the app is not in.
        let places = try world.testApp("com.example.outsider", ["places", "group.com.example.notes", "group.com.example.other"])
        let json = try JSONSerialization.jsonObject(with: places.stdout) as? [String: String]
        #expect(json?["group:group.com.example.notes"] == "nil", "\(places.stderr)")
        #expect(json?["group:group.com.example.other"]?.hasPrefix(world.cli.root) == true)
        let member = try JSONSerialization.jsonObject(with: try world.testApp("com.example.reader", ["places", "group.com.example.notes"]).stdout) as? [String: String]
        #expect(member?["group:group.com.example.notes"] == group)
    }

    /// A program in any language finds its groups' containers in DATAPROTECTION_GROUP_CONTAINERS
    /// (one GROUP=PATH line each, sorted), and uses them: a shell script writes into one, a
    /// member of that group reads it; an app in no group gets no variable.
    @Test func appsInAnyLanguageFindTheirGroupContainers() throws {
        let world = try AppWorld.make()
        try world.install("com.example.shell", ["--group", "group.com.example.b", "--group", "group.com.example.a"])
        try world.install("com.example.member", ["--group", "group.com.example.b"])
        try world.install("com.example.alone")
        let a = try world.groupContainer(of: "com.example.shell", "group.com.example.a")
        let b = try world.groupContainer(of: "com.example.shell", "group.com.example.b")
        let listed = try world.shell("com.example.shell", "printf '%s' \"$DATAPROTECTION_GROUP_CONTAINERS\"")
        #expect(listed.out == "group.com.example.a=\(a)\ngroup.com.example.b=\(b)", "\(listed.out) \(listed.stderr)")
        let write = try world.shell("com.example.shell", """
            printf '%s\\n' "$DATAPROTECTION_GROUP_CONTAINERS" | while IFS='=' read -r id path; do
                [ "$id" = group.com.example.b ] && echo "from a shell script" > "$path/note.txt"
            done; true
            """)
        #expect(write.status == 0, "\(write.stderr)")
        let read = try world.shell("com.example.member", "cat \"${DATAPROTECTION_GROUP_CONTAINERS#*=}/note.txt\"")
        #expect(read.out == "from a shell script\n", "\(read.stderr)")
        let alone = try world.shell("com.example.alone", "echo \"${DATAPROTECTION_GROUP_CONTAINERS-unset}\"")
        #expect(alone.out == "unset\n", "\(alone.out)")
    }

    @Test func unmodifiedFoundationFindsTheContainersPlaces() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        let run = try world.testApp("com.example.a", ["places"])
        #expect(run.status == 0, "\(run.stderr)")
        let places = try JSONSerialization.jsonObject(with: run.stdout) as? [String: String] ?? [:]
        #expect(places["home"] == a)
        #expect(places["tmp"] == a + "/tmp/")
        #expect(places["documents"] == a + "/Documents")
        #expect(places["caches"] == a + "/Library/Caches")
        #expect(places["applicationSupport"] == a + "/Library/Application Support")
        #expect(places["identifier"] == "com.example.a")
        #expect(places["sandboxed"] == "yes")
    }

    @Test func anAppCannotUnlockLockOrEraseTheDevice() throws {
        let world = try AppWorld.make()
        try world.install("com.example.a")
        let run = try world.testApp("com.example.a", ["attack-keybag", "123456"], extra: ["--passcode-file", world.passcode])
        #expect(run.status == 0, "\(run.out)\(run.stderr)")
        #expect(!run.out.contains("ALLOWED"))
        #expect(run.out.contains("unlock: refused: not permitted"))
        #expect(run.out.contains("erase: refused: not permitted"))
        // The device is intact: same passcode, no failed attempt counted, not erased.
        let status = try world.dpctl(["status", "--json"])
        let json = try JSONSerialization.jsonObject(with: status.stdout) as? [String: Any]
        #expect(json?["passcodeSet"] as? Bool == true)
        #expect(json?["failedAttempts"] as? Int == 0)
        #expect(try world.shell("com.example.a", "true", extra: ["--passcode-file", world.passcode]).status == 0)   // the passcode still opens it
    }

    @Test func aClassAFileFollowsTheDevicesLockInsideTheApp() throws {
        var world = try AppWorld.make()
        let daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        world.environment = daemon.environment
        try world.install("com.example.vault", ["--default-protection", "complete"])
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        let note = try world.container("com.example.vault") + "/Documents/note.txt"
        let write = try world.testApp("com.example.vault", ["write", note, "class A"])
        #expect(write.out.contains("class complete"), "\(write.stderr)")
        #expect(try world.testApp("com.example.vault", ["read", note]).out == "class A\n")

        #expect(try world.dpctl(["lock"]).status == 0)
        try daemon.advance(11, root: world.cli.root)   // past the 10 s grace period
        let locked = try world.testApp("com.example.vault", ["read", note])
        #expect(locked.status == 3, "\(locked.out) \(locked.stderr)")
        #expect(locked.stderr.contains("unavailable") || locked.stderr.contains("locked"), "\(locked.stderr)")

        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        #expect(try world.testApp("com.example.vault", ["read", note]).out == "class A\n")
    }

    @Test func theAppHearsTheDevicesLockThroughItsSupervisor() throws {
        var world = try AppWorld.make()
        let daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        world.environment = daemon.environment
        try world.install("com.example.a")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", "com.example.a", "--", AppWorld.testApp, "wait-lock-event"]
        process.environment = ProcessInfo.processInfo.environment.merging(daemon.environment) { $1 }
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        #expect(try readLine(out.fileHandleForReading) == "subscribed")
        #expect(try world.dpctl(["lock"]).status == 0)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).contains("willBecomeUnavailable"))
    }

    @Test func abstractSocketsOutsideTheSandboxAreOutOfReach() throws {
        let world = try AppWorld.make()
        try world.install("com.example.a")
        let name = "dp-test-" + UUID().uuidString
        let listener = Process()
        listener.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        listener.arguments = ["-c", "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.bind('\\0\(name)')\ns.listen()\nprint('ready',flush=True)\nsys.stdin.read()"]
        let out = Pipe(), input = Pipe()
        listener.standardOutput = out
        listener.standardInput = input
        try listener.run()
        defer { try? input.fileHandleForWriting.close(); listener.waitUntilExit() }
        #expect(try readLine(out.fileHandleForReading) == "ready")
        let connect = "import socket\ns=socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0\(name)'); print('connected')\nexcept OSError as e: print('refused', e.errno)"
        // Outside, the socket answers (the check can fail); inside, it is not there (the app's own
        // network namespace has its own abstract names: ECONNREFUSED), or refused (Landlock: EPERM).
        let outside = Process()
        outside.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        outside.arguments = ["-c", connect]
        let outsideOut = Pipe()
        outside.standardOutput = outsideOut
        try outside.run()
        outside.waitUntilExit()
        #expect(String(decoding: outsideOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "connected\n")
        let inside = try world.dpctl(["app", "run", "com.example.a", "--", "/usr/bin/python3", "-c", connect])
        #expect(["refused 1\n", "refused 111\n"].contains(inside.out), "\(inside.out) \(inside.stderr)")
    }

    @Test func aMissingPartOfTheSandboxIsAOneLineRefusal() throws {
        let world = try AppWorld.make()
        try world.install("com.example.a")
        let noBwrap = try world.dpctl(["app", "run", "com.example.a", "--", "/bin/true"], environment: ["DATAPROTECTION_BWRAP": "/nonexistent/bwrap"])
        #expect(noBwrap.status == 1)
        #expect(noBwrap.stderr.contains("bubblewrap"))
        #expect(noBwrap.stderr.split(separator: "\n").count == 1)
        let oldKernel = try world.dpctl(["app", "run", "com.example.a", "--", "/bin/true"], environment: ["DATAPROTECTION_LANDLOCK_ABI_LIMIT": "2"])
        #expect(oldKernel.status == 1)
        #expect(oldKernel.stderr.contains("Landlock ABI 2 is too old"), "\(oldKernel.stderr)")
        #expect(oldKernel.stderr.split(separator: "\n").count == 1)
        let unknown = try world.dpctl(["app", "run", "com.example.nope", "--", "/bin/true"])
        #expect(unknown.status == 1 && unknown.stderr == "dpctl: no app com.example.nope is installed\n")
        let badID = try world.dpctl(["app", "install", "not_reverse_dns"])
        #expect(badID.status == 64 && badID.stderr.contains("like com.example.notes") && badID.stderr.split(separator: "\n").count == 1)
        let noCommand = try world.dpctl(["app", "run", "com.example.a"])
        #expect(noCommand.status == 64)
        let missing = try world.dpctl(["app", "run", "com.example.a", "--", "/nonexistent/app"])
        #expect(missing.status == 1 && missing.stderr.contains("not an executable file"))
        // The app's own exit status comes back; an app that dies of a signal gives 128 + its
        // number, as shells do, for every signal (the app gets every signal at its default action).
        #expect(try world.shell("com.example.a", "exit 7").status == 7)
        for (name, number) in [("TERM", 15), ("INT", 2), ("HUP", 1), ("KILL", 9), ("SEGV", 11), ("USR1", 10), ("QUIT", 3)] {
            for extra in [[], ["--no-sandbox"]] {
                let died = try world.shell("com.example.a", "kill -\(name) $$; echo survived; exit 0", extra: extra)
                #expect(died.status == Int32(128 + number), "SIG\(name) \(extra): \(died.status) \(died.out)")
                #expect(!died.out.contains("survived"))
            }
        }
        // No standard signal (1…31) is blocked or ignored in the app (32 and 33 belong to glibc).
        let ignored = try world.shell("com.example.a", "grep -E '^Sig(Ign|Blk)' /proc/self/status")
        let masks = ignored.out.split(separator: "\n").compactMap { $0.split(separator: "\t").last.flatMap { UInt64($0, radix: 16) } }
        #expect(masks.count == 2 && masks.allSatisfy { $0 & 0x7FFF_FFFF == 0 }, "\(ignored.out)")
        // Unconfined only when asked, and said so.
        let loose = try world.shell("com.example.a", "cat '\(world.cli.root)/keybag' >/dev/null && echo reached", extra: ["--no-sandbox"])
        #expect(loose.out == "reached\n")
        #expect(loose.stderr.contains("WITHOUT its sandbox"))
    }

    @Test func aRunningAppCannotBeUninstalledAndEndsWithItsSupervisor() throws {
        let world = try AppWorld.make()
        let a = try world.install("com.example.a")
        // The app runs until its standard input closes.
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", "com.example.a", "--", "/bin/sh", "-c", "echo started; cat > /dev/null; echo done"]
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        #expect(try readLine(output.fileHandleForReading) == "started")
        let refused = try world.dpctl(["app", "uninstall", "com.example.a"])
        #expect(refused.status == 1 && refused.stderr.contains("is running"), "\(refused.stderr)")
        #expect(FileManager.default.fileExists(atPath: a))
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(try world.dpctl(["app", "uninstall", "com.example.a"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: a))

        // Killing the supervisor kills the app: nothing of it runs on in the background.
        let marker = try world.install("com.example.b") + "/Documents/alive"
        let supervisor = Process()
        supervisor.executableURL = CLI.executable
        supervisor.arguments = ["--root", world.cli.root, "app", "run", "com.example.b", "--", "/bin/sh", "-c",
                                "echo started; while true; do echo x >> '\(marker)'; read -t 1 x < /dev/zero 2>/dev/null || true; done"]
        let out = Pipe()
        supervisor.standardOutput = out
        try supervisor.run()
        #expect(try readLine(out.fileHandleForReading) == "started")
        kill(supervisor.processIdentifier, SIGKILL)
        supervisor.waitUntilExit()
        // The app's processes go with it (its sandbox's init is killed, and the pid namespace with
        // it): waited for by polling /proc, at most 5 s.
        func appProcesses() -> [String] {
            ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).filter { pid in
                guard Int(pid) != nil, let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
                return String(decoding: cmdline, as: UTF8.self).contains(marker)   // this test's app only
            }
        }
        var remaining = appProcesses()
        for _ in 0..<500 where !remaining.isEmpty {
            usleep(10_000)
            remaining = appProcesses()
        }
        #expect(remaining.isEmpty, "still running: \(remaining)")
        #expect(try world.dpctl(["app", "uninstall", "com.example.b"]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: marker))
    }
}

/// FORMAT.md §10's test vectors, checked against what the code reads and writes.
@Suite struct ContainerFormatVectors {
    @Test func theMetadataExampleDecodes() throws {
        let xml = """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0"><dict>
          <key>Created</key><date>2026-11-23T10:38:58Z</date>
          <key>DefaultProtection</key><string>completeUntilFirstUserAuthentication</string>
          <key>DocumentBrowser</key><false/>
          <key>Groups</key><array><string>group.com.example.notes</string></array>
          <key>Identifier</key><string>com.example.notes</string>
          <key>Kind</key><string>application</string>
          <key>SchemaVersion</key><integer>1</integer>
          <key>UUID</key><string>E9C47FEF-4E79-4B8D-ACE1-D7716ACC7244</string>
        </dict></plist>
        """
        let metadata = try PropertyListDecoder().decode(ContainerMetadata.self, from: Data(xml.utf8))
        #expect(metadata.kind == .application && metadata.identifier == "com.example.notes" && metadata.schemaVersion == 1)
        #expect(metadata.uuid == UUID(uuidString: "E9C47FEF-4E79-4B8D-ACE1-D7716ACC7244"))
        #expect(metadata.protectionClass == .completeUntilFirstUserAuthentication && metadata.groups == ["group.com.example.notes"])
    }

    @Test func anUnlockOnAChannelGetsTheDocumentedBytes() throws {
        let world = try AppWorld.make()
        try world.install("com.example.a")
        let run = try world.testApp("com.example.a", ["raw-unlock"])
        let message = Array("an app cannot ask for unlock (only the lock state: the file system protects its files)".utf8)
        let expected = [0x00, 0x00, 0x00, 0x5b, 0x01, 0x01, 0x14, 0x00, 0x56] + message
        #expect(run.out == expected.map { String(format: "%02x", $0) }.joined() + "\n", "\(run.stderr)")
    }
}
