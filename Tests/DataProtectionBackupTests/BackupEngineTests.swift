import DataProtection
@testable import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

/// The seed's scenario (an app rejected until its offline data was marked "do not back up"),
/// backed up and restored onto a second device.
@Suite struct BackupEngineTests {
    /// What the container layer says an app container excludes by place (the engine knows no names).
    static let containerPolicy = BackupExclusionPolicy(excludedPaths: ["Library/Caches", "tmp"])
    struct Scenario {
        let base: URL
        let container: URL
        let source: ProtectedFileManager
        let sourceRoot: String
        let plaintexts: [String: (Data, ProtectionClass?)]
        var repository: BackupRepository { BackupRepository(url: base.appendingPathComponent("repo")) }
    }

    static func scenario() async throws -> Scenario {
        let base = temporaryDirectory()
        let root = base.appendingPathComponent("device-1").path
        let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .insecureFastForTesting, clock: ManualClock())
        let files = ProtectedFileManager(keybag: keybag)
        let container = base.appendingPathComponent("container")
        let fm = FileManager.default
        for dir in ["Documents", "Library/Caches", "Library/Preferences", "tmp"] {
            try fm.createDirectory(at: container.appendingPathComponent(dir), withIntermediateDirectories: true)
        }
        // Marked right after it is created, then a PDF saved into it and marked too.
        let offline = container.appendingPathComponent("Documents/offline")
        try fm.createDirectory(at: offline, withIntermediateDirectories: false)
        try BackupExclusionAttribute.set(excluded: true, for: offline)
        try await files.write(randomData(50_000), to: offline.appendingPathComponent("guide.pdf"), protection: .noProtection)
        try BackupExclusionAttribute.set(excluded: true, for: offline.appendingPathComponent("guide.pdf"))
        try Data("cache".utf8).write(to: container.appendingPathComponent("Library/Caches/thumbs.db"))
        try Data("scratch".utf8).write(to: container.appendingPathComponent("tmp/upload.part"))

