import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// Progress of ``ProtectedFileManager/reprotectItems(at:to:progress:)``.
public struct ReprotectionProgress: Sendable, Equatable {
    /// Items handled so far.
    public var completed: Int
    /// Items in the tree.
    public var total: Int
    /// The item just handled.
    public var path: String
}

/// What a tree re-protection did.
public struct ReprotectionReport: Sendable, Equatable {
    /// Files whose class changed (plain files converted included).
    public var filesChanged = 0
    /// Files that already had the class.
    public var filesUnchanged = 0
    /// Directories whose default was set.
    public var directories = 0
    /// Cache directory tags (`CACHEDIR.TAG` with its signature) left plaintext: `tar`, `restic` and
    /// `borg` read them to leave their directory out of backups, and they hold nothing secret.
    public var cacheDirectoryTagsLeftPlain = 0
    /// Items that could not be changed, with the reason. Nothing else was touched for them.
    public var failures: [String: String] = [:]
    /// Symbolic links met below the top, left alone: a link is never followed (it could lead out
    /// of the tree — an app's link to the device secret, say).
    public var linksSkipped = 0
}

extension ProtectedFileManager {
    /// Sets `cls` on every file below `url` (and `url` itself) and makes it the default of every
    /// directory — the enumerator loop iOS developers write with `FileManager`, in one call.
    /// Files are rewrapped (protected) or converted in place (plain).
    ///
    /// Every class the walk needs is checked first: when one is unavailable (the device is
    /// locked), the call throws ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``
    /// for the first file that needs it, and nothing — no file, no directory default — has
    /// changed. After that, one item's failure (a damaged file, a lock that starts half-way) is
    /// recorded in the report and the walk goes on. A cancelled task stops between two items
    /// with ``ProtectedFileError/interrupted(completed:total:)``.
    ///
    /// ```swift
    /// let report = try await files.reprotectItems(at: documents, to: .complete) { p in
    ///     print("\(p.completed)/\(p.total) \(p.path)")
    /// }
    /// ```
    ///
    /// With `settingDirectoryDefaults: false` only files change: directories keep the defaults
    /// they have (an app container re-protected after its default class changed, where new files
    /// should go on inheriting from the container's root). Files named in `skipping` are left
    /// as they are (a container's metadata, `CACHEDIR.TAG` files that tools read as plain text).
    @discardableResult
    public func reprotectItems(
        at url: URL, to cls: ProtectionClass, settingDirectoryDefaults: Bool = true, skipping: Set<String> = [],
        progress: (@Sendable (ReprotectionProgress) -> Void)? = nil
    ) async throws -> ReprotectionReport {
        try await reprotectItems(
            at: [url], to: cls, settingDirectoryDefaults: settingDirectoryDefaults, skipping: skipping,
            progress: progress)
    }

    /// ``reprotectItems(at:to:settingDirectoryDefaults:skipping:progress:)`` for several trees at
    /// once: every tree is walked and every class checked before the first change.
    @discardableResult
    public func reprotectItems(
        at urls: [URL], to cls: ProtectionClass, settingDirectoryDefaults: Bool = true, skipping: Set<String> = [],
        progress: (@Sendable (ReprotectionProgress) -> Void)? = nil
    ) async throws -> ReprotectionReport {
        let items = try reprotectionItems(at: urls, skipping: skipping)
        try await checkClassesAvailable(for: items, to: cls)
        var report = ReprotectionReport()
        for (index, item) in items.enumerated() {
            // A cancelled task (Ctrl-C) stops between two items: each is whole.
            if Task.isCancelled { throw ProtectedFileError.interrupted(completed: index, total: items.count) }
            do {
                if !item.isTop, let st = POSIXFile.linkStatus(item.url.path), st.st_mode & S_IFMT != S_IFREG,
                    st.st_mode & S_IFMT != S_IFDIR
                {
                    if st.st_mode & S_IFMT == S_IFLNK { report.linksSkipped += 1 }
                    progress?(ReprotectionProgress(completed: index + 1, total: items.count, path: item.url.path))
                    continue
                }
                switch try protection(ofItemAt: item.url) {
                case .directory:
                    guard settingDirectoryDefaults else { break }
                    try await setProtection(cls, ofItemAt: item.url)
                    report.directories += 1
                case .protected(let current) where current == cls:
                    report.filesUnchanged += 1
                case .plain where BackupMark.isCacheDirectoryTag(item.url.path):
                    report.cacheDirectoryTagsLeftPlain += 1   // tar, restic and borg must still read it
                case .protected, .plain:
                    try await setProtection(cls, ofItemAt: item.url)
                    report.filesChanged += 1
                case .other:
                    break
                }
            } catch {
                report.failures[item.url.path] = String(describing: error)
            }
            progress?(ReprotectionProgress(completed: index + 1, total: items.count, path: item.url.path))
        }
        return report
    }

