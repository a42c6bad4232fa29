import DataProtectionTestSupport
import Foundation
import Testing

/// Crossing 2, a Share extension reading the sender's item, with real processes: read-only
/// descriptors for the length of the share, a snapshot by default, live only when asked.
@Suite(.serialized) struct ShareTests {
    let sender = "com.example.sender"
    let receiver = "com.example.extension"

    /// Shares `Documents/doc.txt` ("v1") — `live` or not — with a receiver that reads it, then
    /// again after the sender wrote "v2", tries to write, ends the share and tries again.
    func share(live: Bool) throws -> (lines: [String], original: String) {
        let world = try AppWorld.make()
        let a = try world.install(sender)
        try world.install(receiver)
        let unlock = ["--passcode-file", world.passcode]
        let doc = a + "/Documents/doc.txt"
        #expect(try world.dpctl(["write", doc] + unlock, input: Data("v1".utf8)).status == 0)

        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", receiver] + unlock + ["--", AppWorld.testApp, "wait-shared"]
        let input = Pipe(), output = Pipe()
        (process.standardInput, process.standardOutput) = (input, output)
        try process.run()
        #expect(try readLine(output.fileHandleForReading) == "listening")
        let shared = try world.testApp(sender, ["share", doc, receiver] + (live ? ["live"] : []), extra: unlock)
        #expect(shared.out == "shared\n", "\(shared.stderr)")
        #expect(try readLine(output.fileHandleForReading) == "shared by \(sender): v1")
        #expect(try world.dpctl(["write", doc] + unlock, input: Data("v2".utf8)).status == 0)
        input.fileHandleForWriting.write(Data("go\n".utf8))
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        let lines = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n").map(String.init)
        let original = try world.dpctl(["cat", doc] + unlock).out
        #expect(try FileManager.default.contentsOfDirectory(atPath: world.cli.root + "/Sharing/Snapshots").isEmpty, "the snapshot went with the share")
        #expect(try world.dpctl(["grants"]).out.isEmpty)
        return (lines, original)
    }

    @Test func aSnapshotShareKeepsTheSendersLaterWritesPrivate() throws {
        let (lines, original) = try share(live: false)
        #expect(lines.first == "again: v1", "\(lines)")
        try expectReadOnlyAndEnded(lines)
        #expect(original == "v2")
    }

    @Test func aLiveShareSeesTheSendersLaterWritesButStillCannotWrite() throws {
        let (lines, original) = try share(live: true)
        #expect(lines.first == "again: v2", "\(lines)")
        try expectReadOnlyAndEnded(lines)
        #expect(original == "v2", "the receiver's write attempts changed nothing")
    }

    /// A snapshot shared with an app on the protected file system keeps its class there: the
    /// recipient's descriptor reads it while the device is unlocked, gets `EACCES` after lock +
    /// grace (class A; nothing decrypted was handed over), and reads again after the next unlock;
    /// its mode and class cannot be changed through the descriptor.
    @Test func aSnapshotKeepsItsClassInTheRecipientAcrossTheLock() throws {
        var world = try AppWorld.make()
        let a = try world.install(sender, ["--default-protection", "complete"])
        try world.install(receiver)
        let daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        world.environment = daemon.environment
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        let doc = a + "/Documents/doc.txt"
        #expect(try world.dpctl(["write", doc], input: Data("secret".utf8)).status == 0)
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", receiver, "--", AppWorld.testApp, "hold-shared"]
        process.environment = ProcessInfo.processInfo.environment.merging(daemon.environment) { $1 }
        let input = Pipe(), output = Pipe()
        (process.standardInput, process.standardOutput) = (input, output)
        try process.run()
        #expect(try readLine(output.fileHandleForReading) == "listening")
        let shared = try world.testApp(sender, ["share", doc, receiver])
        #expect(shared.out == "shared\n", "\(shared.stderr)")
        #expect(try readLine(output.fileHandleForReading) == "held: secret")
        let changes = try readLine(output.fileHandleForReading)
        // The class: EACCES from the kernel (a 0400 file) before EPERM from the server.
        #expect(changes.hasPrefix("chmod: errno \(EPERM), class: errno "), "a snapshot stays as shared: \(changes)")
        #expect(try world.dpctl(["lock"]).status == 0)
        try daemon.advance(3600, root: world.cli.root)
        // The file system hears of the lock from keybagd: asked again until it has.
        func readAgain(until expected: String) throws -> String {
            var line = ""
            for _ in 0..<2000 where line != expected {
                input.fileHandleForWriting.write(Data("again\n".utf8))
                line = try readLine(output.fileHandleForReading)
            }
            return line
        }
        #expect(try readAgain(until: "again: errno \(EACCES)") == "again: errno \(EACCES)")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        #expect(try readAgain(until: "again: secret") == "again: secret")
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: world.cli.root + "/Containers").allSatisfy { !$0.hasPrefix(".dataprotection-snapshot") },
                "the name the snapshot was opened by is gone")
    }

    /// Snapshots on another file system than the containers (a mount of its own) cannot be
    /// linked beside them: one ciphertext copy is made for the share, whatever the number of
    /// opens, and goes when the share ends.
    @Test(.enabled(if: geteuid() == 0, "mounts a tmpfs")) func aSnapshotOnAnotherFileSystemIsCopiedOnce() throws {
        let world = try AppWorld.make()
        let a = try world.install(sender)
        try world.install(receiver)
        let sharing = world.cli.root + "/Sharing"
        try FileManager.default.createDirectory(atPath: sharing, withIntermediateDirectories: true)
        guard mount("tmpfs", sharing, "tmpfs", 0, "mode=0700") == 0 else { throw TestFailure("mount tmpfs: \(errno)") }
        defer { umount2(sharing, Int32(MNT_DETACH)) }
        let doc = a + "/Documents/doc.txt"
        #expect(try world.dpctl(["write", doc, "--passcode-file", world.passcode], input: Data("copied".utf8)).status == 0)
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", receiver, "--passcode-file", world.passcode, "--", AppWorld.testApp, "hold-shared"]
        let input = Pipe(), output = Pipe()
        (process.standardInput, process.standardOutput) = (input, output)
        try process.run()
        #expect(try readLine(output.fileHandleForReading) == "listening")
        #expect(try world.testApp(sender, ["share", doc, receiver], extra: ["--passcode-file", world.passcode]).out == "shared\n")
        #expect(try readLine(output.fileHandleForReading) == "held: copied")
        _ = try readLine(output.fileHandleForReading)   // chmod, class
        for _ in 0..<5 {
            input.fileHandleForWriting.write(Data("open\n".utf8))
            #expect(try readLine(output.fileHandleForReading) == "opened: copied")
        }
        let copies = { try FileManager.default.contentsOfDirectory(atPath: world.cli.root + "/Containers").filter { $0.hasPrefix(".dataprotection-snapshot") } }
        let made = try copies()
        #expect(made.count == 1, "\(made)")
        try input.fileHandleForWriting.close()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(try copies().isEmpty, "the share ended with the run: its copy is gone")
    }

    func expectReadOnlyAndEnded(_ lines: [String]) throws {
        #expect(lines.count == 5, "\(lines)")
        guard lines.count == 5 else { return }
        #expect(lines[1] == "write failed errno \(EBADF)")
        #expect(lines[2].hasPrefix("write through the broker:") && lines[2].contains("does not allow write"), "\(lines[2])")
        #expect(lines[3].hasPrefix("after end:") && lines[3].contains("not started"), "\(lines[3])")
        #expect(lines[4] == "restart: refused")
    }
}
