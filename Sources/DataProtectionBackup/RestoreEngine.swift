import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// What a restore did.
public struct RestoreSummary: Sendable, Equatable, Codable {
    public var files = 0
    public var directories = 0
    public var symlinks = 0
    /// Protected files rewrapped for this device (they came from another one).
    public var adoptedFiles = 0
    /// "This device only" files of another device, left out.
    public var skippedThisDeviceOnly = 0
    /// Links that would resolve outside the restored tree (`abs -> /etc/hostname`, or a chain
    /// of the backup's links that climbs out), left out and logged: a restore creates nothing
    /// that leads outside its destination.
    public var skippedOutwardLinks = 0
    /// Files whose stored content is missing or damaged: left out, every other file restored
    /// (unless ``RestoreOptions/allOrNothing``). A restore with any is not a whole one.
    public var damagedFiles: [DamagedFile] = []

    /// One file a restore left out because its stored content is missing or damaged.
    public struct DamagedFile: Sendable, Equatable, Codable, CustomStringConvertible {
        /// Its path in the backup (relative to the backed-up directory).
        public var path: String
        /// What is wrong, in words.
        public var issue: String

        public var description: String { "\(LosslessPath.display(path)): \(issue)" }
    }

    public init() {}
}

/// How a restore treats what the backup recorded.
public struct RestoreOptions: Sendable, Equatable {
    /// Apply the permission bits as backed up instead of clamping them with this process's
    /// umask. Set-user-ID, set-group-ID and sticky bits are never restored either way.
    public var keepModes: Bool
    /// Restore only these paths of the backup (relative to the backed-up directory; a
    /// directory with everything below it), with the directories that lead to them. Empty:
    /// everything.
    public var include: [String]
    /// Restore nothing unless every file's content is intact (the first damaged one fails the
    /// restore, which leaves nothing behind). Otherwise damaged files are left out and listed in
    /// ``RestoreSummary/damagedFiles``, as restic and borg do.
    public var allOrNothing: Bool

    public init(keepModes: Bool = false, include: [String] = [], allOrNothing: Bool = false) {
        self.keepModes = keepModes
        self.include = include
        self.allOrNothing = allOrNothing
    }
}

/// Restores one backup into a new directory, and verifies backups.
///
/// Nothing is trusted before the backup is authenticated (``BackupAuthentication``): its
/// authentication record must verify under this device's key, or — for a backup of another
/// device — under the key the backup password unlocks. Then every manifest field is validated,
/// every object's SHA-256 and size are checked while it is copied, and nothing is written
/// outside the destination: names with `..` or a NUL and absolute names are refused, links that
/// resolve out of the tree (following the backup's other links) are left out and logged; links are created last and
/// every parent on the way is checked to be a real directory. Protected files from another
/// device are rewrapped for this one with the backup keybag's class keys — their content is
/// not decrypted. A failed restore leaves nothing behind.
public struct RestoreEngine: Sendable {
    public var backup: URL

    public init(backup: URL) { self.backup = backup.standardizedFileURL }

    var repository: BackupRepository { BackupRepository(url: backup.deletingLastPathComponent().deletingLastPathComponent()) }

    /// A backup whose authentication verified, with the bytes that were checked (never read again).
    struct AuthenticatedBackup {
        var id: String
        var sealedManifest: [UInt8]
        var objects: [String]
        /// The other device's class keys, when another device made the backup.
        var backupKeys: BackupClassKeys?
        /// The keybag of the device that made it.
        var device: UUID
    }

    private func file(_ name: String) -> String { backup.appendingPathComponent(name).path }

    /// The largest sealed manifest and object list a restore reads (about 10 million entries).
    static let manifestLimit = 2 << 30
    static let objectListLimit = 1 << 30

