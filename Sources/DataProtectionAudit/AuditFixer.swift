import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Applies the fixes an audit found that are safe to apply (``AuditFix/isAutomatic``):
/// re-protecting files and containers, marking do-not-back-up, tightening modes, dropping grants
/// of removed apps. It never deletes data; every other fix is left to a person.
///
/// ```swift
/// let report = try Auditor().audit(tree: url)
/// let outcomes = await AuditFixer(files: files).apply(report.findings)
/// ```
///
/// Re-protecting needs the class keys of the classes involved (an unlocked device for class A);
/// marking and modes need none.
public struct AuditFixer: Sendable {
    /// `nil`: no device; fixes that need class keys fail with ``AuditFixError/needsDevice``.
    public let files: ProtectedFileManager?
    /// `nil`: no data root; container and grant fixes fail with ``AuditFixError/needsDevice``.
    public let manager: ContainerManager?

    public init(files: ProtectedFileManager? = nil, manager: ContainerManager? = nil) {
        self.files = files ?? manager?.files
        self.manager = manager
    }

    /// What became of one fix: `nil` error when applied.
    public struct Outcome: Sendable {
        public let finding: AuditFinding
        public let error: (any Error)?
    }

    /// Applies the automatic fixes of `findings` — modes first, then container defaults (which
    /// re-protect their files), then files, marks and grants — each once. The others are skipped.
    public func apply(_ findings: [AuditFinding]) async -> [Outcome] {
        func order(_ fix: AuditFix) -> Int {
            switch fix {
            case .setMode: 0
            case .setAppDefault, .setGroupDefault: 1
            case .protect: 2
            default: 3
            }
        }
        var outcomes: [Outcome] = []
        var done = Set<String>()
        for finding in findings.filter(\.fix.isAutomatic).sorted(by: { (order($0.fix), $0.path.count, $0.path) < (order($1.fix), $1.path.count, $1.path) }) {
            let key = "\(finding.fix)|\(finding.path)"
            guard done.insert(key).inserted else { continue }
            do {
                try await apply(finding.fix, at: finding.path)
                outcomes.append(Outcome(finding: finding, error: nil))
            } catch {
                outcomes.append(Outcome(finding: finding, error: error))
            }
        }
        return outcomes
    }

    private func apply(_ fix: AuditFix, at path: String) async throws {
        let url = URL(fileURLWithPath: path)
        switch fix {
        case .protect(let cls):
            guard let files else { throw AuditFixError.needsDevice(path) }
            try await files.setProtection(cls, ofItemAt: url)
        case .excludeFromBackup:
            try BackupExclusionAttribute.set(excluded: true, for: url)
        case .setMode(let mode):
            try POSIXFile.call("chmod", path) { chmod($0, mode_t(mode)) }
        case .setAppDefault(let app, let cls):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            _ = try await manager.setDefaultProtection(cls, ofApp: try AppIdentifier(app), reprotect: true)
        case .setGroupDefault(let group, let cls):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            _ = try await manager.setDefaultProtection(cls, ofGroup: try AppGroupIdentifier(group), reprotect: true)
        case .removeGrant(let id):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            try SharingBroker(manager: manager).revoke(id)
        default:
            break
        }
    }
}

/// Why a safe fix could not be applied.
public enum AuditFixError: Error, CustomStringConvertible {
    /// The fix needs the device's keys or data root, and none was given.
    case needsDevice(String)

    public var description: String {
        switch self {
        case .needsDevice(let path): "\(LosslessPath.display(path)): fixing this needs the device (its keys or its data root)"
        }
    }
}
