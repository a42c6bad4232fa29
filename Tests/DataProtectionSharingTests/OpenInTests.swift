@testable import DataProtectionSharing
import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing

/// Crossing 1, "open in another app", with real processes: the copy, its class and key, its
/// delivery, and every way a sender (or a planted item) could try to make the broker read or
/// write where it should not.
@Suite(.serialized) struct OpenInTests {
    let sender = "com.example.sender"
    let viewer = "com.example.viewer"

    func world() throws -> (world: AppWorld, sender: String, viewer: String) {
        let world = try AppWorld.make()
        return (world, try world.install(sender), try world.install(viewer))
    }

    func inbox(_ container: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: container + "/.Inbox").sorted()
    }

    func bytes(_ path: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path))) }

    @Test func theRecipientGetsItsOwnProtectedCopyAndHearsOfItAtItsNextLaunch() throws {
        let (world, a, b) = try world()
        let source = a + "/Documents/report.txt"
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["write", source, "--class", "complete"] + unlock, input: Data("v1 secret".utf8)).status == 0)
        let sent = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/report.txt"] + unlock)
        #expect(sent.status == 0, "\(sent.stderr)")
        #expect(try inbox(b) == ["report.txt"])
        let copy = b + "/.Inbox/report.txt"
        let (original, copied) = (try bytes(source), try bytes(copy))
        #expect(copied[12] == 1, "the copy keeps class A (stronger than the viewer's C)")
        #expect(copied == original, "class A is at least the viewer's default: the ciphertext is copied as it is")
        #expect(!copied.indices.dropLast(8).contains { Array(copied[$0..<($0 + 9)]) == Array("v1 secret".utf8) }, "no plaintext on disk")
        #expect(try world.dpctl(["cat", copy] + unlock).out == "v1 secret")

        // The sender's later write never reaches the copy.
        #expect(try world.dpctl(["write", source] + unlock, input: Data("v2 changed".utf8)).status == 0)
        #expect(try world.dpctl(["cat", copy] + unlock).out == "v1 secret")

        // The viewer was not running: it hears of the file at its next launch, once.
        let run = try world.testApp(viewer, ["wait-opened", "1"], extra: unlock)
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.out.contains("opened report.txt from \(sender) in \(b)/Documents/Inbox: v1 secret"), "\(run.out)")
        let queue = world.cli.root + "/Sharing/Deliveries/" + URL(fileURLWithPath: b).lastPathComponent
        #expect(try FileManager.default.contentsOfDirectory(atPath: queue).isEmpty)
    }

    @Test func aRunningAppIsToldAndASandboxedSenderReachesNothingBeyondItsContainers() throws {
        let (world, a, b) = try world()
        let unlock = ["--passcode-file", world.passcode]
        try Data("B's own".utf8).write(to: URL(fileURLWithPath: b + "/Documents/own.txt"))
        let (listener, out) = try world.start(viewer, ["wait-opened", "1"], extra: unlock)
        #expect(try readLine(out.fileHandleForReading) == "listening")

        #expect(try world.testApp(sender, ["write", a + "/Documents/note.txt", "a note"], extra: unlock).status == 0)
        for outside in ["/etc/passwd", b + "/Documents/own.txt", world.cli.root + "/keybag", a + "/../" + URL(fileURLWithPath: b).lastPathComponent + "/Documents/own.txt"] {
            let refused = try world.testApp(sender, ["open-in", outside, viewer], extra: unlock)
            #expect(refused.status == 1 && refused.stderr.split(separator: "\n").count == 1, "\(outside): \(refused.stderr)")
        }
        let sent = try world.testApp(sender, ["open-in", a + "/Documents/note.txt", viewer], extra: unlock)
        #expect(sent.out == "sent\n", "\(sent.stderr)")
        listener.waitUntilExit()
        #expect(listener.terminationStatus == 0)
        let heard = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(heard == "opened note.txt from \(sender) in \(b)/Documents/Inbox: a note\n", "\(heard)")
        #expect(try inbox(b) == ["note.txt"])
    }

    @Test func aMaliciousSendersNamesLandAsSafeNamesInsideTheInbox() throws {
        let (world, a, b) = try world()
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.testApp(sender, ["write", a + "/tmp/payload", "payload"], extra: unlock).status == 0)
        let names: [[UInt8]] = [
            Array("../../x".utf8), Array("/etc/passwd".utf8), Array("a/b".utf8), Array("line\nbreak.txt".utf8),
            [UInt8](repeating: UInt8(ascii: "a"), count: 4000), [0x6C, 0x61, 0x74, 0xE9, 0x2E, 0x74, 0x78, 0x74],
            Array(".hidden".utf8), Array("..".utf8), Array("evil\u{202E}txt.exe".utf8), Array("../../x".utf8),
        ]
        for name in names {
            let hex = name.map { String(format: "%02x", $0) }.joined()
            let sent = try world.testApp(sender, ["open-in", a + "/tmp/payload", viewer, hex], extra: unlock)
            #expect(sent.status == 0, "\(name): \(sent.stderr)")
        }
        let landed = try inbox(b)
        #expect(Set(landed) == ["x", "etcpasswd", "ab", "linebreak.txt", String(repeating: "a", count: 240), "lat_.txt", "hidden",
                                "Untitled", "eviltxt.exe", "x 2"], "\(landed)")
        for name in landed {
            var isDirectory: ObjCBool = false
            #expect(FileManager.default.fileExists(atPath: b + "/.Inbox/" + name, isDirectory: &isDirectory) && !isDirectory.boolValue)
            #expect(try world.dpctl(["cat", b + "/.Inbox/" + name] + unlock).out == "payload")
        }
        // Nothing anywhere else.
        #expect(!FileManager.default.fileExists(atPath: b + "/x") && !FileManager.default.fileExists(atPath: world.cli.root + "/x"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: b + "/Documents").sorted() == ["Inbox"])
    }

    @Test func linksDirectoriesFIFOsAndHardLinksAreRefusedAndNothingIsCopied() throws {
        let (world, a, b) = try world()
        let unlock = ["--passcode-file", world.passcode]
        try Data("plain".utf8).write(to: URL(fileURLWithPath: a + "/Documents/real.txt"))
        try FileManager.default.createSymbolicLink(atPath: a + "/Documents/to-passwd", withDestinationPath: "/etc/passwd")
        try FileManager.default.createSymbolicLink(atPath: a + "/Documents/to-real", withDestinationPath: "real.txt")
        try FileManager.default.createSymbolicLink(atPath: a + "/Documents/linked-dir", withDestinationPath: world.cli.root)
        #expect(mkfifo(a + "/tmp/fifo", 0o600) == 0)
        #expect(link(a + "/Documents/real.txt", a + "/Documents/hard.txt") == 0)
        let cases = ["Documents/to-passwd": "symbolic link", "Documents/to-real": "symbolic link", "Documents/linked-dir/keybag": "symbolic link",
                     "Documents": "directory", "tmp/fifo": "FIFO", "Documents/hard.txt": "hard links", "Documents/../../keybag": "out of its container",
                     "/etc/passwd": "not in", "Documents/missing.txt": "no such file"]
        for (item, reason) in cases {
            let result = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, item] + unlock)
            #expect(result.status == 1, "\(item)")
            #expect(result.stderr.contains(reason) && result.stderr.split(separator: "\n").count == 1, "\(item): \(result.stderr)")
        }
        #expect(try inbox(b).isEmpty)
    }

    @Test func aSparseGiantIsRefusedBeforeItFillsTheDisk() throws {
        let (world, a, b) = try world()
        // 8 TiB that cost the sender nothing: copied, it would fill the disk every app shares.
        let giant = a + "/Documents/giant.bin"
        #expect(FileManager.default.createFile(atPath: giant, contents: nil))
        #expect(truncate(giant, 8 << 40) == 0)
        let result = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/giant.bin", "--passcode-file", world.passcode])
        #expect(result.status == 1 && result.stderr.contains("no room"), "\(result.stderr)")
        #expect(try inbox(b).isEmpty)
    }

    @Test func aClassAFileIsSentWhileTheDeviceIsLockedFromItsCiphertextAlone() throws {
        let (world, a, b) = try world()
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["write", a + "/Documents/a.txt", "--class", "complete"] + unlock, input: Data("class A".utf8)).status == 0)
        // A new dpctl process without the passcode: the device is locked, no class key is there.
        let result = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/a.txt"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(try inbox(b) == ["a.txt"])
        #expect(try bytes(b + "/.Inbox/a.txt") == bytes(a + "/Documents/a.txt"))
        #expect(try world.dpctl(["cat", b + "/.Inbox/a.txt"]).status == 3, "still class A: unreadable while locked")
        #expect(try world.dpctl(["cat", b + "/.Inbox/a.txt"] + unlock).out == "class A")
    }

    @Test func aWeakerFileRaisedToTheRecipientsClassNeedsItsKeyAndFailsWhileLocked() throws {
        let world = try AppWorld.make()
        let a = try world.install(sender)
        let b = try world.install(viewer, ["--default-protection", "complete"])
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["write", a + "/Documents/c.txt", "--class", "C"] + unlock, input: Data("class C".utf8)).status == 0)
        let locked = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/c.txt"])
        #expect(locked.status == 3, "\(locked.stderr)")
        #expect(locked.stderr.contains("locked") && locked.stderr.split(separator: "\n").count <= 2, "\(locked.stderr)")
        #expect(try inbox(b).isEmpty)
        let queue = world.cli.root + "/Sharing/Deliveries/" + URL(fileURLWithPath: b).lastPathComponent
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: queue)) ?? []).isEmpty)

        // Unlocked, the key is rewrapped to class A; the segments are the source's.
        #expect(try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/c.txt"] + unlock).status == 0)
        let (original, copied) = (try bytes(a + "/Documents/c.txt"), try bytes(b + "/.Inbox/c.txt"))
        #expect(copied[12] == 1 && original[12] == 3)
        #expect(copied[160...] == original[160...] && copied[48..<88] != original[48..<88])
        #expect(try world.dpctl(["cat", b + "/.Inbox/c.txt"] + unlock).out == "class C")
    }

    @Test func aLinkPlantedInPlaceOfTheRecipientsInboxNeverRedirectsTheCopy() throws {
        let (world, a, b) = try world()
        let unlock = ["--passcode-file", world.passcode]
        try Data("x".utf8).write(to: URL(fileURLWithPath: a + "/Documents/x.txt"))
        let elsewhere = temporaryDirectory().path
        try FileManager.default.removeItem(atPath: b + "/.Inbox")
        try FileManager.default.createSymbolicLink(atPath: b + "/.Inbox", withDestinationPath: elsewhere)
        let result = try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/x.txt"] + unlock)
        #expect(result.status == 1 && result.stderr.hasSuffix("(a link?): refused\n"), "\(result.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere).isEmpty)
    }

    @Test func uninstallingTheRecipientForgetsWhatWasQueuedForIt() throws {
        let (world, a, b) = try world()
        try Data("x".utf8).write(to: URL(fileURLWithPath: a + "/Documents/x.txt"))
        #expect(try world.dpctl(["share", "open-in", "--from", sender, "--to", viewer, "Documents/x.txt", "--passcode-file", world.passcode]).status == 0)
        let queue = world.cli.root + "/Sharing/Deliveries/" + URL(fileURLWithPath: b).lastPathComponent
        #expect(try FileManager.default.contentsOfDirectory(atPath: queue).count == 1)
        #expect(try world.dpctl(["app", "uninstall", viewer]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: queue))
        #expect(!FileManager.default.fileExists(atPath: b))
    }
}

