import DataProtection
import DataProtectionSystem
import Foundation

/// Errors of the backup engine; each says what to do.
public enum BackupError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The backup is missing, not a backup, or was modified in a way that stops a restore.
    case badBackup(path: String, reason: String)
    /// The backup did not finish (killed half-way): it cannot be restored.
    case incompleteBackup(path: String)
    /// A name in the manifest would write outside the destination.
    case unsafePath(String)
    /// The restore destination must not exist, or be an empty directory.
    case destinationNotEmpty(path: String)
    /// Protected files come from another device and no backup password was given.
    case passwordNeeded(files: Int)
    /// Verification found missing or altered objects.
    case verificationFailed(problems: [String])
    /// The source directory does not exist.
    case noSuchSource(path: String)
    /// The backup's authentication record is missing or does not match: it was modified, or
    /// was not made by this device (or by the device whose backup password was given).
    case notAuthentic(path: String, reason: String)
    /// The backup password does not open the backup keybag (or the keybag was modified).
    case wrongBackupPassword
    /// A restore failed part-way; the destination was left untouched.
    case restoreFailed(String)
    /// The repository holds no finished backup (or none that authenticates) to take as its latest.
    case noFinishedBackup(path: String)
    /// The directory holds none of a backup's files, and is no repository: a wrong path, not damage.
    case notABackup(path: String)
    /// A backup destination that exists, is not empty and is not a repository: it is left as it
    /// is (a repository is made only in a new or empty directory, as `restic init` does).
    case notARepository(path: String)
    /// Another process is backing up into (or pruning) the repository (it holds the writer lock): busy, not
    /// damaged. `holder` names it (`pid 1234 (dpctl backup …)`) when it can be told.
    case repositoryBusy(path: String, holder: String?)
    /// The backup was interrupted (its task cancelled: Ctrl-C in dpctl). `stored` of `total`
    /// files are in the repository; the next backup of the same directory into it does not copy
    /// them again. The backup itself stays incomplete.
    case interrupted(stored: Int, total: Int)
    /// The restore was interrupted: nothing was restored, the destination is as it was.
    case restoreInterrupted(path: String)
    /// `forget` was given no rule that keeps anything: it would forget every backup.
    case emptyRetentionPolicy
    /// `forget` was given an ID the repository does not hold: nothing was removed.
    case noSuchBackup(id: String)
    /// A path given to restore (`include`) is not in the backup: nothing was restored.
    case nothingIncluded(path: String)
    /// A remote location that cannot be used as written.
    case badRemote(String, reason: String)
    /// The remote storage could not be reached or failed (rclone's last words); what this device
    /// stored waits in its staging area and goes up on the next run.
    case remoteFailed(String, reason: String)
    /// Ctrl-C or SIGTERM stopped a transfer with the remote storage (`doing`: what it was doing).
    case remoteInterrupted(String, doing: String)
    /// A program the remote repository needs is not installed.
    case toolMissing(String, package: String)

    public var description: String {
        switch self {
        case .badBackup(let path, let reason): "\(path): not a usable backup: \(reason)"
        case .incompleteBackup(let path):
            "\(path): this backup is incomplete (it was interrupted) and cannot be restored"
        case .unsafePath(let name): "refusing to restore \(name): it would write outside the destination"
        case .destinationNotEmpty(let path): "\(path): the restore destination must not exist or must be empty"
        case .passwordNeeded(let files):
            "this backup was made on another device (\(files) sealed item(s)): give the backup password (--password-file)"
        case .verificationFailed(let problems):
            "verification failed: \(problems.count) problem(s): " + problems.prefix(5).joined(separator: "; ")
        case .noSuchSource(let path): "\(path): no such directory"
        case .notAuthentic(let path, let reason): "\(path): not an authentic backup: \(reason)"
        case .wrongBackupPassword: "wrong backup password (or the backup keybag was modified)"
        case .restoreFailed(let why): "restore failed, nothing was restored: \(why)"
        case .noFinishedBackup(let path): "\(path): the repository holds no finished backup that authenticates"
        case .notABackup(let path): "\(path): not a backup (REPOSITORY/backups/ID) nor a repository"
        case .notARepository(let path):
            "\(path): neither empty nor a backup repository; give a new or empty directory for a new repository (nothing was written)"
        case .interrupted(let stored, let total):
            "interrupted: \(stored) of \(total) files stored, the backup left incomplete; run the same backup again to finish (what was stored is not copied again)"
        case .restoreInterrupted(let path):
            "\(path): the restore was interrupted; nothing was restored and the destination is as it was: run it again"
        case .emptyRetentionPolicy:
            "no rule keeps anything (give --keep-last, --keep-daily … or backup IDs): nothing was forgotten"
        case .noSuchBackup(let id):
            "\(LosslessPath.display(id)): the repository holds no such backup; nothing was forgotten"
        case .badRemote(let location, let reason): "\(location): not a usable remote location: \(reason)"
        case .remoteFailed(let location, let reason): "\(location): \(reason)"
        case .remoteInterrupted(let location, let doing):
            "\(location): interrupted while \(doing); nothing there lists as complete that is not, and what was not sent goes with the next backup: run it again"
        case .toolMissing(let tool, let package): "\(tool) is not installed (Debian: apt-get install \(package))"
        case .nothingIncluded(let path):
            "\(LosslessPath.display(path)): the backup holds no such path (paths are relative to the backed-up directory); nothing was restored"
        case .repositoryBusy(let path, let holder):
            "\(path): another backup or prune of this repository is running\(holder.map { " (\($0))" } ?? ""); nothing was written: try again when it ends"
        }
    }
    public var errorDescription: String? { description }
}
