import Crypto
import DataProtection
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
}

/// Restores one backup into a new directory, and verifies backups.
///
/// A restore never writes outside its destination: names with `..`, absolute names and links
/// pointing out of the tree are refused, links are created last, and every parent on the way
/// is checked to be a real directory. Every object's SHA-256 is checked while it is copied.
/// Protected files from another device are rewrapped for this one with the backup keybag's
/// class keys — their content is not decrypted.
public struct RestoreEngine: Sendable {
    public var backup: URL

    public init(backup: URL) { self.backup = backup.standardizedFileURL }

    var repository: BackupRepository { BackupRepository(url: backup.deletingLastPathComponent().deletingLastPathComponent()) }

    /// Refuses a backup that did not finish.
    func requireFinished() throws {
        if backup.lastPathComponent.hasSuffix(BackupRepository.incompleteSuffix) {
            throw BackupError.incompleteBackup(path: backup.path)
        }
        guard FileManager.default.fileExists(atPath: backup.appendingPathComponent(BackupRepository.objectListName).path) else {
            throw BackupError.badBackup(path: backup.path, reason: "no object list (not a backup, or an unfinished one)")
        }
    }

    /// The backup keybag's class keys, unlocked with `password`.
    func backupKeys(password: String?) throws -> BackupClassKeys {
        guard let password else { throw BackupError.passwordNeeded(files: 1) }
        let backupKeybag = backup.appendingPathComponent(BackupKeybag.fileName)
        guard FileManager.default.fileExists(atPath: backupKeybag.path) else {
            throw BackupError.badBackup(path: backup.path, reason: "it has no backup keybag: it restores only on the device that made it")
        }
        return try BackupKeybag(contentsOf: backupKeybag).unlock(password: password)
    }

    /// Opens the sealed manifest: with this device's class B key when this device made the
    /// backup, else with the backup password (its copy is rewrapped for this device first).
    public func manifest(files: ProtectedFileManager, password: String?) async throws -> BackupManifest {
        try requireFinished()
        let sealed = backup.appendingPathComponent(BackupManifest.fileName)
        guard FileManager.default.fileExists(atPath: sealed.path) else {
            throw BackupError.badBackup(path: backup.path, reason: "no manifest")
        }
        var bytes: Data
        if try Self.keybagID(of: sealed) == files.keybag.id {
            bytes = try await files.contents(of: sealed)
        } else {
            let keys = try backupKeys(password: password)
            let copy = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dp-manifest-\(UUID().uuidString)")
            try FileManager.default.copyItem(at: sealed, to: copy)
            defer { try? FileManager.default.removeItem(at: copy) }
            try await files.adoptFile(at: copy, from: keys)
            bytes = try await files.contents(of: copy)
        }
        defer { bytes.resetBytes(in: 0..<bytes.count) }
        return try BackupManifest.deserialize([UInt8](bytes), path: sealed.path)
    }

    /// Checks that every object the backup uses is present and unaltered. Needs no key.
    public func verify() throws -> Int {
        try requireFinished()
        let list = try String(contentsOf: backup.appendingPathComponent(BackupRepository.objectListName), encoding: .utf8)
        let objects = list.split(separator: "\n").map(String.init)
        var problems: [String] = []
        for sha in objects {
            guard sha.count == 64, sha.allSatisfy(\.isHexDigit) else { problems.append("malformed object name \(sha.prefix(70))"); continue }
            guard repository.hasObject(sha) else { problems.append("object \(sha.prefix(12))… is missing"); continue }
            if try repository.hashOfObject(sha) != sha { problems.append("object \(sha.prefix(12))… was altered") }
        }
        if !problems.isEmpty { throw BackupError.verificationFailed(problems: problems) }
        return objects.count
    }