    /// Checks the backup's authentication record and returns what it covers.
    func authenticate(files: ProtectedFileManager, password: String?) async throws -> AuthenticatedBackup {
        let id = backup.lastPathComponent
        if id.hasSuffix(BackupRepository.incompleteSuffix) { throw BackupError.incompleteBackup(path: backup.path) }
        guard POSIXFile.kind(file(BackupRepository.objectListName)).exists else {
            let backupFiles = [BackupAuthentication.fileName, BackupManifest.fileName, BackupKeybag.fileName]
            if !backupFiles.contains(where: { POSIXFile.linkStatus(file($0)) != nil }) { throw BackupError.notABackup(path: backup.path) }
            throw BackupError.badBackup(path: backup.path, reason: "no object list (not a backup, or an unfinished one)")
        }
        guard POSIXFile.kind(file(BackupAuthentication.fileName)).exists else {
            throw BackupError.notAuthentic(path: backup.path, reason: "it has no authentication record (made by a version before backups were authenticated, or planted)")
        }
        // Each file read once, only if it is a regular file of a plausible size: a repository's
        // symlink to /dev/zero, a FIFO or a sparse terabyte is refused, not read.
        func read(_ name: String, maxSize: Int) throws -> [UInt8] {
            do { return try POSIXFile.readRegularFile(file(name), maxSize: maxSize) } catch let error as FileSystemError {
                throw BackupError.badBackup(path: backup.path, reason: "\(name) is not a regular file of at most \(maxSize) bytes (\(error.errno))")
            }
        }
        let record = try BackupAuthentication(bytes: try read(BackupAuthentication.fileName, maxSize: BackupAuthentication.length), path: backup.path)
        guard POSIXFile.linkStatus(file(BackupManifest.fileName)) != nil else { throw BackupError.badBackup(path: backup.path, reason: "no manifest") }
        let manifest = try read(BackupManifest.fileName, maxSize: Self.manifestLimit)
        let objectList = try read(BackupRepository.objectListName, maxSize: Self.objectListLimit)
        let keybagBytes = POSIXFile.linkStatus(file(BackupKeybag.fileName)) != nil ? try read(BackupKeybag.fileName, maxSize: BackupKeybag.totalSize) : nil

        let key: SymmetricKey
        var backupKeys: BackupClassKeys?
        if record.keybagID == files.keybag.id {
            key = try await files.keybag.backupAuthenticationKey()
        } else {
            guard let keybagBytes else {
                throw BackupError.badBackup(path: backup.path, reason: "it was made by another device (keybag \(record.keybagID)) and carries no backup keybag: it restores only there")
            }
            guard let password else { throw BackupError.passwordNeeded(files: 1) }
            let keys: BackupClassKeys
            do { keys = try BackupKeybag(bytes: keybagBytes).unlock(password: password) } catch KeybagError.wrongBackupPassword {
                throw BackupError.wrongBackupPassword
            }
            guard keys.sourceKeybagID == record.keybagID else {
                throw BackupError.notAuthentic(path: backup.path, reason: "its backup keybag belongs to another device than the one named by its authentication record")
            }
            key = keys.backupAuthenticationKey
            backupKeys = keys
        }
        let contents = BackupAuthentication.Contents(backupID: id, manifest: manifest, objectList: objectList, backupKeybag: keybagBytes)
        guard record.check(contents, key: key) else {
            throw BackupError.notAuthentic(path: backup.path, reason: "its authentication does not match its contents: it was modified, or was not made by this device (or by the device whose backup password was given)")
        }
        guard let text = String(validating: objectList, as: UTF8.self) else { throw BackupError.badBackup(path: backup.path, reason: "malformed object list") }
        let objects = text.split(separator: "\n").map(String.init)
        guard objects.allSatisfy({ BackupRepository.isObjectName(Substring($0)) }) else {
            throw BackupError.badBackup(path: backup.path, reason: "malformed object list")
        }
        return AuthenticatedBackup(id: id, sealedManifest: manifest, objects: objects, backupKeys: backupKeys, device: record.keybagID)
    }

    /// Opens the authenticated, sealed manifest: with this device's class B key when this device
    /// made the backup, else with the backup password (its copy is rewrapped for this device).
    public func manifest(files: ProtectedFileManager, password: String?) async throws -> BackupManifest {
        try await manifest(of: try await authenticate(files: files, password: password), files: files)
    }

