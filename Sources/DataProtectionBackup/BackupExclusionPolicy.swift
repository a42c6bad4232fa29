import Foundation

/// What a backup excludes by where it is, besides the items that carry the exclusion attribute
/// (``URLResourceValues/isExcludedFromBackup``) — MobileBackup's "blacklist". The engine knows
/// no names of its own: the caller supplies the places (the container layer knows that an app
/// container's `Library/Caches` and `tmp` are left out, and marks them too); a plain directory
/// backs up everything not marked, with ``none``.
///
/// ```swift
/// BackupEngine(source: root, repository: repo, files: files, policy: manager.backupExclusionPolicy(for: root))
/// BackupEngine(source: photos, repository: repo, files: files)          // .none
/// ```
public struct BackupExclusionPolicy: Sendable, Equatable {
    /// Paths relative to the backed-up directory, `/`-separated, excluded with everything below.
    public var excludedPaths: Set<String>

    public init(excludedPaths: Set<String>) { self.excludedPaths = excludedPaths }

    /// Nothing excluded by place.
    public static let none = BackupExclusionPolicy(excludedPaths: [])

    /// Whether `relativePath` is excluded by this policy.
    public func excludes(_ relativePath: String) -> Bool { excludedPaths.contains(relativePath) }
}