    /// Restores into `destination` (which must not exist or be empty).
    /// - Parameters:
    ///   - files: this device's protected files, for rewrapping files from another device.
    ///   - password: the backup password, needed only for files from another device.
    public func restore(to destination: URL, files: ProtectedFileManager, password: String?,
                        log: (String) -> Void = { _ in }, progress: (_ done: Int, _ total: Int) -> Void = { _, _ in }) async throws -> RestoreSummary {
        let destination = destination.standardizedFileURL
        let entries = try await manifest(files: files, password: password).entries()
        for entry in entries { try Self.checkName(entry.path) }

        // Before writing anything: which stored objects come from another device?
        let local = files.keybag.id
        var foreignObjects: Set<String> = []
        var deviceOnlyElsewhere: Set<String> = []
        for entry in entries where entry.kind == .file && (entry.fileClass != nil || entry.sealed) {
            guard let sha = entry.sha256, repository.hasObject(sha) else {
                throw BackupError.badBackup(path: backup.path, reason: "the object of \(entry.path) is missing (run `dpctl verify`)")
            }
            guard try Self.keybagID(of: repository.objectURL(sha)) != local else { continue }
            if entry.thisDeviceOnly { deviceOnlyElsewhere.insert(entry.path) } else { foreignObjects.insert(entry.path) }
        }
        var backupKeys: BackupClassKeys?
        if !foreignObjects.isEmpty {
            guard password != nil else { throw BackupError.passwordNeeded(files: foreignObjects.count) }
            backupKeys = try self.backupKeys(password: password)
        }

        let destinationExists = FileManager.default.fileExists(atPath: destination.path)
        if destinationExists {
            guard (try? FileManager.default.contentsOfDirectory(atPath: destination.path).isEmpty) == true else {
                throw BackupError.destinationNotEmpty(path: destination.path)
            }
        }
        // Everything goes into a hidden sibling that becomes DEST only at the end: a failed
        // restore leaves no half-restored tree behind.
        let parent = destination.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: parent, withIntermediateDirectories: true)
        let stage = parent.appendingPathComponent(".\(destination.lastPathComponent).dp-restore-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: stage, withIntermediateDirectories: false)
        do {
            let summary = try await restore(entries, into: stage, files: files, foreignObjects: foreignObjects,
                                             deviceOnlyElsewhere: deviceOnlyElsewhere, backupKeys: backupKeys,
                                             reportingAs: destination, log: log, progress: progress)
            if destinationExists { try POSIXFile.check("rmdir", destination.path) { rmdir(destination.path) } }
            try POSIXFile.check("rename", destination.path) { rename(stage.path, destination.path) }
            return summary
        } catch {
            try? FileManager.default.removeItem(at: stage)
            throw error
        }
    }

    private func restore(_ entries: [ManifestEntry], into destination: URL, files: ProtectedFileManager,
                         foreignObjects: Set<String>, deviceOnlyElsewhere: Set<String>, backupKeys: BackupClassKeys?,
                         reportingAs finalDestination: URL, log: (String) -> Void, progress: (Int, Int) -> Void) async throws -> RestoreSummary {
        var summary = RestoreSummary()
        var done = 0
        // Directories and files first, links last: no link can redirect a later write.
        for entry in entries where entry.kind != .symlink {
            let target = destination.appendingPathComponent(entry.path)
            try Self.checkParents(of: entry.path, in: destination)
            switch entry.kind {
            case .directory:
                try FileManager.default.createDirectory(at: target, withIntermediateDirectories: false)
                summary.directories += 1
            case .file:
                if deviceOnlyElsewhere.contains(entry.path) {
                    log("Not restored (this device only): \(finalDestination.appendingPathComponent(entry.path).path)")
                    summary.skippedThisDeviceOnly += 1
                    continue
                }
                let adopt = foreignObjects.contains(entry.path) ? backupKeys : nil
                if entry.sealed {
                    // A plain file: open the sealed object and write its plaintext.
                    let sealed = target.deletingLastPathComponent().appendingPathComponent(".\(target.lastPathComponent).dp-restore")
                    try copyObject(entry, to: sealed)
                    defer { unlink(sealed.path) }
                    if let adopt { try await files.adoptFile(at: sealed, from: adopt) }
                    try await writePlaintext(of: sealed, to: target, files: files)
                } else {
                    try copyObject(entry, to: target)
                    if let adopt {
                        try await files.adoptFile(at: target, from: adopt)
                        summary.adoptedFiles += 1
                    }
                }
                summary.files += 1
            case .symlink:
                break
            }
            done += 1
            progress(done, entries.count)
        }
        for entry in entries where entry.kind == .symlink {
            guard let linkTarget = entry.linkTarget, Self.staysInside(link: entry.path, target: linkTarget) else {
                throw BackupError.unsafePath("\(entry.path) -> \(entry.linkTarget ?? "")")
            }
            try Self.checkParents(of: entry.path, in: destination)
            try FileManager.default.createSymbolicLink(atPath: destination.appendingPathComponent(entry.path).path, withDestinationPath: linkTarget)
            summary.symlinks += 1
            done += 1
            progress(done, entries.count)
        }
        // Modes and times, deepest first so a directory's time is not disturbed afterwards.
        for entry in entries.reversed() where entry.kind != .symlink {
            let path = destination.appendingPathComponent(entry.path).path
            chmod(path, mode_t(entry.mode))
            var times = [timespec(tv_sec: Int(entry.mtime), tv_nsec: Int((entry.mtime - entry.mtime.rounded(.down)) * 1e9)),
                         timespec(tv_sec: Int(entry.mtime), tv_nsec: Int((entry.mtime - entry.mtime.rounded(.down)) * 1e9))]
            utimensat(AT_FDCWD, path, &times, AT_SYMLINK_NOFOLLOW)
        }
        return summary
    }