@Suite struct InboxNameTests {
    @Test func namesAreCleanedAndNumberedNeverTrusted() {
        #expect(InboxName("report.pdf").candidate(1) == "report.pdf")
        #expect(InboxName("report.pdf").candidate(2) == "report 2.pdf")
        #expect(InboxName("../../x").candidate(1) == "x")
        #expect(InboxName("/etc/passwd").candidate(1) == "etcpasswd")
        #expect(InboxName("..\\..\\win.ini").candidate(1) == "win.ini")
        #expect(InboxName(".bashrc").candidate(1) == "bashrc")
        #expect(InboxName("...").candidate(1) == "Untitled")
        #expect(InboxName("").candidate(3) == "Untitled 3")
        #expect(InboxName("tab\there\u{7F}\u{85}.txt").candidate(1) == "tabhere.txt")
        #expect(InboxName(bytes: [0xFF, 0x61]).candidate(1) == "_a")
        let long = InboxName(String(repeating: "é", count: 300) + ".txt").candidate(10_000)
        #expect(long.utf8.count <= 255 && long.hasSuffix(" 10000.txt"))
        #expect(String(decoding: Array(long.utf8), as: UTF8.self) == long)
        // Private-use code points stand for raw bytes in LosslessPath: never in a name.
        #expect(InboxName("caf\u{10FFC3}\u{10FFA9}.txt").candidate(1) == "caf__.txt")
        // A dot with a combining mark is still a leading dot; zero-width and BOM characters go.
        #expect(InboxName(".\u{0301}bashrc").candidate(1) == "bashrc")
        #expect(InboxName("a\u{200B}b\u{FEFF}c\u{061C}.txt").candidate(1) == "abc.txt")
    }
}

