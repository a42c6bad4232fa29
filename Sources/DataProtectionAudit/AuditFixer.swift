import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Applies the fixes an audit found that are safe to apply (``AuditFix/isAutomatic``):
/// re-protecting files, setting container defaults, marking do-not-back-up, tightening modes,
/// dropping grants of removed apps. It never deletes data and never weakens a file; every other
/// fix is left to a person. Each item is fixed only if it is still the one the audit saw (same
/// device and inode), reached with no link below its container, and — inside a container —
/// while no app that can write there runs. A data root's own files are never converted.
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
        var done = Set<[UInt8]>()
        for finding in findings.filter(\.fix.isAutomatic).sorted(by: {
            (order($0.fix), $0.path.count, $0.path) < (order($1.fix), $1.path.count, $1.path)
        }) {
            guard done.insert(Array("\(finding.fix)".utf8) + [0] + LosslessPath.bytes(of: finding.path)).inserted else {
                continue
            }
            do {
                try await apply(finding)
                outcomes.append(Outcome(finding: finding, error: nil))
            } catch {
                outcomes.append(Outcome(finding: finding, error: error))
            }
        }
        return outcomes
    }

    private func apply(_ finding: AuditFinding) async throws {
        let path = finding.path
        switch finding.fix {
        case .setAppDefault(let app, let cls):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            // Only the default: files already stronger keep their class, weaker ones are
            // reported (DP102, DP103) and fixed one by one.
            _ = try await manager.setDefaultProtection(cls, ofApp: try AppIdentifier(app), reprotect: false)
        case .setGroupDefault(let group, let cls):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            _ = try await manager.setDefaultProtection(cls, ofGroup: try AppGroupIdentifier(group), reprotect: false)
        case .removeGrant(let id):
            guard let manager else { throw AuditFixError.needsDevice(path) }
            try SharingBroker(manager: manager).revoke(id)
        case .protect, .excludeFromBackup, .setMode:
            try DataRootGuard.check(path, fix: finding.fix)
            let (base, apps) = container(of: path)
            if let manager, !apps.isEmpty {
                // Not while the app runs: it cannot swap a link in between the check and the fix.
                try await manager.whileNotRunning(apps) { try await applyToItem(finding, beneath: base) }
            } else {
                try await applyToItem(finding, beneath: base)
            }
        default:
            break
        }
    }

    /// A per-item fix, on the item the audit saw: reopened with no link anywhere below `base`
    /// (or in the whole path), checked to be the same device and inode, changed through its descriptor.
    private func applyToItem(_ finding: AuditFinding, beneath base: String?) async throws {
        let path = finding.path
        let fd = try Self.openVerified(path, identity: finding.identity, beneath: base)
        defer { close(fd) }
        switch finding.fix {
        case .setMode(let mode):
            guard fchmod(fd, mode_t(mode)) == 0 else {
                throw FileSystemError("fchmod", path: path, errno: Errno(rawValue: errno))
            }
        case .excludeFromBackup:
            let value = Array("false".utf8)
            do throws(Errno) { try SystemCall.fsetxattr(fd, BackupExclusionAttribute.attribute, value) } catch {
                throw FileSystemError("fsetxattr", path: path, errno: error)
            }
            var st = stat()
            if fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFDIR {
                let tag = openat(
                    fd, BackupExclusionAttribute.cacheDirectoryTagName,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
                if tag >= 0 {
                    let bytes = Array(BackupExclusionAttribute.cacheDirectoryTagContents.utf8)
                    _ = write(tag, bytes, bytes.count)
                    fsync(tag)
                    close(tag)
                }
            }
        case .protect(let cls):
            guard let files else { throw AuditFixError.needsDevice(path) }
            try await files.setProtection(cls, ofItemAt: URL(fileURLWithPath: path))
        default:
            break
        }
    }

    /// The container holding `path`, and the apps that must not run while it is fixed.
    private func container(of path: String) -> (base: String?, apps: [AppContainer]) {
        guard let catalog = manager?.catalog else { return (nil, []) }
        for app in catalog.apps() where path.hasPrefix(app.url.path + "/") || path == app.url.path {
            return (app.url.path, [app])
        }
        for group in catalog.groups() where path.hasPrefix(group.url.path + "/") || path == group.url.path {
            return (group.url.path, catalog.members(of: group.identifier))
        }
        return (nil, [])
    }

    /// Opens `path` read-only without following any link below `base` (`openat2` with
    /// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`; without a base, no link anywhere in the path),
    /// and checks it is the item the audit saw.
    static func openVerified(_ path: String, identity: FileIdentity?, beneath base: String?) throws -> Int32 {
        var directory: Int32 = -100   // AT_FDCWD
        var relative = path
        var resolve: SystemCall.Resolve = .noSymlinks
        if let base {
            directory = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard directory >= 0 else { throw FileSystemError("open", path: base, errno: Errno(rawValue: errno)) }
            relative = path == base ? "." : String(path.dropFirst(base.count + 1))
            resolve.insert(.beneath)
        }
        defer { if base != nil { close(directory) } }
        let opened = try LosslessPath.withCString(relative) { relative in
            Result { () throws(Errno) in
                try SystemCall.openat2(
                    directory, relative, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, resolve: resolve)
            }
        }
        let fd = try opened.mapError {
            AuditFixError.changed(path, "it is, or is reached through, a link now (\($0.description))")
        }.get()
        var st = stat()
        guard fstat(fd, &st) == 0 else { close(fd); throw AuditFixError.changed(path, "it cannot be examined") }
        if let identity, FileIdentity(status: st) != identity {
            close(fd)
            throw AuditFixError.changed(path, "another item is there now")
        }
        return fd
    }
}

