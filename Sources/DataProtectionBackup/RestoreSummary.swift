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
