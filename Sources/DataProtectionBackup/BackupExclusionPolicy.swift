import Foundation

/// What a backup excludes by where it is, besides the items that carry the exclusion attribute
/// (``URLResourceValues/isExcludedFromBackup``): for an iOS app container, `Library/Caches` and
/// `tmp` — MobileBackup's "blacklist". The caller supplies it (a plain directory backs up
/// everything with ``none``; the container layer knows a container's own exclusions).
///
/// ```swift
/// BackupEngine(source: container, repository: repo, files: files, policy: .appContainer)
/// BackupEngine(source: photos, repository: repo, files: files, policy: .none)
/// ```
public struct BackupExclusionPolicy: Sendable, Equatable {
    /// Paths relative to the backed-up directory, `/`-separated, excluded with everything below.
    public var excludedPaths: Set<String>

    public init(excludedPaths: Set<String>) { self.excludedPaths = excludedPaths }

    /// An iOS app container's: `Library/Caches` and `tmp`.
    public static let appContainer = BackupExclusionPolicy(excludedPaths: ["Library/Caches", "tmp"])
    /// Nothing excluded by place.
    public static let none = BackupExclusionPolicy(excludedPaths: [])

    /// Whether `relativePath` is excluded by this policy.
    public func excludes(_ relativePath: String) -> Bool { excludedPaths.contains(relativePath) }
}
