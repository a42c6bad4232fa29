import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The walk: what is in the backup, decided before anything is copied.
extension BackupEngine {
    /// One item the walk found in a directory.
    struct WalkedItem {
        /// Its name, and its path relative to the source and absolute.
        let name: String, relative: String, path: String
        /// Whether the directory it is in is a data root (the device's, found by identity, or
        /// any other, by its files).
        let inDataRoot: Bool
        /// Its own status (a link's, not its target's); `nil` when it is gone.
        let status: stat?
    }

    /// Walks the source depth-first, names sorted as bytes (none skipped or merged, whatever
    /// its encoding): the manifest's entries (files not yet read), and the bytes of the regular
    /// files. Each item left out is logged and counted (``BackupSkipReason``).
    func walk(
        into summary: inout BackupSummary, log: (String) -> Void
    ) throws -> (entries: [ManifestEntry], totalBytes: Int64) {
        var entries: [ManifestEntry] = []
        var totalBytes: Int64 = 0
        if case .excludedByAncestor(let ancestor) = try BackupExclusionAttribute.exclusion(of: source) {
            let reason = BackupSkipReason.markedAncestor(ancestor.path)
            log(reason.logLine(source.path))
            reason.count(in: &summary)
            return ([], 0)
        }
        // The device's own data root, found by identity (any spelling of it); any other data root by its files.
        let deviceRoot = POSIXFile.status(files.keybag.root).map { FileIdentity($0) }
        let repository = repositoryIdentity
        var pending = [""]
        while let relative = pending.popLast() {
            let directory = relative.isEmpty ? source.path : source.path + "/" + relative
            let names = try POSIXFile.directoryEntries(directory).sorted {
                LosslessPath.bytes(of: $0).lexicographicallyPrecedes(LosslessPath.bytes(of: $1))
            }
            let inDataRoot =
                POSIXFile.status(directory).map { FileIdentity($0) == deviceRoot } == true
                || DataRootLayout.isDataRoot(directory)
            for name in names {
                let rel = relative.isEmpty ? name : relative + "/" + name
                let path = source.path + "/" + rel
                let item = WalkedItem(
                    name: name, relative: rel, path: path, inDataRoot: inDataRoot, status: POSIXFile.linkStatus(path))
                if let reason = skipReason(for: item, repository: repository) {
                    log(reason.logLine(LosslessPath.display(path)))
                    reason.count(in: &summary)
                    continue
                }
                guard let st = item.status else { continue }   // gone since it was listed
                let mtime = Double(st.st_mtim.tv_sec) + Double(st.st_mtim.tv_nsec) / 1e9
                var entry = ManifestEntry(
                    path: rel, kind: .file, mode: Int(st.st_mode & 0o7777), mtime: mtime, size: Int64(st.st_size))
                switch st.st_mode & S_IFMT {
                case S_IFDIR:
                    entry.kind = .directory
                    entry.size = 0
                    // Its default class is part of what it promises the files made in it later.
                    entry.defaultClass = try DirectoryDefault.get(path).map { Int($0.rawValue) }
                    summary.directories += 1
                    pending.append(rel)
                case S_IFLNK:
                    entry.kind = .symlink
                    entry.size = 0
                    entry.linkTarget = try POSIXFile.linkTarget(path)
                    summary.symlinks += 1
                default:
                    // A regular file: read and copied once the walk knows how much there is.
                    summary.files += 1
                    totalBytes += entry.size
                }
                entries.append(entry)
            }
        }
        return (entries, totalBytes)
    }

    /// Why `item` is left out of the backup, `nil` when it is backed up (`repository`: the
    /// repository's identity, read once per walk). In order: a data root's
    /// own files and the policy by name alone (no system call), then the item's own attribute
    /// (never a link's target's), the repository by identity, and what has no content.
    func skipReason(for item: WalkedItem, repository: FileIdentity?) -> BackupSkipReason? {
        if item.inDataRoot, DataRootLayout.deviceFileNames.contains(item.name) { return .deviceFile }
        if policy.excludes(item.relative) { return .policy }
        guard let st = item.status else { return nil }
        let type = st.st_mode & S_IFMT
        if type != S_IFLNK, (try? BackupExclusionAttribute.isExcluded(item.path)) == true { return .attribute }
        switch type {
        case S_IFDIR: return repository == FileIdentity(st) ? .repository : nil
        case S_IFLNK, S_IFREG: return nil
        default: return .unsupportedType
        }
    }

    /// The repository's identity, when it is reachable (a repository inside the source is never
    /// backed up into itself: found by identity, not by name).
    var repositoryIdentity: FileIdentity? { POSIXFile.status(repository.url.path).map { FileIdentity($0) } }

    /// A file system item's identity: its device and inode.
    struct FileIdentity: Equatable {
        let device: UInt64, inode: UInt64
        init(_ st: stat) { (device, inode) = (UInt64(st.st_dev), UInt64(st.st_ino)) }
    }
}
