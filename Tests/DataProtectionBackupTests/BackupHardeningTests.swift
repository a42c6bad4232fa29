import Crypto
import DataProtection
@testable import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing

/// The attacks of the hardening review, kept as tests: forged repositories, crafted manifests,
/// link chains, set-id bits, leftovers of killed runs, names that are not UTF-8.
@Suite struct BackupHardeningTests {
    static var python: String { oraclePython }
    static var packageRoot: URL { DataProtectionTestSupport.packageRoot }

    /// Runs the forger (`Tests/oracle/backup_forger.py`, written from docs/FORMAT.md alone).
    static func forge(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [python, packageRoot.appendingPathComponent("Tests/oracle/backup_forger.py").path] + arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let output = out.fileHandleForReading.readDataToEndOfFile()
        let errors = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "the forger failed: \(String(decoding: errors, as: UTF8.self))")
        return String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A repository written to by someone with no key — only the backup keybag's public half —
    /// gets nothing restored or verified: a planted setuid `run-me.sh`, with no authentication
    /// record, a random one, or a genuine one replayed from another backup.
    @Test func aForgedBackupIsRefusedByVerifyAndRestore() async throws {
        let s = try await BackupEngineTests.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let genuine = try #require(s.repository.finishedBackups().last)
        let keybag = genuine.appendingPathComponent(BackupKeybag.fileName).path
        for (index, authentication) in ["none", "random", "copy-from:\(genuine.path)"].enumerated() {
            let forged = URL(fileURLWithPath: try Self.forge([
                "forge", s.repository.url.path, "--backup-keybag", keybag, "--id", "20990101T00000\(index)Z-f0f0f0f0",
                "--file", "run-me.sh", "#!/bin/sh\necho owned\n", "--mode", "0o4755", "--authentication", authentication,
            ]))
            #expect(FileManager.default.fileExists(atPath: forged.appendingPathComponent(BackupManifest.fileName).path))
            // On the device itself, and on another device with the right backup password.
            let other = ProtectedFileManager(keybag: try await Keybag.create(root: temporaryDirectory().path, passcode: nil, kdf: .insecureFastForTesting))
            for (files, password) in [(s.source, nil), (other, "backup password")] as [(ProtectedFileManager, String?)] {
                await #expect(Comment(rawValue: authentication)) {
                    _ = try await RestoreEngine(backup: forged).verify(files: files, password: password)
                } throws: { error in
                    guard case BackupError.notAuthentic = error else { return false }
                    return true
                }
                let destination = temporaryDirectory().appendingPathComponent("restored")
                await #expect(Comment(rawValue: authentication)) {
                    _ = try await RestoreEngine(backup: forged).restore(to: destination, files: files, password: password)
                } throws: { error in
                    guard case BackupError.notAuthentic = error else { return false }
                    return true
                }
                #expect(!FileManager.default.fileExists(atPath: destination.appendingPathComponent("run-me.sh").path))
            }
        }
        // The genuine backup still verifies, here and elsewhere with the password.
        let elsewhere = ProtectedFileManager(keybag: try await Keybag.create(root: temporaryDirectory().path, passcode: nil, kdf: .insecureFastForTesting))
        #expect(try await RestoreEngine(backup: genuine).verify(files: s.source, password: nil) > 0)
        #expect(try await RestoreEngine(backup: genuine).verify(files: elsewhere, password: "backup password") > 0)
        await #expect(throws: BackupError.wrongBackupPassword) {
            _ = try await RestoreEngine(backup: genuine).verify(files: elsewhere, password: "wrong")
        }
    }

    /// Each file a backup's authentication covers, changed by one byte, is caught.
    @Test func changingAnyAuthenticatedFileIsCaught() async throws {
        let s = try await BackupEngineTests.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let backup = try #require(s.repository.finishedBackups().last)
        for name in [BackupManifest.fileName, BackupRepository.objectListName, BackupKeybag.fileName, BackupAuthentication.fileName] {
            let url = backup.appendingPathComponent(name)
            let original = try Data(contentsOf: url)
            var bytes = original
            bytes[bytes.count - 1] ^= 1
            try bytes.write(to: url)
            await #expect(Comment(rawValue: name)) { _ = try await RestoreEngine(backup: backup).verify(files: s.source, password: nil) } throws: { error in
                if case BackupError.notAuthentic = error { return true }
                return false
            }
            try original.write(to: url)
        }
        // A genuine backup renamed is another backup: its ID is covered too.
        let renamed = backup.deletingLastPathComponent().appendingPathComponent("20990101T000000Z-00000000")
        try FileManager.default.moveItem(at: backup, to: renamed)
        await #expect(throws: BackupError.self) { _ = try await RestoreEngine(backup: renamed).verify(files: s.source, password: nil) }
    }

    /// Set-id and sticky bits never come back; other bits are clamped by the umask unless asked.
    @Test func restoreDropsSetIDBitsAndHonoursTheUmask() async throws {
        let s = try await BackupEngineTests.scenario()
        let tool = s.container.appendingPathComponent("Documents/tool")
        try Data("#!/bin/sh\n".utf8).write(to: tool)
        chmod(tool.path, 0o6777)
        let shared = s.container.appendingPathComponent("Documents/shared")
        try FileManager.default.createDirectory(at: shared, withIntermediateDirectories: false)
        chmod(shared.path, 0o1777)
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let backup = try #require(s.repository.finishedBackups().last)
        let mask = POSIXFile.currentUmask()
        for keep in [false, true] {
            let destination = temporaryDirectory().appendingPathComponent("restored")
            _ = try await RestoreEngine(backup: backup).restore(to: destination, files: s.source, password: nil, options: RestoreOptions(keepModes: keep))
            var st = stat()
            stat(destination.appendingPathComponent("Documents/tool").path, &st)
            #expect(st.st_mode & 0o7777 == (keep ? 0o777 : 0o777 & ~mask), "keepModes \(keep)")
            stat(destination.appendingPathComponent("Documents/shared").path, &st)
            #expect(st.st_mode & 0o7777 == (keep ? 0o777 : 0o777 & ~mask), "keepModes \(keep)")
        }
    }

    /// Crafted manifest values (authentic, as an insider could make them) are errors, never a
    /// trap, and leave no staging directory — and no plaintext — behind.
    @Test func craftedManifestValuesAreRefusedAndLeaveNothing() async throws {
        let sha = String(repeating: "a", count: 64)
        let cases: [(String, ManifestEntry)] = [
            ("mtime 1e300", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 1e300, size: 1, sha256: sha, sealed: true)),
            ("mtime -1e300", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: -1e300, size: 1, sha256: sha, sealed: true)),
            ("mode -1", ManifestEntry(path: "f", kind: .file, mode: -1, mtime: 0, size: 1, sha256: sha, sealed: true)),
            ("mode 2^40", ManifestEntry(path: "f", kind: .file, mode: 1 << 40, mtime: 0, size: 1, sha256: sha, sealed: true)),
            ("class 300", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: 1, protectionClass: 300, sha256: sha)),
            ("class -1", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: 1, protectionClass: -1, sha256: sha)),
            ("size -1", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: -1, sha256: sha, sealed: true)),
            ("unsealed plain file", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: 1, sha256: sha, sealed: false)),
            ("name with NUL", ManifestEntry(path: "a\0b", kind: .file, mode: 0o644, mtime: 0, size: 1, sha256: sha, sealed: true)),
            ("bad object name", ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: 1, sha256: "../../x", sealed: true)),
        ]
        for (what, entry) in cases {
            // A first, valid file whose plaintext would be restored before the crafted one.
            let object = try await Self.sealedObject("secret")
            let secret = ManifestEntry(path: "0-secret", kind: .file, mode: 0o644, mtime: 0, size: 6, sha256: object.sha, sealed: true)
            let backup = try await BackupEngineTests.handcraftedBackup([secret, entry], objects: [object.sha: object.bytes])
            let parent = temporaryDirectory()
            await #expect(throws: BackupError.self, "\(what)") {
                _ = try await RestoreEngine(backup: backup).restore(to: parent.appendingPathComponent("d"), files: BackupEngineTests.bystander(), password: nil)
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: parent.path).isEmpty, "\(what): something was left behind")
        }
    }

    /// A wrong size is caught while restoring, and the staging directory never shows in the error.
    @Test func aSizeThatDoesNotMatchIsRefusedWithoutNamingTheStagingDirectory() async throws {
        let object = try await Self.sealedObject("twelve bytes")
        let lying = ManifestEntry(path: "f", kind: .file, mode: 0o644, mtime: 0, size: 3, sha256: object.sha, sealed: true)
        let backup = try await BackupEngineTests.handcraftedBackup([lying], objects: [object.sha: object.bytes])
        let destination = temporaryDirectory().appendingPathComponent("d")
        await #expect {
            _ = try await RestoreEngine(backup: backup).restore(to: destination, files: BackupEngineTests.bystander(), password: nil,
                                                               options: RestoreOptions(allOrNothing: true))
        } throws: { error in
            let text = String(describing: error)
            return text.contains("f: its stored content is not the size the backup recorded") && !text.contains("dp-restore")
        }
        #expect(!FileManager.default.fileExists(atPath: destination.path))
        // By default the file is left out and named; the rest (nothing here) restored.
        let summary = try await RestoreEngine(backup: backup).restore(to: destination, files: BackupEngineTests.bystander(), password: nil)
        #expect(summary.damagedFiles == [.init(path: "f", issue: "its stored content is not the size the backup recorded")])
        #expect(try FileManager.default.contentsOfDirectory(atPath: destination.path).isEmpty)
    }

    /// `a/b/c/d/e/f/hop -> ../../../../../..` then `evil -> a/b/c/d/e/f/hop/../../../../../../../etc`:
    /// each link alone climbs no higher than the tree, together they reach `/etc`.
    @Test func aChainOfLinksThatLeavesTheTreeIsLeftOut() async throws {
        var entries = ["a", "a/b", "a/b/c", "a/b/c/d", "a/b/c/d/e", "a/b/c/d/e/f"].map {
            ManifestEntry(path: $0, kind: .directory, mode: 0o755, mtime: 0, size: 0)
        }
        entries.append(ManifestEntry(path: "a/b/c/d/e/f/hop", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "../../../../../.."))
        let benign = entries + [ManifestEntry(path: "ok", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "a/b/c/d/e/f/hop/a/b")]
        let destination = temporaryDirectory().appendingPathComponent("d")
        _ = try await RestoreEngine(backup: try await BackupEngineTests.handcraftedBackup(benign)).restore(to: destination, files: BackupEngineTests.bystander(), password: nil)
        #expect(FileManager.default.fileExists(atPath: destination.appendingPathComponent("ok/c").path))

        entries.append(ManifestEntry(path: "evil", kind: .symlink, mode: 0o777, mtime: 0, size: 0, linkTarget: "a/b/c/d/e/f/hop/../../../../../../../etc"))
        #expect(!RestoreEngine.resolvesInside(link: "evil", target: "a/b/c/d/e/f/hop/../../../../../../../etc",
                                              links: ["a/b/c/d/e/f/hop": "../../../../../.."]))
        // The chain is judged as the kernel would resolve it: `evil` is left out, the rest restored.
        let evil = try await BackupEngineTests.handcraftedBackup(entries)
        let restored = temporaryDirectory().appendingPathComponent("d")
        let summary = try await RestoreEngine(backup: evil).restore(to: restored, files: BackupEngineTests.bystander(), password: nil)
        #expect(summary.skippedOutwardLinks == 1 && POSIXFile.linkStatus(restored.appendingPathComponent("evil").path) == nil)
        #expect(POSIXFile.linkStatus(restored.appendingPathComponent("a/b/c/d/e/f/hop").path) != nil)
        // Loops end at the kernel's 40 hops.
        #expect(!RestoreEngine.resolvesInside(link: "x", target: "y/z", links: ["x": "y", "y": "x"]))
    }

    /// What a killed backup left in `objects/` is removed by the next one.
    @Test func leftoversOfAKilledBackupAreCleanedByTheNextOne() async throws {
        let s = try await BackupEngineTests.scenario()
        let objects = s.repository.url.appendingPathComponent("objects")
        try FileManager.default.createDirectory(at: objects, withIntermediateDirectories: true)
        for name in [".tmp-1234", ".sealed-5678"] { try Data("partial".utf8).write(to: objects.appendingPathComponent(name)) }
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        #expect(try FileManager.default.contentsOfDirectory(atPath: objects.path).allSatisfy { !$0.hasPrefix(".") })
    }

    /// Names that are not UTF-8 are backed up and restored byte for byte, none lost or merged.
    @Test func namesThatAreNotUTF8SurviveABackupAndARestore() async throws {
        let s = try await BackupEngineTests.scenario()
        let names: [[UInt8]] = [Array("lat".utf8) + [0xE9], [0x79, 0xFE], [0x79, 0xFD], [0x64, 0xFF, 0x2E, 0x74]]
        for (index, name) in names.enumerated() {
            let path = s.container.path + "/Documents/" + LosslessPath.string(fromBytes: name)
            let fd = try LosslessPath.withCString(path) { open($0, O_CREAT | O_WRONLY | O_EXCL, 0o644) }
            try #require(fd >= 0)
            _ = "content \(index)".withCString { write(fd, $0, strlen($0)) }
            close(fd)
        }
        let summary = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let destination = temporaryDirectory().appendingPathComponent("restored")
        _ = try await RestoreEngine(backup: try #require(s.repository.finishedBackups().last)).restore(to: destination, files: s.source, password: nil)
        let restored = try POSIXFile.directoryEntries(destination.path + "/Documents").map(LosslessPath.bytes(of:))
        for (index, name) in names.enumerated() {
            #expect(restored.contains(name), "\(name) missing")
            let bytes = try POSIXFile.readAll(destination.path + "/Documents/" + LosslessPath.string(fromBytes: name))
            #expect(bytes == Array("content \(index)".utf8))
        }
        #expect(summary.files >= names.count)
    }

    /// The FORMAT.md §5.1 vector (also recomputed with Python's hashlib and pyca/cryptography).
    @Test func theAuthenticationRecordMatchesTheDocumentedVector() throws {
        let classD = SymmetricKey(data: Array(0x80...0x9F) as [UInt8])
        let keybagID = UUID(uuidString: "00112233-4455-6677-8899-AABBCCDDEEFF")!
        let key = BackupAuthenticationKey.derive(classD: classD, keybagID: keybagID)
        let keyHex = "d2632a6c54aaf093a314844270dbf7179a1266d71d355e5c993287831e4ff0eb"
        let recordHex = "89445042410d0a1a0001003c00112233445566778899aabbccddeefff0445259b62c86f1c99716ef1524280b303e79aa9e95e35bbaf2c8bad08d9010"
        #expect(key.withUnsafeBytes { Array($0) }.hex == keyHex)
        let contents = BackupAuthentication.Contents(backupID: "20261123T000000Z-00000000", manifest: Array("manifest".utf8),
                                                     objectList: [], backupKeybag: nil)
        #expect(BackupAuthentication(keybagID: keybagID, contents: contents, key: key).encoded.hex == recordHex)
        let spec = try String(contentsOf: Self.packageRoot.appendingPathComponent("docs/FORMAT.md"), encoding: .utf8)
        #expect(spec.contains(keyHex) && spec.contains(recordHex))
    }

    /// Mutated manifest databases (as a device holding the keys could make them): each is
    /// refused or read as validated entries — never a trap.
    @Test func mutatedManifestsAreRefusedOrValidated() throws {
        let manifest = try BackupManifest.create(at: nil)
        let entries = (0..<40).map { i in
            ManifestEntry(path: "d/file-\(i)", kind: .file, mode: 0o644, mtime: Double(i), size: Int64(i),
                          sha256: String(repeating: "ab", count: 32), sealed: true)
        } + [ManifestEntry(path: "d", kind: .directory, mode: 0o755, mtime: 0, size: 0)]
        try manifest.insert(entries, meta: ["id": "x"])
        let original = try manifest.serialized()
        var generator = SystemRandomNumberGenerator()
        var refused = 0
        for _ in 0..<1_000 {
            var bytes = original
            for _ in 0..<Int.random(in: 1...4, using: &generator) {
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
            }
            do {
                for entry in try BackupManifest.deserialize(bytes, path: "m").entries() { try RestoreEngine.checkName(entry.path) }
            } catch {
                refused += 1
            }
        }
        #expect(refused > 0)
    }

    /// A hostile repository's files: links to /dev/zero, FIFOs, sparse giants — refused without
    /// reading them whole, hanging, or filling the disk; nothing left behind.
    @Test func hostileRepositoryFilesAreRefusedWithoutBeingReadWhole() async throws {
        let s = try await BackupEngineTests.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let backup = try #require(s.repository.finishedBackups().last)
        let record = backup.appendingPathComponent(BackupAuthentication.fileName)
        let saved = try Data(contentsOf: record)
        func expectRefused(_ what: String) async throws {
            let parent = temporaryDirectory()
            await #expect(throws: BackupError.self, Comment(rawValue: what)) {
                _ = try await RestoreEngine(backup: backup).restore(to: parent.appendingPathComponent("d"), files: s.source, password: nil,
                                                                   options: RestoreOptions(allOrNothing: true))
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: parent.path).isEmpty, "\(what): something was left behind")
        }
        try FileManager.default.removeItem(at: record)
        try FileManager.default.createSymbolicLink(atPath: record.path, withDestinationPath: "/dev/zero")
        try await expectRefused("authentication -> /dev/zero")
        try FileManager.default.removeItem(at: record)
        #expect(mkfifo(record.path, 0o600) == 0)
        try await expectRefused("authentication is a FIFO")
        try FileManager.default.removeItem(at: record)
        #expect(FileManager.default.createFile(atPath: record.path, contents: nil))
        #expect(truncate(record.path, 1 << 40) == 0)
        try await expectRefused("authentication is a sparse terabyte")
        try FileManager.default.removeItem(at: record)
        try saved.write(to: record)

        // An object that grew (a sparse terabyte after its genuine bytes), and one that is a link.
        let entries = try await RestoreEngine(backup: backup).manifest(files: s.source, password: nil).entries()
        let object = s.repository.objectURL(try #require(entries.first { $0.kind == .file && $0.size > 0 }?.sha256))
        let genuine = try Data(contentsOf: object)
        #expect(truncate(object.path, 1 << 40) == 0)
        try await expectRefused("an object grown to a terabyte")
        try FileManager.default.removeItem(at: object)
        try FileManager.default.createSymbolicLink(atPath: object.path, withDestinationPath: "/dev/zero")
        try await expectRefused("an object -> /dev/zero")
        // By default: that file alone is left out and named, without reading /dev/zero.
        let past = try await RestoreEngine(backup: backup).restore(to: temporaryDirectory().appendingPathComponent("d"), files: s.source, password: nil)
        #expect(past.damagedFiles.map(\.issue) == ["its stored content is not a regular file"])
        try FileManager.default.removeItem(at: object)
        #expect(mkfifo(object.path, 0o600) == 0)   // a FIFO: never opened for reading, never hangs
        let fifo = try await RestoreEngine(backup: backup).restore(to: temporaryDirectory().appendingPathComponent("d"), files: s.source, password: nil)
        #expect(fifo.damagedFiles.map(\.issue) == ["its stored content is not a regular file"])
        try FileManager.default.removeItem(at: object)
        try genuine.write(to: object)

        // A destination whose parent other users can rename entries in is refused.
        let shared = temporaryDirectory().appendingPathComponent("shared")
        try FileManager.default.createDirectory(at: shared, withIntermediateDirectories: true)
        chmod(shared.path, 0o777)
        await #expect(throws: BackupError.self) {
            _ = try await RestoreEngine(backup: backup).restore(to: shared.appendingPathComponent("d"), files: s.source, password: nil)
        }
        // What an interrupted restore left is removed by the next one to the same destination.
        let parent = temporaryDirectory()
        let stale = parent.appendingPathComponent(".d.dp-restore-deadbeef")
        try FileManager.default.createDirectory(at: stale, withIntermediateDirectories: true)
        try Data("plaintext".utf8).write(to: stale.appendingPathComponent("a.txt"))
        _ = try await RestoreEngine(backup: backup).restore(to: parent.appendingPathComponent("d"), files: s.source, password: nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: parent.path) == ["d"])
    }

    /// A repository whose own directories are links does not send a backup's writes elsewhere.
    @Test func aRepositoryWithPlantedLinksIsRefused() async throws {
        let s = try await BackupEngineTests.scenario()
        let elsewhere = temporaryDirectory()
        try FileManager.default.createDirectory(at: s.repository.url, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: s.repository.url.appendingPathComponent("objects").path, withDestinationPath: elsewhere.path)
        try Data("keep".utf8).write(to: elsewhere.appendingPathComponent(".tmp-victim"))
        await #expect(throws: BackupError.self) {
            _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path) == [".tmp-victim"])
        try FileManager.default.removeItem(at: s.repository.url.appendingPathComponent("objects"))
        try FileManager.default.createSymbolicLink(atPath: s.repository.url.appendingPathComponent("lock").path, withDestinationPath: elsewhere.appendingPathComponent("planted").path)
        await #expect(throws: (any Error).self) {
            _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        }
        #expect(!FileManager.default.fileExists(atPath: elsewhere.appendingPathComponent("planted").path))
    }

    /// A sealed object of the bystander device: (SHA-256, bytes).
    static func sealedObject(_ text: String) async throws -> (sha: String, bytes: [UInt8]) {
        let url = temporaryDirectory().appendingPathComponent("object")
        try await BackupEngineTests.bystander().write(Data(text.utf8), to: url, protection: .completeUnlessOpen)
        let bytes = [UInt8](try Data(contentsOf: url))
        return (try BackupRepository(url: url.deletingLastPathComponent()).hash(of: url), bytes)
    }
}