/// Deliveries survive a supervisor killed while sending one: its claim is put back at the next
/// subscription, never while the claiming process lives.
@Suite struct DeliveryQueueTests {
    @Test func aClaimLeftByAKilledSupervisorIsDeliveredAgain() throws {
        let root = temporaryDirectory().path
        let queue = DeliveryQueue(layout: DataRootLayout(root: root), app: UUID())
        try FileManager.default.createDirectory(atPath: root + "/Sharing/Deliveries", withIntermediateDirectories: true)
        try queue.enqueue(Delivery(kind: .openIn, name: "a.txt", sender: "com.example.a", date: Date()))
        let record = try #require(queue.pending().first).record

        let claimed = try #require(queue.claim(record))
        #expect(queue.pending().isEmpty && queue.claim(record) == nil, "claimed once, by one subscriber")
        queue.releaseAbandonedClaims()
        #expect(queue.pending().isEmpty, "a claim of a living process stays")

        // The same claim, as if made by a process that has exited since.
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/true")
        try child.run()
        child.waitUntilExit()
        let abandoned = record + ".sending-\(child.processIdentifier)-12345"
        try FileManager.default.moveItem(atPath: queue.directory + "/" + claimed, toPath: queue.directory + "/" + abandoned)
        queue.releaseAbandonedClaims()
        #expect(queue.pending().map { $0.delivery.name } == ["a.txt"])

        // A claim whose PID lives on in another process (PID reuse) is also put back: the start time differs.
        let again = try #require(queue.claim(record))
        try FileManager.default.moveItem(atPath: queue.directory + "/" + again,
                                         toPath: queue.directory + "/" + record + ".sending-\(getpid())-1")
        queue.releaseAbandonedClaims()
        #expect(queue.pending().count == 1)
    }
}