    /// Checks, before anything changes, that every class needed to give the trees at `urls`
    /// the class `cls` is available now (as ``reprotectItems(at:to:settingDirectoryDefaults:skipping:progress:)``
    /// does first): for a caller that changes something else before re-protecting.
    /// - Throws: ``ProtectedFileError/noSuchFile(path:)`` for a missing tree;
    ///   ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` for the
    ///   first file that needs an unavailable class.
    public func checkClassesAvailable(
        forReprotectingItemsAt urls: [URL], to cls: ProtectionClass, skipping: Set<String> = []
    ) async throws {
        try await checkClassesAvailable(for: try reprotectionItems(at: urls, skipping: skipping), to: cls)
    }

    /// Checks, before anything changes, that every class needed to give `items` the class `cls`
    /// is available now: each file's own class to unwrap its key, `cls` to wrap it (class B
    /// wraps with its public key, so it is always available). Directories, files that already
    /// have `cls` and links below the top (never followed) need nothing.
    /// - Throws: ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` for
    ///   the first file that needs an unavailable class.
    public func checkClassesAvailable(forReprotecting items: [URL], to cls: ProtectionClass) async throws {
        try await checkClassesAvailable(for: items.map { ReprotectionItem(url: $0, isTop: true) }, to: cls)
    }

    /// An item of a re-protection walk; a top one (a tree or a file named by the caller) is
    /// taken as it is, links below the top are never followed.
    struct ReprotectionItem {
        var url: URL
        var isTop: Bool
    }

    /// Every item of the trees at `urls`, each tree's top first.
    func reprotectionItems(at urls: [URL], skipping: Set<String>) throws -> [ReprotectionItem] {
        var items: [ReprotectionItem] = []
        for url in urls {
            guard POSIXFile.status(url.path) != nil else { throw ProtectedFileError.noSuchFile(path: url.path) }
            // A link named on top is followed to a directory or a protected file (its header is
            // rewritten where it lies); a link to a plain file would be replaced by a protected
            // copy, leaving the plaintext target behind, and a device or FIFO has nothing to protect.
            let top = try protection(ofItemAt: url)
            switch top {
            case .directory, .protected: break
            case .plain, .other: try ProtectedFileError.checkReplaceable(url.path)
            }
            items.append(ReprotectionItem(url: url, isTop: true))
            guard case .directory = top else { continue }
            // Names read as bytes: a file whose name is not UTF-8 is re-protected too.
            var pending = [url]
            while let directory = pending.popLast() {
                for name in try wrapFS({ try POSIXFile.directoryEntries(directory.path) }).sorted()
                where !skipping.contains(name) {
                    let child = directory.appendingPathComponent(name)
                    items.append(ReprotectionItem(url: child, isTop: false))
                    if let st = POSIXFile.linkStatus(child.path), st.st_mode & S_IFMT == S_IFDIR {
                        pending.append(child)
                    }
                }
            }
        }
        return items
    }

    private func checkClassesAvailable(for items: [ReprotectionItem], to cls: ProtectionClass) async throws {
        let canCreate = await keybag.canCreate(cls)
        var available: [ProtectionClass: Bool] = [:]
        for item in items {
            // As the change itself: a link, FIFO or device below the top is skipped, not followed.
            if !item.isTop, let st = POSIXFile.linkStatus(item.url.path), st.st_mode & S_IFMT != S_IFREG { continue }
            let current: ProtectionClass?
            switch try? protection(ofItemAt: item.url) {
            case .protected(let existing)? where existing != cls: current = existing
            case .plain?: current = nil
            default: continue
            }
            if let current {
                if available[current] == nil { available[current] = await keybag.isAvailable(current) }
                if available[current] == false {
                    throw ProtectedFileError.unavailable(
                        path: item.url.path, protectionClass: current, lockState: await keybag.lockState, writing: false
                    )
                }
            }
            if !canCreate {
                throw ProtectedFileError.unavailable(
                    path: item.url.path, protectionClass: cls, lockState: await keybag.lockState, writing: true)
            }
        }
    }
}
