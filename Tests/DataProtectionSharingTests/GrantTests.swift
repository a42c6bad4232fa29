import DataProtectionSystem
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
@testable import DataProtectionSharing
import DataProtectionTestSupport
import Foundation
import SystemPackage
import Testing

/// Crossings 3 and 4, file-provider grants and the document browser, with real processes: the
/// capabilities hold against a recipient that tries to exceed them, and grants end when they say.
@Suite(.serialized) struct GrantTests {
    let provider = "com.example.files"
    let editor = "com.example.editor"

    /// A provider exposing its Documents with `BBB.txt` ("CCCC"), and an editor.
    func world() throws -> (world: AppWorld, provider: String, editor: String) {
        let world = try AppWorld.make()
        let p = try world.install(provider, ["--document-browser"])
        let e = try world.install(editor)
        #expect(try world.dpctl(["write", p + "/Documents/BBB.txt", "--passcode-file", world.passcode], input: Data("CCCC".utf8)).status == 0)
        return (world, p, e)
    }

    func grant(_ world: AppWorld, _ item: String = "Documents/BBB.txt", _ options: [String] = []) throws -> String {
        let result = try world.dpctl(["grant", "--from", provider, "--to", editor, item] + options)
        guard result.status == 0 else { throw TestFailure("grant: \(result.stderr)") }
        return result.out.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func asEditor(_ world: AppWorld, _ args: [String]) throws -> CLI.Result {
        try world.testApp(editor, args, extra: ["--passcode-file", world.passcode])
    }

    func contents(_ world: AppWorld, _ path: String) throws -> String {
        try world.dpctl(["cat", path, "--passcode-file", world.passcode]).out
    }

    /// The document browser is changed without a reinstall (the container and its files kept):
    /// on, the user may grant Documents' items; off again, those grants start no access and no
    /// new one is made.
    @Test func theDocumentBrowserTurnsOnAndOffKeepingTheContainer() throws {
        let world = try AppWorld.make()
        let p = try world.install(provider)
        try world.install(editor)
        #expect(try world.dpctl(["write", p + "/Documents/BBB.txt", "--passcode-file", world.passcode], input: Data("CCCC".utf8)).status == 0)
        let refused = try world.dpctl(["grant", "--from", provider, "--to", editor, "Documents/BBB.txt"])
        #expect(refused.status != 0 && refused.stderr.contains("does not expose its Documents"), "\(refused.stderr)")

        let on = try world.dpctl(["app", "set-document-browser", provider, "on"])
        #expect(on.status == 0 && on.out.contains("document browser on"), "\(on.stderr)")
        #expect(try world.dpctl(["app", "info", provider]).out.contains("document browser: yes"))
        let id = try grant(world, "Documents/BBB.txt", ["--read", "--persistent"])
        #expect(try asEditor(world, ["granted-read", id]).out == "CCCC\n")

        #expect(try world.dpctl(["app", "set-document-browser", provider, "off"]).status == 0)
        let after = try asEditor(world, ["granted-read", id])
        #expect(after.status != 0 && after.stderr.contains("could not start access"), "\(after.out) \(after.stderr)")
        #expect(try world.dpctl(["grant", "--from", provider, "--to", editor, "Documents/BBB.txt"]).status != 0)
        #expect(try world.dpctl(["app", "info", provider]).out.contains("container:        \(p)"))
        #expect(try contents(world, p + "/Documents/BBB.txt") == "CCCC")
        #expect(try world.dpctl(["app", "set-document-browser", provider, "maybe"]).status == 64)
    }

    @Test func aReadOnlyGrantHandsOutReadOnlyDescriptors() throws {
        let (world, p, _) = try world()
        let id = try grant(world, "Documents/BBB.txt", ["--read", "--persistent"])
        #expect(try asEditor(world, ["granted-read", id]).out == "CCCC\n")
        // The seed's test10 wrote through a read-only item; here the broker refuses a writable descriptor…
        let write = try asEditor(world, ["granted-write", id, "XXXX"])
        #expect(write.status == 6 && write.stderr.contains("does not allow write"), "\(write.stderr)")
        // …and the read-only descriptor it does hand out refuses write(2) in the kernel.
        #expect(try asEditor(world, ["granted-raw-write", id]).out == "write failed errno \(EBADF)\n")
        #expect(try contents(world, p + "/Documents/BBB.txt") == "CCCC")
        // Nothing without starting access first.
        let unstarted = try asEditor(world, ["granted-read-unstarted", id])
        #expect(unstarted.status == 6 && unstarted.stderr.contains("not started"), "\(unstarted.stderr)")
        // The provider's directory is still invisible to the editor: only descriptors cross.
        let peek = try world.shell(editor, attempt("read", "cat '\(p)/Documents/BBB.txt'"))
        #expect(outcomes(peek.out)["read"] == "denied")
    }

    /// The descriptor a grant hands out is all the recipient gets: reopening it for writing
    /// through `/proc/self/fd` (a new open the kernel would allow, the file being the user's),
    /// truncating it by that path, or changing its mode, class, times or attributes is refused
    /// by the file system, which knows the file is outside the recipient's containers. A
    /// writable grant's descriptor writes; the rest stays refused.
    @Test(arguments: [false, true]) func aGrantsDescriptorCannotBeMadeMoreThanItIs(writable: Bool) throws {
        let (world, p, _) = try world()
        let path = p + "/Documents/BBB.txt"
        let before = try #require(POSIXFile.status(path))
        let beforeAttributes = try world.dpctl(["ls", p + "/Documents", "--passcode-file", world.passcode]).out
        let id = try grant(world, "Documents/BBB.txt", writable ? ["--write"] : ["--read"])
        let result = try asEditor(world, ["granted-exceed", id])
        #expect(result.status == 0, "\(result.stderr)")
        let lines = Dictionary(uniqueKeysWithValues: result.out.split(separator: "\n").map { line in
            let parts = line.split(separator: ":", maxSplits: 1)
            return (String(parts[0]), parts.count > 1 ? parts[1].trimmingCharacters(in: .whitespaces) : "")
        })
        for name in ["reopen-write", "reopen-append", "reopen-truncate", "truncate-path", "chmod", "class", "attribute", "times"] {
            #expect(lines[name]?.hasPrefix("errno") == true, "\(name): \(lines[name] ?? "missing") (\(result.out))")
        }
        #expect(try contents(world, path) == "CCCC")
        let after = try #require(POSIXFile.status(path))
        #expect(after.st_mode == before.st_mode && after.st_mtim.tv_sec == before.st_mtim.tv_sec)
        #expect(try world.dpctl(["ls", p + "/Documents", "--passcode-file", world.passcode]).out == beforeAttributes)
        #expect(try POSIXFile.getAttribute("user.example", path: path) == nil)
    }

    @Test func aWriteGrantWritesInPlaceAndKeepsTheClass() throws {
        let (world, p, _) = try world()
        let file = URL(fileURLWithPath: p + "/Documents/BBB.txt")
        let before = Array(try Data(contentsOf: file))
        let id = try grant(world, "Documents/BBB.txt", ["--write"])
        #expect(try asEditor(world, ["granted-write", id, "edited by the editor"]).out == "written\n")
        #expect(try contents(world, p + "/Documents/BBB.txt") == "edited by the editor")
        let after = Array(try Data(contentsOf: file))
        #expect(after[0..<88] == before[0..<88], "same header: same class, same key, edited in place")
    }

    @Test func onlyExposedItemsCanBeGranted() throws {
        let (world, p, _) = try world()
        try world.install("com.example.private")
        try FileManager.default.createSymbolicLink(atPath: p + "/Documents/link", withDestinationPath: "BBB.txt")
        #expect(link(p + "/Documents/BBB.txt", p + "/Documents/hard") == 0)
        let refusals: [(String, [String], String)] = [
            ("Documents/x", ["--from", "com.example.private"], "does not expose its Documents"),
            ("Library/Preferences", [], "only com.example.files's Documents is exposed"),
            ("Documents/Inbox", [], "never shared"),
            (".Inbox", [], "never shared"),
            ("Documents/../.Inbox", [], "plain path"),
            ("Documents/link", [], "symbolic link"),
            ("Documents/hard", [], "hard links"),
            ("Documents/missing", [], "no such file"),
            ("/etc/passwd", [], "not in com.example.files's container"),
        ]
        for (item, from, reason) in refusals {
            let args = ["grant", "--from", from.last ?? provider, "--to", editor, item]
            let result = try world.dpctl(args)
            #expect(result.status == 1 && result.stderr.contains(reason) && result.stderr.split(separator: "\n").count == 1,
                    "\(item): \(result.stderr)")
        }
        #expect(try world.dpctl(["grants"]).out.isEmpty)
    }

