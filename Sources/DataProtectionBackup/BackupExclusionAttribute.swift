import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Whether an item is left out of backups, and why — the answer to iOS's
/// `URLResourceValues.isExcludedFromBackup`, plus where the mark that decides it sits.
public enum BackupExclusion: Sendable, Equatable, CustomStringConvertible {
    /// Backed up.
    case included
    /// Excluded by its own mark.
    case excludedByOwnAttribute
    /// Excluded because an ancestor directory is marked.
    case excludedByAncestor(URL)

    /// `true` for both kinds of exclusion.
    public var isExcludedFromBackup: Bool { self != .included }

    public var description: String {
        switch self {
        case .included: "included"
        case .excludedByOwnAttribute: "excluded (own mark)"
        case .excludedByAncestor(let url): "excluded (by \(url.path))"
        }
    }
}

/// Errors of backup marks.
public enum BackupExclusionError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// Marking needs an existing item, as on iOS.
    case noSuchFile(path: String)
    /// A file-system call failed (for example: the file system keeps no extended attributes).
    case fileSystem(FileSystemError)
    /// A name that an exclude list cannot express (a newline in it).
    case inexpressibleName(path: String, format: String)

    public var description: String {
        switch self {
        case .noSuchFile(let path): "\(path): no such file or directory"
        case .fileSystem(let error): error.description
        case .inexpressibleName(let path, let format):
            "\(path): this name cannot be written into a \(format) exclude list"
        }
    }
    public var errorDescription: String? { description }
}

/// The "do not back up" mark, stored where backup tools look for it:
///
/// - the freedesktop.org extended attribute `user.xdg.robots.backup` = `false` on the item
///   (the convention borg and Duplicati read; "include" removes the attribute rather than
///   writing `true`, which borg 1.x reads the wrong way round);
/// - for a directory, unless asked not to, a `CACHEDIR.TAG` with the Cache Directory Tagging
///   signature, which `tar`, `restic` and `borg` honour with `--exclude-caches`. Only a tag this
///   library wrote is removed again.
///
/// A directory's mark covers everything below it; nothing below is marked one by one.
public enum BackupExclusionAttribute {
    /// The extended attribute.
    public static let attribute = BackupMark.attribute
    /// The tag file's name.
    public static let cacheDirectoryTagName = BackupMark.cacheDirectoryTagName
    /// The first 43 bytes every cache directory tag must start with (MD5 of ".IsCacheDirectory").
    public static let cacheDirectoryTagSignature = BackupMark.cacheDirectoryTagSignature
    /// The whole tag this library writes.
    public static let cacheDirectoryTagContents =
        cacheDirectoryTagSignature + """

            # This directory is excluded from backups: it was marked with DataProtection (`dpctl exclude`).
            # `dpctl include` removes this file again. For the tag itself see https://bford.info/cachedir/

            """

    /// Marks or unmarks `url`, like setting `URLResourceValues.isExcludedFromBackup`.
    ///
    /// ```swift
    /// try BackupExclusionAttribute.set(excluded: true, for: offlineDirectory)   // also writes CACHEDIR.TAG
    /// ```
    /// - Throws: ``BackupExclusionError/noSuchFile(path:)`` when `url` does not exist.
    public static func set(excluded: Bool, for url: URL, cacheDirectoryTag: Bool = true) throws {
        let path = url.path
        let kind = POSIXFile.kind(path)
        guard kind.exists else { throw BackupExclusionError.noSuchFile(path: path) }
        try wrapFS {
            if excluded {
                try POSIXFile.setAttribute(attribute, Array("false".utf8), path: path)
                if kind.isDirectory, cacheDirectoryTag { try writeTag(in: path) }
            } else {
                try POSIXFile.removeAttribute(attribute, path: path)
                if kind.isDirectory { try removeOwnTag(in: path) }
            }
        }
    }