    func manifest(of authenticated: AuthenticatedBackup, files: ProtectedFileManager) async throws -> BackupManifest {
        // The checked bytes go to a private file: nothing can swap them after the check.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dp-manifest-\(UUID().uuidString)")
        try POSIXFile.call("mkdir", directory.path) { mkdir($0, 0o700) }
        defer { try? FileManager.default.removeItem(at: directory) }
        let copy = directory.appendingPathComponent(BackupManifest.fileName)
        try POSIXFile.writeAtomically(copy.path, authenticated.sealedManifest, permissions: .ownerReadWrite)
        // Errors name the manifest in the repository, never the private copy.
        var bytes: Data
        do {
            if let keys = authenticated.backupKeys { try await files.adoptFile(at: copy, from: keys) }
            bytes = try await files.contents(of: copy)
        } catch let error as ProtectedFileError where error.path == copy.path {
            throw error.naming(file(BackupManifest.fileName))
        }
        defer { bytes.resetBytes(in: 0..<bytes.count) }
        let manifest = try BackupManifest.deserialize([UInt8](bytes), path: file(BackupManifest.fileName))
        guard try manifest.meta("id") == authenticated.id else {
            throw BackupError.notAuthentic(path: backup.path, reason: "its manifest names another backup")
        }
        return manifest
    }

    /// Checks that the backup is authentic and that every object it uses is present and
    /// unaltered. Needs this device (any lock state), or the backup password for a backup
    /// made on another device. Returns the number of objects checked.
    /// - Throws: ``BackupError/verificationFailed(problems:)`` naming each damaged object and,
    ///   where the manifest can be opened, the files that use it.
    public func verify(files: ProtectedFileManager, password: String?) async throws -> Int {
        let verification = try await verification(files: files, password: password)
        if !verification.problems.isEmpty { throw BackupError.verificationFailed(problems: verification.problems.map(\.description)) }
        return verification.objectsChecked
    }

    /// Checks the backup as ``verify(files:password:)`` does, and reports every damaged object
    /// instead of throwing for it.
    ///
    /// The files that use a damaged object are named from the sealed manifest, which opens with
    /// the class B key: after the device's first unlock (or with the backup password). Before
    /// it, the objects are reported without their files (``BackupVerification/filesNamed`` is false).
    /// - Throws: what authentication throws: ``BackupError/notAuthentic(path:reason:)``,
    ///   ``BackupError/badBackup(path:reason:)``, ``BackupError/wrongBackupPassword`` …
    public func verification(files: ProtectedFileManager, password: String?) async throws -> BackupVerification {
        let authenticated = try await authenticate(files: files, password: password)
        var problems: [BackupVerification.Problem] = []
        for sha in authenticated.objects {
            let issue: BackupVerification.Issue
            if !repository.hasObject(sha) {
                issue = .missing
            } else if (try? repository.openObject(sha).close()) == nil {
                issue = .notARegularFile
            } else if try repository.hashOfObject(sha) != sha {
                issue = .altered
            } else {
                continue
            }
            problems.append(.init(object: sha, issue: issue, files: []))
        }
        var filesNamed = true
        let listed = Set(authenticated.objects)
        let damaged = Set(problems.map(\.object))
        do {
            var users: [String: [String]] = [:]
            for entry in try await manifest(of: authenticated, files: files).entries() {
                guard let sha = entry.sha256 else { continue }
                users[sha, default: []].append(entry.path)
                // A chunked file restores from its packs too: its list must parse and name only
                // packs the backup lists (an intact list that does not is named as malformed).
                guard entry.chunked, !damaged.contains(sha) else { continue }
                guard let list = try? repository.chunkList(sha, size: entry.size), list.packs.allSatisfy(listed.contains) else {
                    if !problems.contains(where: { $0.object == sha }) { problems.append(.init(object: sha, issue: .malformed, files: [])) }
                    continue
                }
                for pack in list.packs { users[pack, default: []].append(entry.path) }
            }
            for i in problems.indices { problems[i].files = users[problems[i].object] ?? [] }
        } catch {
            // Before the first unlock (class B unavailable), or the manifest cannot be read:
            // the damage is still reported, by object.
            filesNamed = problems.isEmpty
        }
        return BackupVerification(backup: authenticated.id, objectsChecked: authenticated.objects.count, filesNamed: filesNamed, problems: problems)
    }

