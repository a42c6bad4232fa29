import DataProtectionBackup
import Foundation

extension ContainerManager {
    /// What a backup of `source` leaves out by place: `Library/Caches` and `tmp` of every app
    /// container at or below `source`, and `Library/Caches` of every group container — iOS's
    /// rule, known here rather than in the backup engine. For a directory that holds no
    /// container this is ``BackupExclusionPolicy/none``: it backs up whole, but for marked items.
    ///
    /// (The same directories also carry the backup layer's mark, set at install, so tools that
    /// read marks — tar, restic and borg with their cache-tag options — leave them out too.)
    public func backupExclusionPolicy(for source: URL) -> BackupExclusionPolicy {
        let base = source.standardizedFileURL.resolvingSymlinksInPath().path
        var excluded = Set<String>()
        func add(_ container: URL, _ relatives: [String]) {
            let path = container.standardizedFileURL.resolvingSymlinksInPath().path
            let prefix: String
            if path == base {
                prefix = ""
            } else if path.hasPrefix(base == "/" ? "/" : base + "/") {
                prefix = String(path.dropFirst(base == "/" ? 1 : base.count + 1)) + "/"
            } else {
                return
            }
            for relative in relatives { excluded.insert(prefix + relative) }
        }
        for app in apps() { add(app.url, AppContainer.excludedFromBackup) }
        for group in groups() { add(group.url, GroupContainer.excludedFromBackup) }
        return BackupExclusionPolicy(excludedPaths: excluded)
    }
}
