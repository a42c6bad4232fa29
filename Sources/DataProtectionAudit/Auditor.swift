import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// Finds the data-storage mistakes iOS developers make (``AuditRule``) in a directory tree, an
/// app's containers, or a whole device — from headers, extended attributes and metadata only.
/// It needs no passcode, works while the device is locked, and never decrypts anything.
///
/// ```swift
/// // In a debug build, at launch:
/// let report = try Auditor().audit(tree: CurrentApp.shared.container.url)
/// for finding in report.findings(atLeast: .medium) {
///     print("\(finding.rule.id) \(finding.path): \(finding.detail) — \(finding.fix.call)")
/// }
/// ```
///
/// ``AuditFixer`` applies the fixes that are safe to apply.
public struct Auditor: Sendable {
    public var options: AuditOptions

    public init(options: AuditOptions = AuditOptions()) {
        self.options = options
    }

    /// Audits any directory tree. A directory holding container metadata is audited as that
    /// container (its kind decides which rules apply), without needing its data root.
    public func audit(tree url: URL) throws -> AuditReport {
        let path = url.standardizedFileURL.path
        guard let st = POSIXFile.status(path), st.st_mode & S_IFMT == S_IFDIR else {
            throw AuditError.notADirectory(path)
        }
        // Who reads the files: the user's own tree, or an app declared to read them through the
        // library, may have plain files protected in place; others may not (a group's members
        // are not known from here).
        let metadata = try? ContainerMetadata.read(container: path)
        let readersUseTheLibrary: Bool
        switch metadata?.kind {
        case nil: readersUseTheLibrary = true
        case .application: readersUseTheLibrary = metadata?.usesProtectedFiles == true
        case .appGroup:
            // A group's files are read by every member: all must use the library. Members are the
            // apps of the same data root (`Containers/Data/Application`) that name the group.
            let applications = URL(fileURLWithPath: path).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent().appendingPathComponent("Data/Application").path
            let members = ((try? POSIXFile.directoryEntries(applications)) ?? []).compactMap { name in
                try? ContainerMetadata.read(container: applications + "/" + name)
            }.filter { $0.groups.contains(metadata?.identifier ?? "") }
            readersUseTheLibrary = !members.isEmpty && members.allSatisfy { $0.usesProtectedFiles == true }
        }
        var walk = TreeWalk(
            root: path, kind: TreeWalk.kind(of: path), options: options,
            containerReadersUseTheLibrary: readersUseTheLibrary)
        try walk.run()
        return AuditReport(scope: [path], findings: walk.findings, itemsExamined: walk.examined)
    }
}

/// Why an audit could not run.
public enum AuditError: Error, CustomStringConvertible, Equatable {
    case notADirectory(String)
    case cannotOpen(String, errno: Int32)
    /// The directory is a data root: it is audited as a device (``Auditor/auditDevice(_:)``).
    case dataRoot(String)

    public var description: String {
        switch self {
        case .notADirectory(let path):
            "\(LosslessPath.display(path)): not a directory (name a tree, an app or the whole device)"
        case .cannotOpen(let path, let errno):
            "\(LosslessPath.display(path)): cannot be read (\(String(cString: strerror(errno))))"
        case .dataRoot(let path):
            "\(LosslessPath.display(path)) is a data root: it is audited as a device, with its containers and grants, not as a tree of files"
        }
    }
}