    /// Decrypts a sealed object into a new plain file, in bounded memory.
    private func writePlaintext(of sealed: URL, to target: URL, files: ProtectedFileManager) async throws {
        let handle = try await files.openHandle(forReadingFrom: sealed)
        let output = try POSIXFile.open(target.path, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        do {
            var offset: Int64 = 0
            let size = try await handle.size()
            while offset < size {
                let chunk = try await handle.read(at: offset, count: 1 << 20)
                try POSIXFile.write(output, chunk, at: offset, path: target.path)
                offset += Int64(chunk.count)
            }
            try POSIXFile.sync(output, path: target.path)
            try await handle.close()
        } catch {
            try? await handle.close()
            throw error
        }
    }

    private func copyObject(_ entry: ManifestEntry, to target: URL) throws {
        guard let sha = entry.sha256, repository.hasObject(sha) else {
            throw BackupError.badBackup(path: backup.path, reason: "the object of \(entry.path) is missing (run `dpctl verify`)")
        }
        let source = repository.objectURL(sha)
        let input = try POSIXFile.open(source.path, .readOnly)
        defer { try? input.close() }
        let output = try POSIXFile.open(target.path, .writeOnly, options: [.create, .exclusiveCreate, .noFollow], permissions: .ownerReadWrite)
        defer { try? output.close() }
        guard try BackupRepository.copyHashing(from: input, source.path, to: output, target.path).sha256 == sha else {
            throw BackupError.badBackup(path: backup.path, reason: "the object of \(entry.path) was altered (run `dpctl verify`)")
        }
    }

    static func keybagID(of url: URL) throws -> UUID {
        let fd = try POSIXFile.open(url.path, .readOnly)
        defer { try? fd.close() }
        let header = try POSIXFile.read(fd, count: 48, at: 0, path: url.path)
        guard header.count == 48 else { throw BackupError.badBackup(path: url.path, reason: "truncated protected file") }
        return UUID(bytes: Array(header[32..<48]))
    }

    /// A manifest name must be relative and plain: no empty, `.` or `..` component.
    static func checkName(_ name: String) throws {
        let parts = name.split(separator: "/", omittingEmptySubsequences: false)
        guard !name.isEmpty, !name.hasPrefix("/"), !name.contains("\0"),
              parts.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." }) else {
            throw BackupError.unsafePath(name)
        }
    }

    /// Every parent of `name` inside `root` must be a real directory (never a link).
    static func checkParents(of name: String, in root: URL) throws {
        var current = root
        for part in name.split(separator: "/").dropLast() {
            current.appendPathComponent(String(part))
            var st = stat()
            guard lstat(current.path, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else { throw BackupError.unsafePath(name) }
        }
    }

    /// Whether a link at `link` (relative) pointing to `target` stays inside the tree.
    static func staysInside(link: String, target: String) -> Bool {
        guard !target.hasPrefix("/") else { return false }
        var depth = link.split(separator: "/").count - 1
        for part in target.split(separator: "/") {
            if part == ".." { depth -= 1 } else if part != "." { depth += 1 }
            if depth < 0 { return false }
        }
        return true
    }
}