/// The data root's layout: entries a layer registers go with an erase, in any process.
@Suite struct DataRootLayoutTests {
    @Test func anEraseRemovesWhatTheBackupLayerRegistered() async throws {
        let s = try await BackupEngineTests.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let layout = DataRootLayout(root: s.sourceRoot)
        #expect(layout.registeredEntries() == ["backup-index"])
        #expect(FileManager.default.fileExists(atPath: layout.path("backup-index")))
        try await s.source.keybag.erase()
        #expect(!FileManager.default.fileExists(atPath: layout.path("backup-index")))
        #expect(!FileManager.default.fileExists(atPath: layout.registry))
        #expect(throws: KeybagError.self) { try layout.register("../escape") }
        #expect(throws: KeybagError.self) { try layout.register("keybag") }
    }

    /// The copy phase opens what the walk saw as a regular file without following a link and
    /// without blocking on a FIFO: a file swapped for a link to another app's data, or for a
    /// FIFO, between the walk and the copy is never read through.
    @Test func aFileSwappedForALinkOrAFIFOAfterTheWalkIsNotReadThrough() async throws {
        let s = try await BackupEngineTests.scenario()
        let secret = s.base.appendingPathComponent("other-app-secret")
        try Data("not yours".utf8).write(to: secret)
        let link = s.base.appendingPathComponent("swapped")
        try FileManager.default.createSymbolicLink(at: link, withDestinationURL: secret)
        try s.repository.prepare()
        #expect(throws: FileSystemError.self) { _ = try s.repository.store(link.path) }
        await #expect(throws: FileSystemError.self) { _ = try await s.repository.storeSealed(link.path, files: s.source) }
        let fifo = s.base.appendingPathComponent("fifo").path
        #expect(mkfifo(fifo, 0o600) == 0)
        #expect(throws: FileSystemError.self) { _ = try s.repository.store(fifo) }
    }