    @Test func revokingStopsNewAccessEvenDuringAnAccess() throws {
        let (world, _, _) = try world()
        let id = try grant(world, "Documents/BBB.txt", ["--persistent"])
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", editor, "--passcode-file", world.passcode, "--", AppWorld.testApp, "granted-hold", id]
        let input = Pipe(), output = Pipe(), errors = Pipe()
        (process.standardInput, process.standardOutput, process.standardError) = (input, output, errors)
        try process.run()
        #expect(try readLine(output.fileHandleForReading) == "started: CCCC")
        #expect(try world.dpctl(["revoke", id]).status == 0)
        input.fileHandleForWriting.write(Data("go\n".utf8))
        process.waitUntilExit()
        #expect(process.terminationStatus == 6)
        #expect(String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).contains("no grant \(id)"))
        let again = try asEditor(world, ["granted-read", id])
        #expect(again.status == 4, "a revoked grant is no longer listed: \(again.stderr)")
    }

    @Test func persistentGrantsOutliveTheRecipientsRunTransientOnesDoNot() throws {
        let (world, _, _) = try world()
        let kept = try grant(world, "Documents/BBB.txt", ["--persistent"])
        let transient = try grant(world, "Documents/BBB.txt")
        let first = try asEditor(world, ["granted"]).out
        #expect(first.contains(kept) && first.contains(transient))
        let second = try asEditor(world, ["granted"]).out
        #expect(second.contains(kept) && !second.contains(transient), "\(second)")
        #expect(try asEditor(world, ["granted-read", kept]).out == "CCCC\n")
    }

