import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// One mistake found: which rule, where, what exactly, and what fixes it.
///
/// ```swift
/// for finding in try Auditor().audit(tree: container.url).findings where finding.severity >= .medium {
///     print(finding.rule.id, finding.path, finding.detail, finding.fix.call)
/// }
/// ```
public struct AuditFinding: Sendable, Equatable, Hashable {
    public let rule: AuditRule
    /// The item: an absolute path (its bytes kept as ``LosslessPath`` maps them), or for a grant
    /// the item it names.
    public let path: String
    /// What was found about this item, in one sentence.
    public let detail: String
    public let fix: AuditFix
    /// The item's device and inode when the audit saw it: a fix applies only to that same item.
    public let identity: FileIdentity?
    /// What tells apart findings of one rule on one item (a preference key, a grant ID).
    public let discriminator: String

    public var severity: AuditSeverity { rule.severity }

    public init(
        _ rule: AuditRule, path: String, detail: String, fix: AuditFix, identity: FileIdentity? = nil,
        discriminator: String = ""
    ) {
        self.rule = rule
        self.path = path
        self.detail = detail
        self.fix = fix
        self.identity = identity
        self.discriminator = discriminator
    }

    /// Rule, path bytes and discriminator: two findings with the same key are one (names that
    /// Swift's `String` would call equal — NFC and NFD — stay two).
    var key: [UInt8] { Array(rule.id.utf8) + [0] + LosslessPath.bytes(of: path) + [0] + Array(discriminator.utf8) }
}

/// A file as the audit saw it: device, inode and status-change time. A file replaced since
/// (even one that reuses the inode number) or changed since differs.
public struct FileIdentity: Sendable, Equatable, Hashable {
    public let device: UInt64
    public let inode: UInt64
    public let changeTime: Int64

    public init(device: UInt64, inode: UInt64, changeTime: Int64) {
        self.device = device
        self.inode = inode
        self.changeTime = changeTime
    }

    init(status st: stat) {
        self.init(
            device: UInt64(st.st_dev), inode: UInt64(st.st_ino),
            changeTime: Int64(st.st_ctim.tv_sec) * 1_000_000_000 + Int64(st.st_ctim.tv_nsec))
    }
}

/// What fixes a finding. ``isAutomatic`` fixes are the ones ``AuditFixer`` (`dpctl audit --fix`)
/// applies: re-protect, mark do-not-back-up, tighten modes, drop a grant of a removed app — none
/// deletes data. The others need a person: they would delete something or change what an app
/// can do.
public enum AuditFix: Sendable, Equatable, Hashable {
    /// Set the file's class: a plain file is converted in place, a protected one's key rewrapped.
    case protect(ProtectionClass)
    /// Mark the item do-not-back-up (the xattr, and CACHEDIR.TAG for a directory).
    case excludeFromBackup
    /// Set an app's container default and re-protect its files.
    case setAppDefault(app: String, ProtectionClass)
    /// Set a group container's default and re-protect its files.
    case setGroupDefault(group: String, ProtectionClass)
    /// `chmod` to this mode.
    case setMode(UInt16)
    /// Remove a grant record whose app is gone.
    case removeGrant(UUID)

    // Needing a person:
    /// Encrypt the plaintext database in place as a class-managed database of this class.
    case encryptDatabase(ProtectionClass)
    /// Set the file's class by hand, once no program reads it directly: a database's passphrase
    /// file is read by SQLCipher itself, and an app not declared a user of protected files
    /// reads its files as they are on disk. Converting it for them would break them.
    case protectOnceNoOtherProgramReadsIt(ProtectionClass)
    /// Keep the database's own key somewhere protected (or move the data to a class-managed
    /// database): it is not converted, SQLCipher must still open it.
    case keepDatabaseKeyProtected
    /// Check, then remove a stale plaintext side file.
    case removeStaleFile
    /// Move the value to the keychain and remove the preference key.
    case moveToKeychain(key: String)
    /// Reinstall the app without the document browser, if it does not need it.
    case stopExposingDocuments(app: String)
    /// Revoke the grant, or grant again with an expiry and without persistence.
    case limitGrant(UUID)
    /// Delete the Inbox file once the app has handled it.
    case deleteInboxFile
    /// Replace the link with the data it should hold, or remove it.
    case removeLink
    /// Look at the file: restore it from a backup, or remove it if it is not data.
    case inspectDamagedFile
    /// Remove the FIFO, socket or device (nothing reads it as data).
    case removeSpecialFile

    private static func caseName(_ cls: ProtectionClass) -> String {
        cls == .noProtection ? "noProtection" : cls.iOSName
    }

    /// Whether ``AuditFixer`` applies it.
    public var isAutomatic: Bool {
        switch self {
        case .protect, .excludeFromBackup, .setAppDefault, .setGroupDefault, .setMode, .removeGrant: true
        default: false
        }
    }

    /// The call, from an app or a tool built on the library, that fixes it.
    public var call: String {
        switch self {
        case .protect(let cls): "ProtectedFileManager.setProtection(.\(Self.caseName(cls)), ofItemAt: url)"
        case .excludeFromBackup: "url.setBackupResourceValues(isExcludedFromBackup: true)"
        case .setAppDefault(_, let cls):
            "ContainerManager.setDefaultProtection(.\(Self.caseName(cls)), ofApp: id, reprotect: true)"
        case .setGroupDefault(_, let cls):
            "ContainerManager.setDefaultProtection(.\(Self.caseName(cls)), ofGroup: id, reprotect: true)"
        case .setMode(let mode): "chmod(path, 0o\(String(mode, radix: 8)))"
        case .removeGrant, .limitGrant: "SharingBroker.revoke(grantID)"
        case .encryptDatabase(let cls):
            "ProtectedDatabase.importPlaintext(at: url, keybag: keybag, protection: .\(Self.caseName(cls)))"
        case .protectOnceNoOtherProgramReadsIt(let cls):
            "ProtectedFileManager.setProtection(.\(Self.caseName(cls)), ofItemAt: url) once every reader uses the library"
        case .keepDatabaseKeyProtected:
            "keep the passphrase in a protected file or the keychain; ProtectedDatabase for a class-managed copy"
        case .removeStaleFile: "FileManager.removeItem(at: url) once no database connection is open"
        case .moveToKeychain(let key):
            "UserDefaults(suiteName: group).removeObject(forKey: \"\(key)\") after storing it in the keychain"
        case .stopExposingDocuments: "ContainerManager.install(id, documentBrowser: false)"
        case .deleteInboxFile: "FileManager.removeItem(at: inboxURL) once handled"
        case .removeLink: "FileManager.removeItem(at: linkURL)"
        case .inspectDamagedFile:
            "ProtectedFileManager.contents(of: url) says what is wrong; restore the file from a backup"
        case .removeSpecialFile: "FileManager.removeItem(at: url) once no program uses it"
        }
    }
}