    /// A planted "newest" entry (no keys needed to make one) is passed over: the repository's
    /// latest is the newest backup that authenticates.
    @Test func aPlantedNewestBackupIsPassedOverForTheLatestAuthenticOne() async throws {
        let s = try await BackupEngineTests.scenario()
        _ = try await BackupEngine(source: s.container, repository: s.repository, files: s.source).run()
        let genuine = try #require(s.repository.finishedBackups().last)
        let planted = s.repository.url.appendingPathComponent("backups/99991231T235959Z-0")
        try FileManager.default.createDirectory(at: planted, withIntermediateDirectories: true)
        for name in [BackupRepository.objectListName, BackupAuthentication.fileName, BackupManifest.fileName] {
            try Data(repeating: 0x41, count: 60).write(to: planted.appendingPathComponent(name))
        }
        #expect(s.repository.finishedBackups().last?.lastPathComponent == planted.lastPathComponent)
        var passedOver: [String] = []
        let latest = try await s.repository.latestAuthenticBackup(files: s.source, password: nil) { url, _ in passedOver.append(url.lastPathComponent) }
        #expect(latest == genuine && passedOver == [planted.lastPathComponent])
        // Only forged entries left: that is forgery (exit 4 in dpctl), not an empty repository.
        try FileManager.default.removeItem(at: genuine)
        await #expect(throws: BackupError.notAuthentic(path: s.repository.url.path, reason: "none of its 1 finished backup(s) authenticates")) {
            _ = try await s.repository.latestAuthenticBackup(files: s.source, password: nil)
        }
        try FileManager.default.removeItem(at: planted)
        await #expect(throws: BackupError.noFinishedBackup(path: s.repository.url.path)) {
            _ = try await s.repository.latestAuthenticBackup(files: s.source, password: nil)
        }
    }
}