    @Test func aBookmarkResolvesAfterARestartAndSaysWhenTheItemMoved() throws {
        let (world, p, e) = try world()
        let id = try grant(world, "Documents/BBB.txt", ["--persistent"])
        #expect(try asEditor(world, ["bookmark-save", id, e + "/Documents/bookmark"]).out == "saved\n")
        // A later run (a restart for the app) resolves it, not stale.
        #expect(try asEditor(world, ["bookmark-read", e + "/Documents/bookmark"]).out == "stale: no at BBB.txt: CCCC\n")
        // The provider moves the file: the bookmark still finds it, and says it is stale.
        try FileManager.default.createDirectory(atPath: p + "/Documents/Archive", withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: p + "/Documents/BBB.txt", toPath: p + "/Documents/Archive/BBB-2026.txt")
        #expect(try asEditor(world, ["bookmark-read", e + "/Documents/bookmark"]).out == "stale: yes at BBB-2026.txt: CCCC\n")
        #expect(try asEditor(world, ["bookmark-read", e + "/Documents/bookmark"]).out == "stale: no at BBB-2026.txt: CCCC\n")
        // Bookmark data naming a grant this app never received resolves to nothing.
        let saved = try world.dpctl(["cat", e + "/Documents/bookmark", "--passcode-file", world.passcode]).stdout   // protected on disk
        try String(data: saved, encoding: .isoLatin1)!.replacingOccurrences(of: id, with: UUID().uuidString)
            .write(toFile: e + "/Documents/forged", atomically: true, encoding: .isoLatin1)
        let other = try asEditor(world, ["bookmark-read", e + "/Documents/forged"])
        #expect(other.status == 6, "\(other.out) \(other.stderr)")
        // Revoked: the bookmark no longer resolves.
        #expect(try world.dpctl(["revoke", id]).status == 0)
        let revoked = try asEditor(world, ["bookmark-read", e + "/Documents/bookmark"])
        #expect(revoked.status == 6 && revoked.stderr.contains("no grant"), "\(revoked.stderr)")
    }

    @Test func uninstallingAnAppRemovesTheGrantsItGaveAndReceived() throws {
        let (world, _, _) = try world()
        _ = try grant(world, "Documents/BBB.txt", ["--persistent"])
        #expect(try world.dpctl(["grants", "--json"]).out.contains(editor))
        #expect(try world.dpctl(["app", "uninstall", editor]).status == 0)
        #expect(!(try world.dpctl(["grants", "--json"]).out.contains(editor)))
        #expect(try FileManager.default.contentsOfDirectory(atPath: world.cli.root + "/Sharing/Grants").filter { !$0.hasPrefix(".") }.isEmpty)
        // Nor does the per-app index keep any of them.
        let index = world.cli.root + "/Sharing/Grants/.by-app"
        let entries = (FileManager.default.enumerator(atPath: index)?.allObjects as? [String] ?? []).filter { $0.contains("/") }
        #expect(entries.isEmpty, "\(entries)")
    }