    /// Marks or unmarks every item of `urls`, or none of them: every item must exist and its
    /// mark must be readable before the first changes, and when one change fails (a read-only
    /// or immutable item, a file system without user extended attributes) the items before it
    /// are put back as they were, tags included, before the error is thrown.
    ///
    /// ```swift
    /// try BackupExclusionAttribute.set(excluded: true, for: [downloads, thumbnails])
    /// ```
    public static func set(excluded: Bool, for urls: [URL], cacheDirectoryTag: Bool = true) throws {
        struct Before { var url: URL, marked: Bool, tag: Bool, ownTag: Bool }
        var before: [Before] = []
        for url in urls {
            let path = url.path
            guard POSIXFile.kind(path).exists else { throw BackupExclusionError.noSuchFile(path: path) }
            before.append(
                Before(
                    url: url, marked: try isExcluded(path), tag: POSIXFile.linkStatus(tagPath(in: path)) != nil,
                    ownTag: hasOwnTag(in: path)))
        }
        for (index, item) in before.enumerated() {
            do {
                try set(excluded: excluded, for: item.url, cacheDirectoryTag: cacheDirectoryTag)
            } catch {
                // The failed item too: its attribute may have changed before its tag failed.
                for earlier in before[...index].reversed() {
                    try? restore(earlier.url, marked: earlier.marked, tag: earlier.tag, ownTag: earlier.ownTag)
                }
                throw error
            }
        }
    }

    /// Puts one item's mark and tag back as they were before a failed ``set(excluded:for:cacheDirectoryTag:)-([URL])``.
    private static func restore(_ url: URL, marked: Bool, tag: Bool, ownTag: Bool) throws {
        let path = url.path
        try wrapFS {
            if marked {
                try POSIXFile.setAttribute(attribute, Array("false".utf8), path: path)
            } else {
                try POSIXFile.removeAttribute(attribute, path: path)
            }
        }
        guard POSIXFile.kind(path).isDirectory else { return }
        if !tag {
            try removeOwnTag(in: path)
        } else if ownTag, POSIXFile.linkStatus(tagPath(in: path)) == nil {
            try writeTag(in: path)
        }
    }

    /// Whether `url` is excluded, by its own mark or an ancestor's.
    public static func exclusion(of url: URL) throws -> BackupExclusion {
        let standardized = url.standardizedFileURL
        guard POSIXFile.kind(standardized.path).exists else {
            throw BackupExclusionError.noSuchFile(path: standardized.path)
        }
        if try isExcluded(standardized.path) { return .excludedByOwnAttribute }
        var ancestor = standardized.deletingLastPathComponent()
        while true {
            if (try? isExcluded(ancestor.path)) == true { return .excludedByAncestor(ancestor) }
            if ancestor.path == "/" { return .included }
            ancestor = ancestor.deletingLastPathComponent()
        }
    }

    /// Whether `path` carries the mark itself.
    static func isExcluded(_ path: String) throws -> Bool {
        try wrapFS { try POSIXFile.getAttribute(attribute, path: path) }.map {
            String(decoding: $0, as: UTF8.self) == "false"
        } ?? false
    }

    private static func tagPath(in directory: String) -> String { directory + "/" + cacheDirectoryTagName }

    /// Whether `directory` holds a tag this library wrote.
    private static func hasOwnTag(in directory: String) -> Bool {
        guard let contents = try? Data(POSIXFile.readAll(tagPath(in: directory))) else { return false }
        return contents == Data(cacheDirectoryTagContents.utf8)
    }

    private static func writeTag(in directory: String) throws {
        let tag = tagPath(in: directory)
        if POSIXFile.linkStatus(tag) != nil { return }   // a tag (ours or someone's) is already there
        try POSIXFile.writeAtomically(tag, Array(cacheDirectoryTagContents.utf8), permissions: .init(rawValue: 0o644))
    }

    private static func removeOwnTag(in directory: String) throws {
        guard hasOwnTag(in: directory) else { return }
        try POSIXFile.call("unlink", tagPath(in: directory)) { unlink($0) }
    }

    static func wrapFS<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch let error as FileSystemError {
            if error.errno == .noSuchFileOrDirectory { throw BackupExclusionError.noSuchFile(path: error.path) }
            throw BackupExclusionError.fileSystem(error)
        }
    }
}

extension URL {
    /// Applies `values.isExcludedFromBackup` for real, where Foundation on Linux ignores it:
    ///
    /// ```swift
    /// var values = URLResourceValues()
    /// values.isExcludedFromBackup = true
    /// try url.setBackupResourceValues(values)
    /// ```
    public func setBackupResourceValues(_ values: URLResourceValues) throws {
        if let excluded = values.isExcludedFromBackup {
            try BackupExclusionAttribute.set(excluded: excluded, for: self)
        }
    }

    /// Whether this item is excluded from backups, and by which mark.
    public func backupExclusion() throws -> BackupExclusion { try BackupExclusionAttribute.exclusion(of: self) }
}
