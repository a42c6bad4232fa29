import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import DataProtectionSystem
import Foundation
import SystemPackage

/// Audits that need the data root: an app with its groups and grants, or the whole device.
extension Auditor {
    /// Audits one app: its container, its App Groups' containers, whether its `Documents` is
    /// exposed, and the grants it gave or received.
    ///
    /// - Throws: ``ContainerError/unknownApp(_:)``.
    public func audit(app identifier: AppIdentifier, in manager: ContainerCatalog) throws -> AuditReport {
        let app = try manager.app(identifier)
        var findings: [AuditFinding] = []
        var examined = 0
        let container = try audit(tree: app.url)
        findings += container.findings
        examined += container.itemsExamined
        for group in manager.groups() where app.groups.contains(group.identifier) {
            let report = try audit(tree: group.url)
            findings += report.findings + groupFindings(group, in: manager)
            examined += report.itemsExamined
        }
        findings += exposureFindings(app)
        let grants = GrantStore(layout: manager.layout).all().filter {
            $0.provider == identifier.rawValue || $0.recipient == identifier.rawValue
        }
        findings += grantFindings(grants, in: manager)
        return AuditReport(scope: [identifier.rawValue], findings: findings, itemsExamined: examined)
    }

    /// Audits the whole device: the data root's modes, every app and group container, every grant.
    /// It reads the data root through a ``ContainerCatalog``: no keybag is opened, so a device
    /// whose secret cannot be loaded (rule DP603's loose modes) is still audited.
    public func auditDevice(_ manager: ContainerCatalog) throws -> AuditReport {
        var findings = dataRootFindings(manager.layout)
        var examined = 0
        for app in manager.apps() {
            let report = try audit(tree: app.url)
            findings += report.findings + exposureFindings(app)
            examined += report.itemsExamined
        }
        for group in manager.groups() {
            let report = try audit(tree: group.url)
            findings += report.findings + groupFindings(group, in: manager)
            examined += report.itemsExamined
        }
        findings += grantFindings(GrantStore(layout: manager.layout).all(), in: manager)
        return AuditReport(scope: [manager.layout.root], findings: findings, itemsExamined: examined)
    }

    /// The secrets a preferences dictionary seems to hold (rule DP403) — for an app to check
    /// its own group defaults, which only it can decrypt:
    ///
    /// ```swift
    /// let defaults = UserDefaults(suiteName: "group.com.example.shared")!
    /// let found = Auditor.secrets(inPreferences: defaults.dictionaryRepresentation(), at: path)
    /// ```
    ///
    /// The walk is bounded (100,000 values, 1,000 findings): a file that shares dictionaries
    /// among keys until it stands for millions of paths is reported as too complex to scan.
    public static func secrets(inPreferences dictionary: [String: Any], at path: String) -> [AuditFinding] {
        let scan = SecretPatterns.scan(dictionary)
        var findings = scan.found.map { found in
            AuditFinding(
                .secretInGroupPreferences, path: path, detail: "key \"\(found.key)\": \(found.reason)",
                fix: .moveToKeychain(key: found.key),
                discriminator: found.key)
        }
        if scan.exhausted {
            findings.append(
                AuditFinding(
                    .secretInGroupPreferences, path: path,
                    detail:
                        "too complex to scan: more than \(SecretPatterns.visitLimit) values (shared references?) or \(SecretPatterns.findingLimit) findings; check it by hand",
                    fix: .moveToKeychain(key: "?"), discriminator: "too-complex"))
        }
        return findings
    }

    // MARK: - Rules over metadata