/// Which apps are installed is not an app's business: an unknown target is answered as a
/// refusing one, in the same words.
@Suite struct InstalledAppsStayPrivateTests {
    @Test func anUnknownTargetIsAnsweredAsARefusedOne() throws {
        let world = try AppWorld.make()
        let sender = "com.example.sender"
        let a = try world.install(sender)
        try world.install("com.example.present")
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.testApp(sender, ["write", a + "/Documents/note.txt", "a note"], extra: unlock).status == 0)
        for target in ["com.example.absent", "com.example.never.there"] {
            for request in [["open-in", a + "/Documents/note.txt", target], ["share", a + "/Documents/note.txt", target]] {
                let refused = try world.testApp(sender, request, extra: unlock)
                #expect(refused.status == 1, "\(request): \(refused.stderr)")
                #expect(refused.stderr.contains("\(target) does not accept this request"), "\(request): \(refused.stderr)")
                #expect(!refused.stderr.contains("installed"), "\(request): \(refused.stderr)")
            }
        }
        // The device's owner still gets the plain answer.
        let owner = try world.dpctl(["share", "open-in", "--from", sender, "--to", "com.example.absent", "Documents/note.txt"] + unlock)
        #expect(owner.status == 1 && owner.stderr.contains("no app com.example.absent is installed"), "\(owner.stderr)")
    }
}
