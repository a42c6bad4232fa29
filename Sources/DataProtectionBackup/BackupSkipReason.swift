import Foundation

/// Why a backup leaves an item out: decided in one place (``BackupEngine/skipReason(for:repository:)``),
/// each reason with its log line — MobileBackup's own words where it has them — and the counter
/// of ``BackupSummary`` it adds to.
public enum BackupSkipReason: Sendable, Equatable {
    /// A data root's own keys, keybag and their locks (``DataRootLayout/deviceFileNames``):
    /// never backed up, whatever the source.
    case deviceFile
    /// Excluded by the engine's ``BackupExclusionPolicy`` (an app container's `Library/Caches`
    /// and `tmp`): MobileBackup's "blacklist".
    case policy
    /// The item's own "do not back up" attribute (``BackupExclusionAttribute``).
    case attribute
    /// The source itself, inside a directory marked "do not back up" (the marked directory).
    case markedAncestor(String)
    /// The backup repository, found inside the source by identity.
    case repository
    /// A FIFO, a socket or a device: no content to back up.
    case unsupportedType
    /// Removed, or replaced by something that is not a regular file, between the walk and its copy.
    case changed

    /// The line logged for the item at `path` (as shown).
    public func logLine(_ path: String) -> String {
        switch self {
        case .deviceFile: "Not backed up (the device's own keys and keybag are never backed up): \(path)"
        case .policy: "Not backed up (blacklist): \(path)"
        case .attribute: "Not backed up (attribute): \(path)"
        case .markedAncestor(let ancestor): "Not backed up (attribute): \(path) (marked: \(ancestor))"
        case .repository: "Not backed up (the backup repository): \(path)"
        case .unsupportedType: "Not backed up (unsupported file type): \(path)"
        case .changed: "Not backed up (changed during the backup): \(path)"
        }
    }

    /// Counts one item left out in `summary`.
    public func count(in summary: inout BackupSummary) {
        switch self {
        case .deviceFile: summary.skippedDeviceFiles += 1
        case .policy: summary.skippedByPolicy += 1
        case .attribute, .markedAncestor: summary.skippedByAttribute += 1
        case .repository: summary.skippedRepository += 1
        case .unsupportedType: break   // said in the log; no counter of its own
        case .changed:
            summary.skippedChanged += 1
            summary.files -= 1
        }
    }
}