    @Test func expiryIsOnTheKeybagsClock() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        let files = try await manager.install(AppIdentifier(provider), documentBrowser: true)
        let editorApp = try await manager.install(AppIdentifier(editor))
        try await device.files.write(Data("CCCC".utf8), to: files.documents.appendingPathComponent("BBB.txt"))
        let broker = SharingBroker(manager: manager)
        let grant = try broker.grant("Documents/BBB.txt", from: AppIdentifier(provider), to: AppIdentifier(editor),
                                     capabilities: [.reading], expiresAfter: 60, persistent: true)
        let fd = try broker.openGranted(grant.id, subpath: "", writable: false, for: editorApp)
        try fd.close()
        device.clock.advance(by: 61)
        #expect(throws: SharingError.grantExpired(grant.id)) { try broker.openGranted(grant.id, subpath: "", writable: false, for: editorApp) }
        #expect(throws: SharingError.grantExpired(grant.id)) { try broker.activeGrant(grant.id, for: editorApp) }
        // Another app never reaches a grant made to the editor.
        #expect(throws: SharingError.noSuchGrant(grant.id)) { try broker.activeGrant(grant.id, for: files) }
    }

    /// A grant of `Documents` itself: the recipient works inside it, but never renames or
    /// deletes it, and never reaches, makes or replaces its Inbox.
    @Test func aGrantOfDocumentsNeverReachesItsInboxOrTheDirectoryItself() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        let files = try await manager.install(AppIdentifier(provider), documentBrowser: true)
        let editorApp = try await manager.install(AppIdentifier(editor))
        try await device.files.write(Data("doc".utf8), to: files.documents.appendingPathComponent("doc.txt"))
        let inbox = files.documents.appendingPathComponent("Inbox")
        try FileManager.default.createDirectory(at: inbox, withIntermediateDirectories: true)
        try Data("received".utf8).write(to: inbox.appendingPathComponent("x.txt"))
        let broker = SharingBroker(manager: manager)
        let all: GrantCapabilities = [.reading, .writing, .renaming, .deleting, .addingSubItems, .contentEnumerating]
        let id = try broker.grant("Documents", from: AppIdentifier(provider), to: AppIdentifier(editor), capabilities: all, persistent: true).id

        #expect(throws: SharingError.self) { try broker.renameGranted(id, subpath: "", to: "Stolen", for: editorApp) }
        #expect(throws: SharingError.self) { try broker.deleteGranted(id, subpath: "", for: editorApp) }
        #expect(throws: SharingError.self) { try broker.deleteGranted(id, subpath: "Inbox/x.txt", for: editorApp) }
        #expect(throws: SharingError.self) { try broker.openGranted(id, subpath: "Inbox/x.txt", writable: false, for: editorApp) }
        #expect(throws: SharingError.self) { try broker.enumerateGranted(id, subpath: "Inbox", for: editorApp) }
        try FileManager.default.removeItem(at: inbox)
        #expect(throws: SharingError.self) { _ = try broker.createGranted(id, subpath: "Inbox", for: editorApp) }
        #expect(throws: SharingError.self) { try broker.renameGranted(id, subpath: "doc.txt", to: "Inbox", for: editorApp) }
        #expect(!FileManager.default.fileExists(atPath: inbox.path))
        try FileManager.default.createDirectory(at: inbox, withIntermediateDirectories: true)
        #expect(try broker.enumerateGranted(id, subpath: "", for: editorApp).map(\.name) == ["doc.txt"])
        // `/` or `.` followed by a combining mark is still a separator or a dot to the kernel.
        try FileManager.default.createDirectory(at: files.documents.appendingPathComponent("Sub"), withIntermediateDirectories: true)
        let sub = try broker.grant("Documents/Sub", from: AppIdentifier(provider), to: AppIdentifier(editor), capabilities: all, persistent: true).id
        for subpath in ["../\u{301}x", "../\u{301}x/y", "a/../\u{301}b"] {
            #expect(throws: SharingError.self) { _ = try broker.createGranted(sub, subpath: subpath, for: editorApp) }
            #expect(throws: SharingError.self) { try broker.openGranted(sub, subpath: subpath, writable: false, for: editorApp) }
        }
        for name in [".\u{301}hidden", "x/\u{301}y"] {
            #expect(throws: SharingError.self) { try SharingBroker.requireNewName(name) }
        }
        #expect(!FileManager.default.fileExists(atPath: files.documents.path + "/\u{301}x"))
        // Inside it, the capabilities work.
        try broker.renameGranted(id, subpath: "doc.txt", to: "renamed.txt", for: editorApp)
        #expect(FileManager.default.fileExists(atPath: files.documents.appendingPathComponent("renamed.txt").path))
        #expect(try broker.activeGrant(id, for: editorApp).path == "Documents")
    }

    /// A file system reuses a freed inode number at once (ext4 does): the granted file deleted,
    /// the next file or directory made gets its number. The grant must not move to it — found
    /// again only when the birth time and kind are the granted item's too.
    @Test func aGrantNeverFollowsItsInodeNumberToANewItem() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        let files = try await manager.install(AppIdentifier(provider), documentBrowser: true)
        let editorApp = try await manager.install(AppIdentifier(editor))
        let documents = files.documents
        try await device.files.write(Data("public draft".utf8), to: documents.appendingPathComponent("draft.txt"))
        let broker = SharingBroker(manager: manager)
        let granted = try broker.grant("Documents/draft.txt", from: AppIdentifier(provider), to: AppIdentifier(editor),
                                       capabilities: [.reading], persistent: true)
        #expect(granted.isDirectory == false)
        try FileManager.default.createDirectory(at: documents.appendingPathComponent("Archive"), withIntermediateDirectories: true)
        try FileManager.default.moveItem(at: documents.appendingPathComponent("draft.txt"), to: documents.appendingPathComponent("Archive/draft.txt"))
        guard granted.birthTime != nil else {
            // A file system without birth times: a moved item cannot be proven the same, so it
            // is not followed (the safe side).
            #expect(throws: SharingError.self) { try broker.resolveGrant(granted.id, for: editorApp) }
            return
        }
        // Moved: followed, and the bookmark is stale.
        let (moved, stale) = try broker.resolveGrant(granted.id, for: editorApp)
        #expect(stale && moved.path == "Documents/Archive/draft.txt")

        // Deleted, and its number taken by a new file, then by a new directory (the record is
        // made to say so, as ext4 would: tmpfs does not reuse numbers).
        try FileManager.default.removeItem(at: documents.appendingPathComponent("Archive/draft.txt"))
        try await device.files.write(Data("private diary".utf8), to: documents.appendingPathComponent("diary.txt"))
        try FileManager.default.createDirectory(at: documents.appendingPathComponent("private"), withIntermediateDirectories: true)
        for newcomer in ["diary.txt", "private"] {
            let st = try #require(POSIXFile.linkStatus(documents.appendingPathComponent(newcomer).path))
            var reused = Grant(id: moved.id, provider: moved.provider, providerContainer: moved.providerContainer, path: moved.path,
                               device: UInt64(st.st_dev), inode: UInt64(st.st_ino), recipient: moved.recipient, recipientContainer: moved.recipientContainer,
                               capabilities: moved.capabilities, created: moved.created, expires: nil, persistent: true)
            (reused.birthTime, reused.isDirectory) = (granted.birthTime, false)
            try GrantStore(layout: manager.layout).save(reused)
            #expect(throws: SharingError.self) { try broker.resolveGrant(granted.id, for: editorApp) }
            #expect(throws: SharingError.self) { try broker.openGranted(granted.id, subpath: "", writable: false, for: editorApp) }
            #expect(try broker.activeGrant(granted.id, for: editorApp).path == "Documents/Archive/draft.txt")
        }
    }
}