    /// Restores into `destination` (which must not exist or be empty).
    /// - Parameters:
    ///   - files: this device's protected files, for rewrapping files from another device.
    ///   - password: the backup password, needed only for a backup made on another device.
    public func restore(to destination: URL, files: ProtectedFileManager, password: String?, options: RestoreOptions = RestoreOptions(),
                        log: (String) -> Void = { _ in }, progress: (BackupProgress) -> Void = { _ in }) async throws -> RestoreSummary {
        let destination = destination.standardizedFileURL
        let authenticated = try await authenticate(files: files, password: password)
        let backupManifest = try await manifest(of: authenticated, files: files)
        let allEntries = try backupManifest.entries()
        // SOURCE's own default class (format 3), given to DEST.
        let rootDefault: ProtectionClass?
        switch try backupManifest.meta("defaultClass") {
        case nil: rootDefault = nil
        case let text?:
            guard let number = UInt8(text), let cls = ProtectionClass(rawValue: number) else {
                throw BackupError.badBackup(path: backup.path, reason: "the manifest's default class \(text) does not exist")
            }
            rootDefault = cls
        }
        let outwardLinks = try Self.checkTree(allEntries, objects: Set(authenticated.objects))
        let entries = try Self.selecting(options.include, from: allEntries)

        // Before writing anything: which objects are missing. Which device an object belongs to
        // is read from its bytes only once they are copied and their SHA-256 checked.
        var unreadable: [[UInt8]: String] = [:]      // damaged before a byte is copied: why
        for entry in entries where entry.kind == .file {
            guard let sha = entry.sha256, repository.hasObject(sha) else {
                if options.allOrNothing {
                    throw BackupError.badBackup(path: backup.path, reason: "the object of \(LosslessPath.display(entry.path)) is missing (verify the backup)")
                }
                unreadable[LosslessPath.key(entry.path)] = DamagedContent.missing.issue
                continue
            }
        }

        if POSIXFile.kind(destination.path).exists {
            guard (try? POSIXFile.directoryEntries(destination.path).isEmpty) == true else {
                throw BackupError.destinationNotEmpty(path: destination.path)
            }
        }
        // Everything goes into a hidden sibling that becomes DEST only at the end: a failed
        // restore leaves no half-restored tree behind — and no plaintext.
        let parent = destination.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true)
        // Another user who can rename entries in the parent could swap the staging directory for
        // a link of theirs mid-restore: refuse such a parent (a sticky one, like /tmp, is fine).
        if let st = POSIXFile.status(parent.path), st.st_mode & 0o022 != 0, st.st_mode & S_ISVTX == 0 {
            throw BackupError.badBackup(path: parent.path, reason: "other users can rename entries in the destination's parent (mode \(String(st.st_mode & 0o7777, radix: 8))); restore into a directory only you can write")
        }
        // What an interrupted restore to the same destination left (plaintext included) goes first.
        let stalePrefix = ".\(destination.lastPathComponent).dp-restore-"
        for name in (try? POSIXFile.directoryEntries(parent.path)) ?? [] where name.hasPrefix(stalePrefix) {
            if let st = POSIXFile.linkStatus(parent.path + "/" + name), st.st_uid == getuid(), st.st_mode & S_IFMT == S_IFDIR {
                try? FileManager.default.removeItem(atPath: parent.path + "/" + name)
            }
        }
        let stage = parent.appendingPathComponent(stalePrefix + UUID().uuidString.prefix(8))
        try POSIXFile.call("mkdir", stage.path) { mkdir($0, 0o700) }
        do {
            // DEST keeps the stronger of its own default (an empty directory made for the restore)
            // and the backed-up one: a restore never weakens what the destination promised.
            let destinationDefault = POSIXFile.kind(destination.path).isDirectory ? try DirectoryDefault.get(destination.path) : nil
            if let stronger = [rootDefault, destinationDefault].compactMap({ $0 }).max() { try DirectoryDefault.set(stronger, stage.path) }
            let summary = try await restore(entries, into: stage, files: files, outwardLinks: outwardLinks,
                                             unreadable: unreadable, backupKeys: authenticated.backupKeys,
                                             listedObjects: Set(authenticated.objects),
                                             options: options, reportingAs: destination, log: log, progress: progress)
            if POSIXFile.kind(destination.path).exists { try POSIXFile.call("rmdir", destination.path) { rmdir($0) } }
            try POSIXFile.call("rename", stage.path, destination.path) { rename($0, $1) }
            return summary
        } catch {
            try? FileManager.default.removeItem(at: stage)
            if error is CancellationError { throw BackupError.restoreInterrupted(path: destination.path) }
            // Errors name the destination, never the hidden staging directory.
            let text = String(describing: error)
            if text.contains(stage.lastPathComponent) {
                throw BackupError.restoreFailed(text.replacingOccurrences(of: stage.path, with: destination.path))
            }
            throw error
        }
    }

    private func restore(_ entries: [ManifestEntry], into destination: URL, files: ProtectedFileManager,
                         outwardLinks: Set<[UInt8]>, unreadable: [[UInt8]: String], backupKeys: BackupClassKeys?,
                         listedObjects: Set<String>, options: RestoreOptions, reportingAs finalDestination: URL,
                         log: (String) -> Void, progress: (BackupProgress) -> Void) async throws -> RestoreSummary {
        var summary = RestoreSummary()
        var done = BackupProgress(items: 0, totalItems: entries.count, bytes: 0,
                                  totalBytes: entries.reduce(0) { $0 + ($1.kind == .file ? $1.size : 0) })
        func target(_ entry: ManifestEntry) -> String { destination.path + "/" + entry.path }
        var leftOut: Set<[UInt8]> = []   // files not restored: no mode or time is set on their names
        let local = files.keybag.id
        // Directories and files first, links last: no link can redirect a later write.
        for entry in entries where entry.kind != .symlink {
            // Ctrl-C: the caller removes what was written, and says nothing was restored.
            if Task.isCancelled { throw CancellationError() }
            try Self.checkParents(of: entry.path, in: destination.path)
            switch entry.kind {
            case .directory:
                try POSIXFile.call("mkdir", target(entry)) { mkdir($0, 0o700) }
                // Before its mode is restored (a user xattr needs write permission).
                if let cls = entry.defaultClass.flatMap({ ProtectionClass(rawValue: UInt8($0)) }) { try DirectoryDefault.set(cls, target(entry)) }
                summary.directories += 1
            case .file:
                do {
                    if let why = unreadable[LosslessPath.key(entry.path)] { throw DamagedContent(issue: why) }
                    // The object is copied (its SHA-256 and size checked) before any byte of it is
                    // believed, the keybag its header names included.
                    let copy = entry.sealed ? destination.path + "/.dp-restore-\(UUID().uuidString)" : target(entry)
                    defer { if entry.sealed { _ = try? POSIXFile.call("unlink", copy) { unlink($0) } } }
                    try copyObject(entry, to: copy, expectedSize: entry.sealed ? nil : entry.size, listedObjects: listedObjects)
                    // An encrypted database is restored as it is: its key file, a protected file,
                    // is what belongs to a device (and is rewrapped or left out as such).
                    if entry.encryptedDatabase {
                        summary.files += 1
                        done.bytes += entry.size
                        done.items += 1
                        progress(done)
                        continue
                    }
                    let owner = try Self.keybagID(of: URL(fileURLWithPath: copy))
                    if owner != local, entry.thisDeviceOnly {
                        _ = try? POSIXFile.call("unlink", copy) { unlink($0) }
                        log("Not restored (this device only): \(LosslessPath.display(finalDestination.path + "/" + entry.path))")
                        summary.skippedThisDeviceOnly += 1
                        leftOut.insert(LosslessPath.key(entry.path))
                        done.items += 1
                        progress(done)
                        continue
                    }
                    if owner != local {
                        // Made on this device, yet protected by another device's keybag (copied in, never adopted): no key here opens it.
                        guard let backupKeys else { throw DamagedContent.otherDevice }
                        try await files.adoptFile(at: URL(fileURLWithPath: copy), from: backupKeys)
                        if !entry.sealed { summary.adoptedFiles += 1 }
                    }
                    // A plain file: the sealed object's plaintext.
                    if entry.sealed { try await writePlaintext(of: copy, to: target(entry), expectedSize: entry.size, files: files) }
                } catch let error where Self.isContentDamage(error) {
                    let issue = (error as? DamagedContent)?.issue ?? DamagedContent.unauthentic.issue
                    if options.allOrNothing {
                        throw BackupError.badBackup(path: backup.path, reason: "\(LosslessPath.display(entry.path)): \(issue) (verify the backup)")
                    }
                    // Only this file: what was written of it goes, the rest of the backup is restored.
                    _ = try? POSIXFile.call("unlink", target(entry)) { unlink($0) }
                    log("Not restored (damaged: \(issue)): \(LosslessPath.display(finalDestination.path + "/" + entry.path))")
                    summary.damagedFiles.append(.init(path: entry.path, issue: issue))
                    leftOut.insert(LosslessPath.key(entry.path))
                    done.items += 1
                    progress(done)
                    continue
                }
                summary.files += 1
                done.bytes += entry.size
            case .symlink:
                break
            }
            done.items += 1
            progress(done)
        }
        for entry in entries where entry.kind == .symlink {
            if outwardLinks.contains(LosslessPath.key(entry.path)) {
                log("Not restored (a link leading outside the restored tree): \(LosslessPath.display(finalDestination.path + "/" + entry.path)) -> \(LosslessPath.display(entry.linkTarget ?? ""))")
                summary.skippedOutwardLinks += 1
                done.items += 1
                progress(done)
                continue
            }
            try Self.checkParents(of: entry.path, in: destination.path)
            try POSIXFile.call("symlink", entry.linkTarget!, target(entry)) { symlink($0, $1) }
            summary.symlinks += 1
            done.items += 1
            progress(done)
        }
        // Modes and times, deepest first so a directory's time is not disturbed afterwards.
        let mask: mode_t = options.keepModes ? 0 : POSIXFile.currentUmask()
        for entry in entries.reversed() where entry.kind != .symlink && !leftOut.contains(LosslessPath.key(entry.path)) {
            let path = target(entry)
            let mode = mode_t(entry.mode) & 0o777 & ~mask   // never set-id or sticky bits
            try POSIXFile.call("chmod", path) { chmod($0, mode) }
            let seconds = entry.mtime.rounded(.down)
            let stamp = timespec(tv_sec: Int(seconds), tv_nsec: min(999_999_999, Int((entry.mtime - seconds) * 1e9)))
            var times = [stamp, stamp]
            try POSIXFile.call("utimensat", path) { utimensat(AT_FDCWD, $0, &times, AT_SYMLINK_NOFOLLOW) }
        }
        return summary
    }

    /// Decrypts a sealed object into a new plain file, in bounded memory; its size must be the
    /// one the manifest recorded.
    private func writePlaintext(of sealed: String, to target: String, expectedSize: Int64, files: ProtectedFileManager) async throws {
        let handle = try await files.openHandle(forReadingFrom: URL(fileURLWithPath: sealed))
        let output = try POSIXFile.open(target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        do {
            var offset: Int64 = 0
            let size = try await handle.size()
            guard size == expectedSize else { throw DamagedContent.wrongSize }
            while offset < size {
                let chunk = try await handle.read(at: offset, count: 1 << 20)
                try POSIXFile.write(output, chunk, at: offset, path: target)
                offset += Int64(chunk.count)
            }
            try POSIXFile.sync(output, path: target)
            try await handle.close()
        } catch {
            try? await handle.close()
            throw error
        }
    }

    /// Copies a file's object to `target`, checking its SHA-256 and size on the way.
    /// - Throws: ``DamagedContent`` when the object is missing, not a regular file, altered or
    ///   of the wrong size; the file system's errors as they are (they stop a restore).
    private func copyObject(_ entry: ManifestEntry, to target: String, expectedSize: Int64?, listedObjects: Set<String>) throws {
        guard let sha = entry.sha256 else { throw DamagedContent.missing }
        if entry.chunked {
            // The list is read whole and checked before any chunk; each chunk is checked as it is copied.
            let list = try repository.chunkList(sha, size: entry.size)
            let output = try POSIXFile.open(target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
            defer { try? output.close() }
            try repository.writeChunks(of: list, listedObjects: listedObjects, to: output, path: LosslessPath.display(target))
            return
        }
        let source = repository.objectURL(sha)
        let input: FileDescriptor
        do { input = try POSIXFile.openRegularFile(source.path) } catch let error as FileSystemError {
            switch error.errno {
            case .noSuchFileOrDirectory: throw DamagedContent.missing
            case .tooManySymbolicLinkLevels, .invalidArgument, .isDirectory, .notDirectory: throw DamagedContent.notRegular
            default: throw error
            }
        }
        defer { try? input.close() }
        let output = try POSIXFile.open(target, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        // Never more than the manifest allows: a protected file is stored as it was; a sealed one
        // adds a header and at most 28 bytes per 4 KiB (the smallest segment).
        let limit = expectedSize ?? (160 + entry.size + 28 * (entry.size / 4096 + 1))
        let copied: (sha256: String, size: Int64)
        do {
            copied = try BackupRepository.copyHashing(from: input, source.path, to: output, LosslessPath.display(target), limit: limit)
        } catch BackupError.badBackup {
            throw DamagedContent.wrongSize   // longer than the manifest allows
        }
        guard copied.sha256 == sha else { throw DamagedContent.altered }
        if let expectedSize, copied.size != expectedSize { throw DamagedContent.wrongSize }
    }

    /// What is wrong with one file's stored content: the file is left out and named, the
    /// restore goes on (unless all or nothing was asked).
    struct DamagedContent: Error {
        var issue: String
        static let missing = DamagedContent(issue: "its stored content is missing")
        static let altered = DamagedContent(issue: "its stored content was altered")
        static let notRegular = DamagedContent(issue: "its stored content is not a regular file")
        static let wrongSize = DamagedContent(issue: "its stored content is not the size the backup recorded")
        static let unauthentic = DamagedContent(issue: "its stored content does not authenticate")
        static let otherDevice = DamagedContent(issue: "it was protected by another device's keybag, which this backup does not carry")
    }

    /// Whether `error` is damage of one file's stored content (missing, altered, the wrong size,
    /// failing authentication), which a restore can leave out and go on past — not a failure of
    /// the destination, of the repository's file system or of the keys, which stops it.
    static func isContentDamage(_ error: any Error) -> Bool {
        switch error {
        case is DamagedContent, ProtectedFileError.damaged, ProtectedFileError.unsupportedVersion,
             ProtectedFileError.foreignKeybag, KeybagError.keyUnwrapFailed, KeybagError.foreignKeybag: true
        default: false
        }
    }

    /// The entries a restore of `include` takes: every entry at or below an included path, and
    /// the directories that lead to them. Paths are compared by their bytes, component by component.
    /// - Throws: ``BackupError/nothingIncluded(path:)`` for an included path the backup does not hold.
    static func selecting(_ include: [String], from entries: [ManifestEntry]) throws -> [ManifestEntry] {
        guard !include.isEmpty else { return entries }
        var wanted: [[UInt8]] = []
        for path in include {
            var bytes = LosslessPath.bytes(of: path)[...]
            while bytes.first == UInt8(ascii: "/") { bytes = bytes.dropFirst() }
            while bytes.starts(with: [UInt8(ascii: "."), UInt8(ascii: "/")]) { bytes = bytes.dropFirst(2) }
            while bytes.last == UInt8(ascii: "/") { bytes = bytes.dropLast() }
            guard !bytes.isEmpty, entries.contains(where: { LosslessPath.key($0.path) == Array(bytes) }) else {
                throw BackupError.nothingIncluded(path: path)
            }
            wanted.append(Array(bytes))
        }
        let slash = UInt8(ascii: "/")
        return entries.filter { entry in
            let path = LosslessPath.key(entry.path)
            return wanted.contains { want in
                path == want || path.starts(with: want + [slash])
                    || (entry.kind == .directory && want.starts(with: path + [slash]))   // a directory on the way
            }
        }
    }

    static func keybagID(of url: URL) throws -> UUID {
        let fd = try POSIXFile.open(url.path, .readOnly)
        defer { try? fd.close() }
        let header = try POSIXFile.read(fd, count: 48, at: 0, path: url.path)
        guard header.count == 48 else { throw BackupError.badBackup(path: url.path, reason: "truncated protected file") }
        return UUID(bytes: Array(header[32..<48]))
    }

    /// The whole tree, before anything is written: plain relative names, a directory entry for
    /// every parent, objects listed. Returns the links that do not stay inside when resolved
    /// (following the backup's other links), which the restore leaves out.
    @discardableResult
    static func checkTree(_ entries: [ManifestEntry], objects: Set<String>) throws -> Set<[UInt8]> {
        // Names are keyed and split by their bytes, as the file system does: NFC `é` and NFD
        // `e\u{301}` are two files, and `/\u{301}` is a separator followed by a name.
        var kinds: [[UInt8]: ManifestEntry.Kind] = [:]
        var links: [(path: String, target: String)] = []
        for entry in entries {
            try checkName(entry.path)
            // One entry per name (the manifest's table has the name as its key; checked again
            // here): a link and a directory of the same name would be judged by one and
            // resolved through the other.
            guard kinds.updateValue(entry.kind, forKey: LosslessPath.key(entry.path)) == nil else {
                throw BackupError.badBackup(path: "manifest", reason: "\(LosslessPath.display(entry.path)) is listed twice")
            }
            if entry.kind == .symlink { links.append((entry.path, entry.linkTarget ?? "")) }
            if let sha = entry.sha256, !objects.contains(sha) {
                throw BackupError.badBackup(path: "manifest", reason: "\(LosslessPath.display(entry.path)) uses an object its object list does not name")
            }
        }
        for entry in entries {
            let parts = LosslessPath.components(of: entry.path)
            for depth in 1..<max(parts.count, 1) {
                guard kinds[LosslessPath.key(parts[0..<depth].joined(separator: "/"))] == .directory else { throw BackupError.unsafePath(LosslessPath.display(entry.path)) }
            }
        }
        var byBytes: [[UInt8]: String] = [:]
        for link in links { byBytes[LosslessPath.key(link.path)] = link.target }
        return Set(links.filter { !resolvesInside(link: $0.path, target: $0.target, linksByBytes: byBytes) }.map { LosslessPath.key($0.path) })
    }

    /// A manifest name must be relative and plain: no empty, `.` or `..` component, no NUL.
    static func checkName(_ name: String) throws {
        let parts = LosslessPath.components(of: name, omittingEmpty: false)
        guard !name.isEmpty, !LosslessPath.isAbsolute(name), !LosslessPath.bytes(of: name).contains(0),
              parts.allSatisfy({ !$0.isEmpty && !LosslessPath.isDotOrDotDot($0) }) else {
            throw BackupError.unsafePath(LosslessPath.display(name))
        }
    }

    /// Every parent of `name` inside `root` must be a real directory (never a link).
    static func checkParents(of name: String, in root: String) throws {
        var current = root
        for part in LosslessPath.components(of: name).dropLast() {
            current += "/" + part
            guard let st = POSIXFile.linkStatus(current), st.st_mode & S_IFMT == S_IFDIR else { throw BackupError.unsafePath(LosslessPath.display(name)) }
        }
    }

    /// Whether the link at `link` (relative to the tree) pointing to `target` resolves inside
    /// the tree, following the tree's other links (`links`, path → target) the way the kernel
    /// would, with its limit of 40 hops. Counting `..` alone is not enough: with
    /// `a/b/hop -> ../..` and `evil -> a/b/hop/../../../etc`, `evil` leaves the tree.
    static func resolvesInside(link: String, target: String, links: [String: String]) -> Bool {
        var byBytes: [[UInt8]: String] = [:]
        for (path, target) in links { byBytes[LosslessPath.key(path)] = target }
        return resolvesInside(link: link, target: target, linksByBytes: byBytes)
    }

    static func resolvesInside(link: String, target: String, linksByBytes links: [[UInt8]: String]) -> Bool {
        var stack = LosslessPath.components(of: link).dropLast().map { $0 }
        var pending = ArraySlice(LosslessPath.components(of: target))
        guard !LosslessPath.isAbsolute(target) else { return false }
        var hops = 0
        while let part = pending.popFirst() {
            if Array(part.unicodeScalars) == ["."] { continue }
            if Array(part.unicodeScalars) == [".", "."] {
                guard !stack.isEmpty else { return false }
                stack.removeLast()
                continue
            }
            stack.append(part)
            if let next = links[LosslessPath.key(stack.joined(separator: "/"))] {
                hops += 1
                guard hops <= 40, !LosslessPath.isAbsolute(next) else { return false }
                stack.removeLast()
                pending = ArraySlice(LosslessPath.components(of: next)) + pending
            }
        }
        return true
    }
}