/// The data root's own files are never converted: a fix inside a data root applies only to
/// container contents (not their metadata), and a mode fix to the root's own files.
enum DataRootGuard {
    static func check(_ path: String, fix: AuditFix) throws {
        var url = URL(fileURLWithPath: path)
        while url.path != "/" {
            let candidate = url.path
            if TreeWalk.dataRootMarkers.allSatisfy({ POSIXFile.linkStatus(candidate + "/" + $0) != nil }) {
                if case .setMode = fix,
                    [candidate, candidate + "/Containers", candidate + "/Sharing"].contains(path)
                        || TreeWalk.dataRootFiles.contains(where: { candidate + "/" + $0 == path })
                {
                    return
                }
                let inside = String(path.dropFirst(candidate.count))
                let parts = inside.split(separator: "/").map(String.init)
                let inContainer =
                    parts.count >= 5 && parts[0] == "Containers"
                    && ((parts[1] == "Data" && parts[2] == "Application")
                        || (parts[1] == "Shared" && parts[2] == "AppGroup"))
                    && UUID(uuidString: parts[3]) != nil
                    && !(parts.count == 5 && parts[4] == DataRootLayout.containerMetadataFileName)
                guard inContainer else {
                    throw AuditFixError.refused(
                        path, "it belongs to the data root \(LosslessPath.display(candidate)), not to a container")
                }
                return
            }
            url.deleteLastPathComponent()
        }
    }
}

/// Why a safe fix could not be applied.
public enum AuditFixError: Error, CustomStringConvertible {
    /// The fix needs the device's keys or data root, and none was given.
    case needsDevice(String)
    /// The item is not what the audit saw, or is reached through a link: nothing was changed.
    case changed(String, String)
    /// The item may not be changed by an audit.
    case refused(String, String)

    public var description: String {
        switch self {
        case .needsDevice(let path):
            "\(LosslessPath.display(path)): fixing this needs the device (its keys or its data root)"
        case .changed(let path, let why):
            "\(LosslessPath.display(path)) changed since the audit: \(why); nothing was done (audit again)"
        case .refused(let path, let why): "\(LosslessPath.display(path)) is not fixed: \(why)"
        }
    }
}
