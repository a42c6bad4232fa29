import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// The items below a directory that carry a "do not back up" mark, written as an exclude list
/// for a backup tool that reads no extended attributes.
///
/// ```swift
/// let list = try ExclusionList(scanning: home)
/// print(try list.rendered(as: .restic))       // restic backup --exclude-file=…
/// ```
public struct ExclusionList: Sendable, Equatable {
    /// The exclude-list formats: one per backup tool that reads no extended attributes.
    public enum Format: String, Sendable, CaseIterable {
        /// Absolute paths, one per line.
        case list
        /// GNU tar `--exclude-from`/`-X`: absolute paths, wildcards escaped (use with absolute paths to archive).
        case tar
        /// restic `--exclude-file`: absolute paths, wildcards and `$` escaped.
        case restic
        /// borg `--exclude-from`: `pp:` path-prefix patterns (no wildcards at all).
        case borg
    }

    /// Marked items, absolute; a marked directory stands for everything below it.
    public var excluded: [URL]

    /// Walks `root` (without following symbolic links) and collects every marked item; below a
    /// marked directory nothing more is listed. If `root` itself is covered, it alone is listed.
    public init(scanning root: URL) throws {
        let root = root.standardizedFileURL
        if try BackupExclusionAttribute.exclusion(of: root).isExcludedFromBackup {
            excluded = [root]
            return
        }
        var found: [URL] = []
        // A file that is not marked (nor covered): nothing to list.
        var pending = POSIXFile.kind(root.path).isDirectory ? [root] : []
        while let directory = pending.popLast() {
            let names = try BackupExclusionAttribute.wrapFS { try POSIXFile.directoryEntries(directory.path) }
            for name in names.sorted() {
                let child = directory.appendingPathComponent(name)
                // A link carries no mark of its own (Linux keeps no user.* attributes on links),
                // and its target is not walked: a dangling one is no error.
                guard let st = POSIXFile.linkStatus(child.path), st.st_mode & S_IFMT != S_IFLNK else { continue }
                if try BackupExclusionAttribute.isExcluded(child.path) {
                    found.append(child)
                    continue
                }
                if st.st_mode & S_IFMT == S_IFDIR { pending.append(child) }
            }
        }
        excluded = found.sorted { $0.path < $1.path }
    }

    /// The list in `format`, one entry per line.
    public func rendered(as format: Format) throws -> String {
        try excluded.map { url -> String in
            let path = url.path
            if path.contains("\n") || path.contains("\r") {
                throw BackupExclusionError.inexpressibleName(path: path, format: format.rawValue)
            }
            switch format {
            case .list: return path
            case .tar: return Self.escapingWildcards(path)
            case .restic: return Self.escapingWildcards(path).replacingOccurrences(of: "$", with: "$$")
            case .borg: return "pp:" + path
            }
        }.map { $0 + "\n" }.joined()
    }

    /// Backslash before `\`, `*`, `?` and `[`, so fnmatch-style matchers take the name literally.
    static func escapingWildcards(_ path: String) -> String {
        var out = ""
        for character in path {
            if "\\*?[".contains(character) { out.append("\\") }
            out.append(character)
        }
        return out
    }
}
