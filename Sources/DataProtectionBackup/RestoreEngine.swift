import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

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

    var repository: BackupRepository {
        BackupRepository(url: backup.deletingLastPathComponent().deletingLastPathComponent())
    }

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

    func file(_ name: String) -> String { backup.appendingPathComponent(name).path }

    /// The largest sealed manifest and object list a restore reads (about 10 million entries).
    static let manifestLimit = 2 << 30
    static let objectListLimit = 1 << 30

    /// Restores into `destination` (which must not exist or be empty).
    /// - Parameters:
    ///   - files: this device's protected files, for rewrapping files from another device.
    ///   - password: the backup password, needed only for a backup made on another device.
    public func restore(
        to destination: URL, files: ProtectedFileManager, password: String?, options: RestoreOptions = RestoreOptions(),
        log: (String) -> Void = { _ in }, progress: (BackupProgress) -> Void = { _ in }
    ) async throws -> RestoreSummary {
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
                throw BackupError.badBackup(
                    path: backup.path, reason: "the manifest's default class \(text) does not exist")
            }
            rootDefault = cls
        }
        let outwardLinks = try Self.checkTree(allEntries, objects: Set(authenticated.objects))
        let entries = try Self.selecting(options.include, from: allEntries)

        // Before writing anything: which objects are missing. Which device an object belongs to
        // is read from its bytes only once they are copied and their SHA-256 checked.
        var unreadable: [[UInt8]: String] = [:]   // damaged before a byte is copied: why
        for entry in entries where entry.kind == .file {
            guard let sha = entry.sha256, repository.hasObject(sha) else {
                if options.allOrNothing {
                    throw BackupError.badBackup(
                        path: backup.path,
                        reason: "the object of \(LosslessPath.display(entry.path)) is missing (verify the backup)")
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
            throw BackupError.badBackup(
                path: parent.path,
                reason:
                    "other users can rename entries in the destination's parent (mode \(String(st.st_mode & 0o7777, radix: 8))); restore into a directory only you can write"
            )
        }
        // What an interrupted restore to the same destination left (plaintext included) goes first.
        let stalePrefix = ".\(destination.lastPathComponent).dp-restore-"
        for name in (try? POSIXFile.directoryEntries(parent.path)) ?? [] where name.hasPrefix(stalePrefix) {
            if let st = POSIXFile.linkStatus(parent.path + "/" + name), st.st_uid == getuid(),
                st.st_mode & S_IFMT == S_IFDIR
            {
                try? FileManager.default.removeItem(atPath: parent.path + "/" + name)
            }
        }
        let stage = parent.appendingPathComponent(stalePrefix + UUID().uuidString.prefix(8))
        try POSIXFile.call("mkdir", stage.path) { mkdir($0, 0o700) }
        do {
            // DEST keeps the stronger of its own default (an empty directory made for the restore)
            // and the backed-up one: a restore never weakens what the destination promised.
            let destinationDefault =
                POSIXFile.kind(destination.path).isDirectory ? try DirectoryDefault.get(destination.path) : nil
            if let stronger = [rootDefault, destinationDefault].compactMap({ $0 }).max() {
                try DirectoryDefault.set(stronger, stage.path)
            }
            let summary = try await restore(
                entries, into: stage, files: files, outwardLinks: outwardLinks,
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

    /// What is wrong with one file's stored content: the file is left out and named, the
    /// restore goes on (unless all or nothing was asked).
    struct DamagedContent: Error {
        var issue: String
        static let missing = DamagedContent(issue: "its stored content is missing")
        static let altered = DamagedContent(issue: "its stored content was altered")
        static let notRegular = DamagedContent(issue: "its stored content is not a regular file")
        static let wrongSize = DamagedContent(issue: "its stored content is not the size the backup recorded")
        static let unauthentic = DamagedContent(issue: "its stored content does not authenticate")
        static let otherDevice = DamagedContent(
            issue: "it was protected by another device's keybag, which this backup does not carry")
    }

}