/// A granted directory: every operation needs its capability, and none leaves the directory.
@Suite(.serialized) struct GrantedDirectoryTests {
    func run(_ capabilities: [String]) throws -> (lines: [String: String], folder: String, documents: String, world: AppWorld) {
        let world = try AppWorld.make()
        let p = try world.install("com.example.files", ["--document-browser"])
        try world.install("com.example.editor")
        let unlock = ["--passcode-file", world.passcode]
        let folder = p + "/Documents/Folder"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for (name, text) in [("a.txt", "A"), ("old.txt", "old"), ("keep.txt", "keep")] {
            #expect(try world.dpctl(["write", folder + "/" + name] + unlock, input: Data(text.utf8)).status == 0)
        }
        #expect(try world.dpctl(["write", p + "/Documents/BBB.txt"] + unlock, input: Data("outside".utf8)).status == 0)
        let grant = try world.dpctl(["grant", "--from", "com.example.files", "--to", "com.example.editor", "Documents/Folder"] + capabilities)
        #expect(grant.status == 0, "\(grant.stderr)")
        let id = grant.out.trimmingCharacters(in: .whitespacesAndNewlines)
        let run = try world.testApp("com.example.editor", ["granted-ops", id], extra: unlock)
        #expect(run.status == 0, "\(run.stderr)")
        var lines: [String: String] = [:]
        for line in run.out.split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1)
            lines[String(parts[0])] = String(parts[1].dropFirst())
        }
        return (lines, folder, p + "/Documents", world)
    }

    @Test func withoutTheCapabilitiesEveryOperationIsRefused() throws {
        let (lines, folder, _, _) = try run(["--read"])
        #expect(lines["read"] == "ok A")
        for op in ["enumerate", "create", "rename", "delete"] {
            #expect(lines[op]?.hasPrefix("refused") == true && lines[op]?.contains("does not allow") == true, "\(op): \(lines[op] ?? "-")")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: folder).sorted() == ["a.txt", "keep.txt", "old.txt"])
    }

    @Test func withThemTheyWorkButNeverLeaveTheDirectory() throws {
        let (lines, folder, documents, world) = try run(["--read", "--write", "--rename", "--delete", "--add", "--enumerate"])
        #expect(lines["read"] == "ok A")
        #expect(lines["enumerate"] == "ok a.txt,keep.txt,old.txt")
        for op in ["create", "rename", "delete"] { #expect(lines[op] == "ok ", "\(op): \(lines[op] ?? "-")") }
        for op in ["escape-read", "escape-create", "escape-rename", "escape-delete", "replace-by-rename"] {
            #expect(lines[op]?.hasPrefix("refused") == true, "\(op): \(lines[op] ?? "-")")
        }
        #expect(lines["replace-by-rename"]?.contains("exists") == true, "\(lines["replace-by-rename"] ?? "-")")
        #expect(try FileManager.default.contentsOfDirectory(atPath: folder).sorted() == ["b.txt", "keep.txt", "new.txt"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: documents).sorted() == ["BBB.txt", "Folder", "Inbox"])
        let unlock = ["--passcode-file", world.passcode]
        #expect(try world.dpctl(["cat", folder + "/new.txt"] + unlock).out == "added")
        #expect(try world.dpctl(["cat", folder + "/keep.txt"] + unlock).out == "keep")
        #expect(try world.dpctl(["cat", documents + "/BBB.txt"] + unlock).out == "outside")
    }
}

/// One app gave 20,000 grants: 80 MB outside its container, and every other app's exit read
/// them all. Grants are capped per providing app and found through a per-app index.
@Suite struct GrantBoundsTests {
    @Test func grantsAreCappedPerProviderAndEachAppReadsOnlyItsOwn() async throws {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        let flooder = try await manager.install(AppIdentifier("com.example.flooder"), documentBrowser: true)
        _ = try await manager.install(AppIdentifier("com.example.sink"))
        let bystander = try await manager.install(AppIdentifier("com.example.bystander"))
        try await device.files.write(Data("x".utf8), to: flooder.documents.appendingPathComponent("x.txt"))
        let broker = SharingBroker(manager: manager)
        for _ in 0..<GrantStore.limitPerProvider {
            _ = try broker.grant("Documents/x.txt", from: flooder.identifier, to: AppIdentifier("com.example.sink"), capabilities: [.reading],
                                 persistent: true, by: .providingApp)
        }
        #expect(throws: SharingError.self) {
            try broker.grant("Documents/x.txt", from: flooder.identifier, to: AppIdentifier("com.example.sink"), capabilities: [.reading], by: .providingApp)
        }
        #expect(throws: SharingError.self) { try broker.share("Documents/x.txt", from: flooder.identifier, with: AppIdentifier("com.example.sink")) }
        // Another app's own grants are found without reading the flood.
        let store = GrantStore(layout: manager.layout)
        #expect(store.grants(involving: bystander.uuid).isEmpty)
        let index = manager.layout.grants + "/.by-app/"
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: index + bystander.uuid.uuidString)) ?? []).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: index + flooder.uuid.uuidString).count == GrantStore.limitPerProvider)
        // Ending one makes room for one.
        let first = try #require(broker.grants(involving: flooder.identifier).first)
        try broker.revoke(first.id)
        _ = try broker.grant("Documents/x.txt", from: flooder.identifier, to: AppIdentifier("com.example.sink"), capabilities: [.reading], by: .providingApp)
        // Grants recorded before the index (an older version) are indexed at first use.
        try FileManager.default.removeItem(atPath: manager.layout.grants + "/.by-app")
        #expect(store.grants(involving: flooder.uuid).count == GrantStore.limitPerProvider)
    }
}