    /// DP401 and DP402: a group container never given a class, or weaker than a member's.
    func groupFindings(_ group: GroupContainer, in manager: ContainerCatalog) -> [AuditFinding] {
        let members = manager.members(of: group.identifier)
        let strongest = members.map(\.defaultProtection).max() ?? .default
        if group.defaultProtection < strongest, let member = members.first(where: { $0.defaultProtection == strongest })
        {
            return [
                AuditFinding(
                    .groupWeakerThanMember, path: group.url.path,
                    detail:
                        "\(group.identifier) is class \(group.defaultProtection.letter); its member \(member.identifier) is class \(strongest.letter)",
                    fix: .setGroupDefault(group: group.identifier.rawValue, strongest))
            ]
        }
        if !group.isProtectionSet {
            return [
                AuditFinding(
                    .groupDefaultUnset, path: group.url.path,
                    detail:
                        "\(group.identifier) was never given a class: it is at the default, \(ProtectionClass.default.letter)",
                    fix: .setGroupDefault(group: group.identifier.rawValue, strongest))
            ]
        }
        return []
    }

    /// DP501: `Documents` exposed through the document browser.
    func exposureFindings(_ app: AppContainer) -> [AuditFinding] {
        guard app.supportsDocumentBrowser else { return [] }
        return [
            AuditFinding(
                .documentsExposed, path: app.documents.path,
                detail:
                    "\(app.identifier) was installed with the document browser: other apps can be granted anything in its Documents",
                fix: .stopExposingDocuments(app: app.identifier.rawValue))
        ]
    }

    /// DP502 and DP503: grants that never end and can change data; grants naming an app that is gone.
    func grantFindings(_ grants: [Grant], in manager: ContainerCatalog) -> [AuditFinding] {
        var findings: [AuditFinding] = []
        for grant in grants {
            let provider = manager.app(container: grant.providerContainer)
            let item =
                (provider?.url.path ?? manager.layout.applicationContainer(grant.providerContainer)) + "/" + grant.path
            if provider == nil || manager.app(container: grant.recipientContainer) == nil {
                let gone = provider == nil ? grant.provider : grant.recipient
                findings.append(
                    AuditFinding(
                        .grantOfUninstalledApp, path: item,
                        detail:
                            "grant \(grant.id.uuidString) from \(grant.provider) to \(grant.recipient): \(gone) is no longer installed",
                        fix: .removeGrant(grant.id), discriminator: grant.id.uuidString))
                continue
            }
            if grant.isExpired(at: options.now) { continue }
            let changing = grant.capabilities.intersection([.writing, .deleting, .renaming, .addingSubItems])
            if !changing.isEmpty, grant.persistent || grant.expires == nil {
                let lifetime = [
                    grant.persistent ? "persistent" : nil, grant.expires == nil ? "without an expiry" : nil,
                ].compactMap { $0 }.joined(separator: " and ")
                findings.append(
                    AuditFinding(
                        .longLivedWriteGrant, path: item,
                        detail:
                            "grant \(grant.id.uuidString) lets \(grant.recipient) \(changing.description) it, \(lifetime)",
                        fix: .limitGrant(grant.id), discriminator: grant.id.uuidString))
            }
        }
        return findings
    }

    /// DP603: the data root, its device secret and keybags, open to other users.
    func dataRootFindings(_ layout: DataRootLayout) -> [AuditFinding] {
        var findings: [AuditFinding] = []
        func check(_ path: String, expected: UInt16) {
            guard let st = POSIXFile.linkStatus(path), st.st_mode & S_IFMT != S_IFLNK else { return }
            let mode = UInt16(st.st_mode & 0o7777)
            if mode & 0o077 != 0 {
                findings.append(
                    AuditFinding(
                        .looseDataRootMode, path: path,
                        detail:
                            "mode \(String(mode, radix: 8)): other users can \(mode & 0o044 != 0 ? "read" : "reach") it",
                        fix: .setMode(expected)))
            }
        }
        check(layout.root, expected: 0o700)
        for name in TreeWalk.dataRootFiles { check(layout.root + "/" + name, expected: 0o600) }
        check(layout.containers, expected: 0o700)
        check(layout.sharing, expected: 0o700)
        return findings
    }
}