        var plaintexts: [String: (Data, ProtectionClass?)] = [:]
        let documents: [(String, ProtectionClass?)] = [
            ("Documents/notes.txt", .complete), ("Documents/inbox.mail", .completeUnlessOpen),
            ("Documents/db.sqlite", .completeUntilFirstUserAuthentication), ("Library/Preferences/app.plist", .noProtection),
            ("Documents/readme.txt", nil),
        ]
        for (name, cls) in documents {
            let data = randomData(Int.random(in: 0...200_000))
            let url = container.appendingPathComponent(name)
            if let cls { try await files.write(data, to: url, protection: cls) } else { try data.write(to: url) }
            plaintexts[name] = (data, cls)
        }
        try FileManager.default.createSymbolicLink(atPath: container.appendingPathComponent("Documents/latest").path, withDestinationPath: "notes.txt")
        try await files.write(Data("device token".utf8), to: container.appendingPathComponent("Library/Preferences/token"),
                              protection: .completeUntilFirstUserAuthentication, thisDeviceOnly: true)
        try await keybag.setBackupPassword("backup password")
        return Scenario(base: base, container: container, source: files, sourceRoot: root, plaintexts: plaintexts)
    }

    @Test func theSeedScenarioBacksUpAndRestoresOnAnotherDevice() async throws {
        let s = try await Self.scenario()
        var log: [String] = []
        // The source device is locked (a fresh start): the backup decrypts nothing, so it works.
        let summary = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run { log.append($0) }
        #expect(log.contains("Not backed up (attribute): \(s.container.path)/Documents/offline"))
        #expect(log.contains("Not backed up (blacklist): \(s.container.path)/Library/Caches"))
        #expect(log.contains("Not backed up (blacklist): \(s.container.path)/tmp"))
        #expect(summary.files == 6)
        #expect(summary.protectedFiles == 5)
        #expect(summary.thisDeviceOnlyFiles == 1)
        #expect(log.contains("Backed up for this device only (not restorable on another device): \(s.container.path)/Library/Preferences/token"))
        #expect(summary.hasBackupKeybag)

        let backup = try #require(s.repository.finishedBackups().last)
        // Protected files were stored as ciphertext: no plaintext in the repository.
        let objectsDir = s.repository.url.appendingPathComponent("objects")
        let objectNames = (FileManager.default.enumerator(atPath: objectsDir.path)?.allObjects as? [String] ?? []).filter { $0.count > 3 }
        let stored = try objectNames.map { try Data(contentsOf: objectsDir.appendingPathComponent($0)) }
        #expect(stored.count == 6)
        // Nothing readable in the repository: protected files as they were, plain ones sealed.
        for (name, (data, _)) in s.plaintexts where data.count > 32 {
            for bytes in stored { #expect(bytes.range(of: data.prefix(32)) == nil, "\(name) readable in the repository") }
        }
        // Not even the names: the manifest is sealed too.
        let everything = FileManager.default.enumerator(atPath: s.repository.url.path)?.allObjects as? [String] ?? []
        for name in everything where !FileManager.default.isDirectory(s.repository.url.appendingPathComponent(name)) {
            let bytes = try Data(contentsOf: s.repository.url.appendingPathComponent(name))
            #expect(bytes.range(of: Data("notes.txt".utf8)) == nil, "a file name is readable in \(name)")
        }

        // A second device: other device secret, other keybag.
        let keybag2 = try await Keybag.create(root: s.base.appendingPathComponent("device-2").path, passcode: "567890",
                                              kdf: .insecureFastForTesting, clock: ManualClock())
        let files2 = ProtectedFileManager(keybag: keybag2)
        let restored = s.base.appendingPathComponent("restored")
        await #expect(throws: BackupError.passwordNeeded(files: 1)) {
            _ = try await RestoreEngine(backup: backup).restore(to: s.base.appendingPathComponent("r0"), files: files2, password: nil)
        }
        await #expect(throws: BackupError.wrongBackupPassword) {
            _ = try await RestoreEngine(backup: backup).restore(to: s.base.appendingPathComponent("r1"), files: files2, password: "nope")
        }
        var restoreLog: [String] = []
        let result = try await RestoreEngine(backup: backup).restore(to: restored, files: files2, password: "backup password") { restoreLog.append($0) }
        #expect(result.adoptedFiles == 4)
        #expect(result.skippedThisDeviceOnly == 1)
        #expect(restoreLog == ["Not restored (this device only): \(restored.path)/Library/Preferences/token"])
        #expect(!FileManager.default.fileExists(atPath: restored.appendingPathComponent("Library/Preferences/token").path))
        for (name, (data, cls)) in s.plaintexts {
            let url = restored.appendingPathComponent(name)
            #expect(try await files2.contents(of: url) == data, "\(name) byte for byte")
            #expect(try files2.protection(ofItemAt: url) == (cls.map { .protected($0) } ?? .plain), "\(name) class for class")
        }
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: restored.appendingPathComponent("Documents/latest").path) == "notes.txt")
        #expect(!FileManager.default.fileExists(atPath: restored.appendingPathComponent("Documents/offline").path))
        #expect(!FileManager.default.fileExists(atPath: restored.appendingPathComponent("Library/Caches").path))
        #expect(!FileManager.default.fileExists(atPath: restored.appendingPathComponent("tmp").path))
    }

    @Test func anUnchangedTreeCopiesNothingAndEveryBackupRestoresOnItsOwn() async throws {
        let s = try await Self.scenario()
        let first = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        #expect(first.filesCopied == 6)
        let second = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        #expect(second.filesCopied == 0)
        #expect(second.bytesCopied == 0)
        let backups = s.repository.finishedBackups()
        #expect(backups.count == 2)
        try FileManager.default.removeItem(at: backups[0])
        let restored = s.base.appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: backups[1]).restore(to: restored, files: s.source, password: nil)
        #expect(try await s.source.contents(of: restored.appendingPathComponent("Documents/notes.txt")) == s.plaintexts["Documents/notes.txt"]!.0)
        // On the device that made it, a "this device only" file restores too.
        #expect(try await s.source.contents(of: restored.appendingPathComponent("Library/Preferences/token")) == Data("device token".utf8))
    }

    @Test func verifyFindsMissingAndAlteredObjects() async throws {
        let s = try await Self.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        let backup = try #require(s.repository.finishedBackups().last)
        #expect(try await RestoreEngine(backup: backup).verify(files: s.source, password: nil) > 0)
        let objects = s.repository.url.appendingPathComponent("objects")
        var names = (FileManager.default.enumerator(atPath: objects.path)?.allObjects as? [String] ?? []).filter { $0.count > 3 }.sorted()
        let altered = objects.appendingPathComponent(names.removeFirst())
        var bytes = try Data(contentsOf: altered)
        bytes[bytes.count / 2] ^= 1
        try bytes.write(to: altered)
        try FileManager.default.removeItem(at: objects.appendingPathComponent(names.removeFirst()))
        await #expect { _ = try await RestoreEngine(backup: backup).verify(files: s.source, password: nil) } throws: { error in
            guard case BackupError.verificationFailed(let problems) = error else { return false }
            return problems.count == 2 && problems.contains { $0.contains("altered") } && problems.contains { $0.contains("missing") }
        }
        // An all-or-nothing restore of the damaged backup fails and leaves no half-restored tree.
        let destination = s.base.appendingPathComponent("restored")
        await #expect(throws: BackupError.self) {
            _ = try await RestoreEngine(backup: backup).restore(to: destination, files: s.source, password: nil, options: RestoreOptions(allOrNothing: true))
        }
        #expect(!FileManager.default.fileExists(atPath: destination.path))
        #expect(try FileManager.default.contentsOfDirectory(atPath: s.base.path).filter { $0.contains("dp-restore") }.isEmpty)
    }

    /// restic's and borg's behaviour: one altered object and one missing one cost their own
    /// files only. Every other file is restored byte-exact, the two are named (and absent), and
    /// on another device too (rewrapped with the backup password).
    @Test func aRestorePastDamageRestoresEveryIntactFileAndNamesTheDamagedOnes() async throws {
        let s = try await Self.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        let backup = try #require(s.repository.finishedBackups().last)
        let entries = try await RestoreEngine(backup: backup).manifest(files: s.source, password: nil).entries()
        func object(_ path: String) throws -> URL {
            let sha = try #require(entries.first { $0.path == path }?.sha256)
            return s.repository.url.appendingPathComponent("objects/\(sha.prefix(2))/\(sha)")
        }
        var bytes = try Data(contentsOf: try object("Documents/notes.txt"))
        bytes[bytes.count - 20] ^= 1   // inside the last segment: the header still reads
        try bytes.write(to: try object("Documents/notes.txt"))
        try FileManager.default.removeItem(at: try object("Documents/readme.txt"))
        let other = try await Keybag.create(root: s.base.appendingPathComponent("device-2").path, passcode: nil, kdf: .insecureFastForTesting)
        for (files, password) in [(s.source, nil), (ProtectedFileManager(keybag: other), "backup password")] as [(ProtectedFileManager, String?)] {
            let destination = s.base.appendingPathComponent("restored-\(password == nil ? "here" : "elsewhere")")
            var logged: [String] = []
            let summary = try await RestoreEngine(backup: backup).restore(to: destination, files: files, password: password, log: { logged.append($0) })
            #expect(summary.damagedFiles.map(\.path).sorted() == ["Documents/notes.txt", "Documents/readme.txt"])
            #expect(summary.damagedFiles.contains { $0.path == "Documents/notes.txt" && $0.issue.contains("altered") })
            #expect(summary.damagedFiles.contains { $0.path == "Documents/readme.txt" && $0.issue.contains("missing") })
            #expect(logged.filter { $0.hasPrefix("Not restored (damaged") }.count == 2)
            for name in ["Documents/notes.txt", "Documents/readme.txt"] {
                #expect(!FileManager.default.fileExists(atPath: destination.appendingPathComponent(name).path))
            }
            for (name, (data, _)) in s.plaintexts where !["Documents/notes.txt", "Documents/readme.txt"].contains(name) {
                #expect(try await files.contents(of: destination.appendingPathComponent(name)) == data, "\(name)")
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: s.base.path).filter { $0.contains("dp-restore") }.isEmpty)
        }
    }

    /// A subset: a file and a directory with everything below it, with the directories leading
    /// to them and nothing else; a path the backup does not hold restores nothing.
    @Test func aRestoreOfSomePathsTakesThoseAndTheDirectoriesToThem() async throws {
        let s = try await Self.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        let backup = try #require(s.repository.finishedBackups().last)
        let destination = s.base.appendingPathComponent("subset")
        let summary = try await RestoreEngine(backup: backup).restore(to: destination, files: s.source, password: nil,
                                                                      options: RestoreOptions(include: ["/Documents/notes.txt", "Library/Preferences/"]))
        #expect(summary.files == 3 && summary.damagedFiles.isEmpty)
        let restored = (FileManager.default.enumerator(atPath: destination.path)?.allObjects as? [String] ?? []).sorted()
        #expect(restored == ["Documents", "Documents/notes.txt", "Library", "Library/Preferences", "Library/Preferences/app.plist",
                             "Library/Preferences/token"])
        #expect(try await s.source.contents(of: destination.appendingPathComponent("Documents/notes.txt")) == s.plaintexts["Documents/notes.txt"]!.0)
        let nowhere = s.base.appendingPathComponent("nowhere")
        await #expect(throws: BackupError.nothingIncluded(path: "Documents/nope")) {
            _ = try await RestoreEngine(backup: backup).restore(to: nowhere, files: s.source, password: nil, options: RestoreOptions(include: ["Documents/nope"]))
        }
        await #expect(throws: BackupError.nothingIncluded(path: "Docu")) {   // a prefix of a name is not that name
            _ = try await RestoreEngine(backup: backup).restore(to: nowhere, files: s.source, password: nil, options: RestoreOptions(include: ["Docu"]))
        }
        #expect(!FileManager.default.fileExists(atPath: nowhere.path))
    }

    @Test func anIncompleteBackupIsRefusedAndEarlierOnesStayIntact() async throws {
        let s = try await Self.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source, policy: Self.containerPolicy).run()
        // What a backup killed half-way leaves: a directory still named .incomplete.
        let killed = s.repository.url.appendingPathComponent("backups/20990101T000000Z-dead.incomplete")
        try FileManager.default.createDirectory(at: killed, withIntermediateDirectories: true)
        await #expect(throws: BackupError.incompleteBackup(path: killed.path)) {
            _ = try await RestoreEngine(backup: killed).restore(to: s.base.appendingPathComponent("x"), files: s.source, password: nil)
        }
        #expect(s.repository.finishedBackups().count == 1)
        #expect(try await RestoreEngine(backup: s.repository.finishedBackups()[0]).verify(files: s.source, password: nil) > 0)
    }

    @Test(arguments: ["../escape.txt", "/etc/evil", "a/../../b", "./x"])
    func restoreRefusesNamesOutsideTheDestination(name: String) async throws {
        let backup = try await Self.handcraftedBackup([ManifestEntry(path: name, kind: .file, mode: 0o644, mtime: 0, size: 0,
                                                                     sha256: String(repeating: "0", count: 64), sealed: true)])
        await #expect(throws: BackupError.unsafePath(name)) {
            _ = try await RestoreEngine(backup: backup).restore(to: temporaryDirectory().appendingPathComponent("d"), files: Self.bystander(), password: nil)
        }
    }

    /// A link leading out of the tree (`../../outside`, `/etc`) is left out and logged; the rest
    /// of the backup is restored.
    @Test func restoreLeavesOutLinksThatLeadOutOfTheTree() async throws {
        for target in ["../../outside", "/etc"] {
            let backup = try await Self.handcraftedBackup([
                ManifestEntry(path: "link", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: target),
                ManifestEntry(path: "inside", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "dir"),
                ManifestEntry(path: "dir", kind: .directory, mode: 0o755, mtime: 0, size: 0),
            ])
            let destination = temporaryDirectory().appendingPathComponent("d")
            var logged: [String] = []
            let summary = try await RestoreEngine(backup: backup).restore(to: destination, files: Self.bystander(), password: nil, log: { logged.append($0) })
            #expect(summary.skippedOutwardLinks == 1 && summary.symlinks == 1 && summary.directories == 1)
            #expect(POSIXFile.linkStatus(destination.appendingPathComponent("link").path) == nil)
            #expect(try FileManager.default.destinationOfSymbolicLink(atPath: destination.appendingPathComponent("inside").path) == "dir")
            #expect(logged.count == 1 && logged[0].contains("link -> \(target)"), "\(logged)")
        }
    }

    /// Names are split and compared by their bytes: `/` followed by a combining mark is still a
    /// separator (`String.split` saw `..\u{301}q` and let a link climb out), and NFC `é` and NFD
    /// `e\u{301}` are two files (a duplicate check keyed by `String` refused the whole backup).
    @Test func namesAreSplitAndComparedByTheirBytes() async throws {
        var climb = ""
        for _ in 0..<12 { climb += "../\u{301}q/" }
        climb += String(repeating: "../", count: 13) + "etc/hostname"
        let backup = try await Self.handcraftedBackup([
            ManifestEntry(path: "a", kind: .directory, mode: 0o755, mtime: 0, size: 0),
            ManifestEntry(path: "\u{301}q", kind: .directory, mode: 0o755, mtime: 0, size: 0),
            ManifestEntry(path: "a/evil", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: climb),
            ManifestEntry(path: "\u{E9}", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "a"),
            ManifestEntry(path: "e\u{301}", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "/etc"),
        ])
        let destination = temporaryDirectory().appendingPathComponent("d")
        let summary = try await RestoreEngine(backup: backup).restore(to: destination, files: Self.bystander(), password: nil)
        #expect(summary.skippedOutwardLinks == 2 && summary.symlinks == 1, "\(summary)")
        #expect(POSIXFile.linkStatus(destination.path + "/a/evil") == nil)
        #expect(POSIXFile.linkStatus(destination.path + "/\u{E9}") != nil && POSIXFile.linkStatus(destination.path + "/e\u{301}") == nil)
        for name in ["../\u{301}x", "a/..\u{0}", "/\u{301}etc"] where !name.contains("\u{0}") {
            #expect(throws: BackupError.self) { try RestoreEngine.checkName(name) }
        }
        #expect(throws: BackupError.self) { try RestoreEngine.checkName("a/../\u{301}b") }
        try RestoreEngine.checkName("..\u{301}x")   // one name: dots and a mark, not `..`
    }

    /// A device that restores handcrafted backups (the one that sealed their manifests).
    static let bystanderDevice = Task { () -> ProtectedFileManager in
        ProtectedFileManager(keybag: try! await Keybag.create(root: temporaryDirectory().appendingPathComponent("root").path, passcode: nil,
                                                              kdf: .insecureFastForTesting))
    }
    static func bystander() async throws -> ProtectedFileManager { await bystanderDevice.value }

    /// A backup with a manifest written by hand — and authenticated with the device's own key,
    /// as an insider holding the device could: restore's own checks must still hold.
    static func handcraftedBackup(_ entries: [ManifestEntry], objects: [String: [UInt8]] = [:]) async throws -> URL {
        let files = try await bystander()
        let repository = BackupRepository(url: temporaryDirectory().appendingPathComponent("repo"))
        let backup = repository.url.appendingPathComponent("backups/evil")
        try FileManager.default.createDirectory(at: backup, withIntermediateDirectories: true)
        try repository.prepare()
        for (sha, bytes) in objects {
            try FileManager.default.createDirectory(at: repository.objectURL(sha).deletingLastPathComponent(), withIntermediateDirectories: true)
            try Data(bytes).write(to: repository.objectURL(sha))
        }
        let manifest = try BackupManifest.create(at: nil)
        try manifest.insert(entries, meta: ["id": "evil"])
        let manifestURL = backup.appendingPathComponent(BackupManifest.fileName)
        try await files.write(try manifest.serialized(), to: manifestURL, protection: .completeUnlessOpen)
        let list = Array(Set(entries.compactMap(\.sha256)).sorted().map { $0 + "\n" }.joined().utf8)
        try Data(list).write(to: backup.appendingPathComponent(BackupRepository.objectListName))
        let contents = BackupAuthentication.Contents(backupID: "evil", manifest: [UInt8](try Data(contentsOf: manifestURL)),
                                                     objectList: list, backupKeybag: nil)
        let record = BackupAuthentication(keybagID: files.keybag.id, contents: contents, key: try await files.keybag.backupAuthenticationKey())
        try Data(record.encoded).write(to: backup.appendingPathComponent(BackupAuthentication.fileName))
        return backup
    }
}

extension FileManager {
    func isDirectory(_ url: URL) -> Bool {
        var flag: ObjCBool = false
        return fileExists(atPath: url.path, isDirectory: &flag) && flag.boolValue
    }
}
