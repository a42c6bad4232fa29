import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Verification: every object a backup lists is present and whole, without restoring anything.
extension RestoreEngine {
    /// Checks that the backup is authentic and that every object it uses is present and
    /// unaltered. Needs this device (any lock state), or the backup password for a backup
    /// made on another device. Returns the number of objects checked.
    /// - Throws: ``BackupError/verificationFailed(problems:)`` naming each damaged object and,
    ///   where the manifest can be opened, the files that use it.
    public func verify(files: ProtectedFileManager, password: String?) async throws -> Int {
        let verification = try await verification(files: files, password: password)
        if !verification.problems.isEmpty {
            throw BackupError.verificationFailed(problems: verification.problems.map(\.description))
        }
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
                guard let list = try? repository.chunkList(sha, size: entry.size),
                    list.packs.allSatisfy(listed.contains)
                else {
                    if !problems.contains(where: { $0.object == sha }) {
                        problems.append(.init(object: sha, issue: .malformed, files: []))
                    }
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
        return BackupVerification(
            backup: authenticated.id, objectsChecked: authenticated.objects.count, filesNamed: filesNamed,
            problems: problems)
    }
}
