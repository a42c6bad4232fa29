import Foundation

/// What a backup did.
public struct BackupSummary: Sendable, Equatable, Codable {
    public var backup: String = ""
    public var files = 0
    public var directories = 0
    public var symlinks = 0
    public var protectedFiles = 0
    /// Protected files bound to this device: they restore only here.
    public var thisDeviceOnlyFiles = 0
    /// Files whose content was copied into the repository (the rest were already there).
    public var filesCopied = 0
    public var bytesCopied: Int64 = 0
    public var skippedByAttribute = 0
    /// Items the engine's ``BackupExclusionPolicy`` excludes (for app containers: `Library/Caches`, `tmp`).
    public var skippedByPolicy = 0
    /// The repository itself, when it lies inside the backed-up directory (0 or 1).
    public var skippedRepository = 0
    /// A data root's own files (device secret, keybag, their locks: ``DataRootLayout/deviceFileNames``),
    /// never backed up whatever the source is.
    public var skippedDeviceFiles = 0
    /// Files removed, or replaced by something that is not a regular file, between the walk and their copy.
    public var skippedChanged = 0
    public var hasBackupKeybag = false
}

/// How far a backup or a restore is: items (files; for a restore, every entry) and bytes done,
/// out of totals known before the first byte is copied.
public struct BackupProgress: Sendable, Equatable {
    public var items: Int
    public var totalItems: Int
    public var bytes: Int64
    public var totalBytes: Int64

    public init(items: Int, totalItems: Int, bytes: Int64, totalBytes: Int64) {
        self.items = items
        self.totalItems = totalItems
        self.bytes = bytes
        self.totalBytes = totalBytes
    }
}
