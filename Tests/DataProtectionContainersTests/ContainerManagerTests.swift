import DataProtection
import DataProtectionBackup
import DataProtectionContainers
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// Installing, changing and removing apps, through the library.
@Suite struct ContainerManagerTests {
    func device() async throws -> (ContainerManager, Keybag, URL) {
        let dir = temporaryDirectory()
        let keybag = try await Keybag.create(root: dir.appendingPathComponent("root").path, passcode: "123456", kdf: .insecureFastForTesting)
        return (ContainerManager(files: ProtectedFileManager(keybag: keybag)), keybag, dir)
    }

    @Test func installCreatesTheIOSLayoutWithItsClassAndMarks() async throws {
        let (manager, keybag, _) = try await device()
        let app = try await manager.install(try AppIdentifier("com.example.notes"), defaultProtection: .complete,
                                            groups: [try AppGroupIdentifier("group.com.example.notes")])
        #expect(app.url.path == keybag.root + "/Containers/Data/Application/" + app.uuid.uuidString)
        for directory in ["Documents", "Library", "Library/Application Support", "Library/Caches", "Library/Preferences", "tmp", ".Inbox"] {
            #expect(POSIXKind.isDirectory(app.url.appendingPathComponent(directory).path), "\(directory)")
        }
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: app.inbox.path) == "../.Inbox")
        #expect(try ItemInspector.protection(ofItemAt: app.url) == .directory(defaultClass: .complete))
        #expect(ProtectedFileManager(keybag: keybag).defaultProtection(forNewItemAt: app.documents.appendingPathComponent("new.txt")) == .complete)
        // Library/Caches and tmp carry the backup layer's mark; Documents does not.
        #expect(try app.caches.backupExclusion() == .excludedByOwnAttribute)
        #expect(try app.temporaryDirectory.backupExclusion() == .excludedByOwnAttribute)
        #expect(try app.documents.backupExclusion() == .included)
        // The metadata is read-only and says what the app is.
        let metadataPath = app.url.path + "/" + DataRootLayout.containerMetadataFileName
        #expect(try FileManager.default.attributesOfItem(atPath: metadataPath)[.posixPermissions] as? Int == 0o444)
        #expect(app.metadata.identifier == "com.example.notes" && app.metadata.groups == ["group.com.example.notes"])
        #expect(app.metadata.entitlements["com.apple.developer.default-data-protection"] == "NSFileProtectionComplete")
        // The group container starts at iOS's default, whatever the app's class is (as on iOS).
        let group = try manager.group(try AppGroupIdentifier("group.com.example.notes"))
        #expect(group.url.path.hasPrefix(keybag.root + "/Containers/Shared/AppGroup/"))
        #expect(!group.isProtectionSet && group.defaultProtection == .completeUntilFirstUserAuthentication)
        #expect(manager.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.notes", app: app.identifier) == group.url)
        #expect(manager.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.other", app: app.identifier) == nil)
        // The root's layout lists the containers, so an erase removes them.
        #expect(DataRootLayout(root: keybag.root).registeredEntries().contains("Containers"))
    }

    @Test func identifiersFollowTheRuleAndSayIt() throws {
        for good in ["com.example.notes", "a.b", "com.example.my-app2"] { #expect((try? AppIdentifier(good)) != nil, "\(good)") }
        for bad in ["", "notes", "com..example", ".com.example", "com.example.", "com.exa mple", "com/example.x", "com.example.é",
                    "group.com.example", String(repeating: "a", count: 64) + ".b", "com.example.\u{0}"] {
            #expect(throws: ContainerError.self, "\(bad)") { try AppIdentifier(bad) }
        }
        #expect((try? AppGroupIdentifier("group.com.example.notes")) != nil)
        #expect(throws: ContainerError.self) { try AppGroupIdentifier("com.example.notes") }
        do { _ = try AppIdentifier("bad_id") } catch { #expect("\(error)".contains("like com.example.notes")) }
    }

    @Test func reinstallingGivesANewContainerAndUninstallLeavesNothing() async throws {
        let (manager, keybag, _) = try await device()
        let notesID = try AppIdentifier("com.example.notes"), todoID = try AppIdentifier("com.example.todo")
        let group = try AppGroupIdentifier("group.com.example.shared")
        let first = try await manager.install(notesID, groups: [group])
        await #expect(throws: ContainerError.alreadyInstalled(notesID)) { try await manager.install(notesID) }
        _ = try await manager.install(todoID, groups: [group])
        let groupURL = try manager.group(group).url
        try Data("note".utf8).write(to: first.documents.appendingPathComponent("n.txt"))
        try Data("shared".utf8).write(to: groupURL.appendingPathComponent("s.txt"))

        try await manager.uninstall(notesID)
        #expect(!FileManager.default.fileExists(atPath: first.url.path))
        #expect(throws: ContainerError.unknownApp(notesID)) { try manager.app(notesID) }
        // The group stays while a member does, with what it holds.
        #expect(FileManager.default.fileExists(atPath: groupURL.appendingPathComponent("s.txt").path))

        let second = try await manager.install(notesID)
        #expect(second.uuid != first.uuid)
        try await manager.uninstall(notesID)
        try await manager.uninstall(todoID)
        #expect(!FileManager.default.fileExists(atPath: groupURL.path))
        let layout = keybag.layout
        #expect(try FileManager.default.contentsOfDirectory(atPath: layout.applications).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: layout.appGroups).isEmpty)
        await #expect(throws: ContainerError.unknownApp(notesID)) { try await manager.uninstall(notesID) }
    }

    @Test func aChangedDefaultReachesNewFilesOnlyUnlessReprotected() async throws {
        let (manager, keybag, _) = try await device()
        try await keybag.unlock(passcode: "123456")
        let files = ProtectedFileManager(keybag: keybag)
        let id = try AppIdentifier("com.example.notes")
        let app = try await manager.install(id)
        let old = app.documents.appendingPathComponent("old.txt")
        try await files.write(Data("old".utf8), to: old)
        #expect(try files.protection(ofItemAt: old) == .protected(.completeUntilFirstUserAuthentication))

        #expect(try await manager.setDefaultProtection(.complete, ofApp: id) == nil)
        let new = app.documents.appendingPathComponent("new.txt")
        try await files.write(Data("new".utf8), to: new)
        #expect(try files.protection(ofItemAt: new) == .protected(.complete))
        #expect(try files.protection(ofItemAt: old) == .protected(.completeUntilFirstUserAuthentication))   // as the seed reports
        #expect(try manager.app(id).entitledProtection == .complete)

        let report = try #require(try await manager.setDefaultProtection(.complete, ofApp: id, reprotect: true))
        #expect(report.filesChanged == 1 && report.filesUnchanged == 1 && report.failures.isEmpty, "\(report)")
        #expect(try files.protection(ofItemAt: old) == .protected(.complete))
        // Metadata and cache tags stay readable as they are.
        #expect(try manager.app(id).metadata.identifier == "com.example.notes")
        #expect(try files.protection(ofItemAt: app.caches.appendingPathComponent("CACHEDIR.TAG")) == .plain)
    }

    @Test func backupPolicyComesFromTheContainerLayer() async throws {
        let (manager, keybag, dir) = try await device()
        let app = try await manager.install(try AppIdentifier("com.example.notes"), groups: [try AppGroupIdentifier("group.com.example.g")])
        #expect(manager.backupExclusionPolicy(for: app.url).excludedPaths == ["Library/Caches", "tmp"])
        let policy = manager.backupExclusionPolicy(for: URL(fileURLWithPath: keybag.root))
        let group = try manager.group(try AppGroupIdentifier("group.com.example.g"))
        #expect(policy.excludedPaths == ["Containers/Data/Application/\(app.uuid.uuidString)/Library/Caches",
                                         "Containers/Data/Application/\(app.uuid.uuidString)/tmp",
                                         "Containers/Shared/AppGroup/\(group.uuid.uuidString)/Library/Caches"])
        // A plain directory backs up whole (but for marks).
        let photos = dir.appendingPathComponent("photos")
        try FileManager.default.createDirectory(at: photos, withIntermediateDirectories: true)
        #expect(manager.backupExclusionPolicy(for: photos) == BackupExclusionPolicy(excludedPaths: []))
    }

    @Test func eraseRemovesEveryContainer() async throws {
        let (manager, keybag, _) = try await device()
        try await keybag.unlock(passcode: "123456")
        _ = try await manager.install(try AppIdentifier("com.example.notes"))
        try await keybag.erase()
        #expect(!FileManager.default.fileExists(atPath: keybag.root + "/Containers"))
    }
}

enum POSIXKind {
    static func isDirectory(_ path: String) -> Bool {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) && isDirectory.boolValue
    }
}
