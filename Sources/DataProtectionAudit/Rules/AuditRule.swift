/// What `dpctl audit` looks for: one rule per data-storage mistake iOS developers make, each with a stable
/// identifier (`DP101`…) that SARIF dashboards and `--json` readers can key on (FORMAT.md §13).
public enum AuditRule: String, Codable, Sendable, CaseIterable {
    // Files and classes
    case plainFile = "DP101"
    case classNone = "DP102"
    case weakerThanDirectory = "DP103"
    case containerDefaultNone = "DP104"
    // Databases
    case plaintextDatabase = "DP201"
    case weakDatabaseKey = "DP202"
    case plaintextDatabaseSidecar = "DP203"
    case databaseWithItsOwnKey = "DP204"
    // Backup
    case largeFileBackedUp = "DP301"
    case backupMarkLost = "DP302"
    // App Groups
    case groupDefaultUnset = "DP401"
    case groupWeakerThanMember = "DP402"
    case secretInGroupPreferences = "DP403"
    // Sharing
    case documentsExposed = "DP501"
    case longLivedWriteGrant = "DP502"
    case grantOfUninstalledApp = "DP503"
    case staleInboxFile = "DP504"
    // Links and modes
    case linkLeavesContainer = "DP601"
    case writableByOthers = "DP602"
    case looseDataRootMode = "DP603"
    case setIDOrSpecialFile = "DP604"

    /// The identifier: `DP101`…
    public var id: String { rawValue }

    /// A short kebab-case name (SARIF's `reportingDescriptor.name`).
    public var name: String {
        switch self {
        case .plainFile: "plain-file"
        case .classNone: "class-none"
        case .weakerThanDirectory: "weaker-than-directory"
        case .containerDefaultNone: "container-default-none"
        case .plaintextDatabase: "plaintext-database"
        case .weakDatabaseKey: "weak-database-key"
        case .plaintextDatabaseSidecar: "plaintext-database-sidecar"
        case .databaseWithItsOwnKey: "database-with-its-own-key"
        case .largeFileBackedUp: "large-file-backed-up"
        case .backupMarkLost: "backup-mark-lost"
        case .groupDefaultUnset: "group-default-unset"
        case .groupWeakerThanMember: "group-weaker-than-member"
        case .secretInGroupPreferences: "secret-in-group-preferences"
        case .documentsExposed: "documents-exposed"
        case .longLivedWriteGrant: "long-lived-write-grant"
        case .grantOfUninstalledApp: "grant-of-uninstalled-app"
        case .staleInboxFile: "stale-inbox-file"
        case .linkLeavesContainer: "link-leaves-container"
        case .writableByOthers: "writable-by-others"
        case .setIDOrSpecialFile: "set-id-or-special-file"
        case .looseDataRootMode: "loose-data-root-mode"
        }
    }

    public var severity: AuditSeverity {
        switch self {
        case .plainFile, .containerDefaultNone, .plaintextDatabase, .plaintextDatabaseSidecar,
            .secretInGroupPreferences, .looseDataRootMode:
            .high
        case .classNone, .weakerThanDirectory, .weakDatabaseKey, .largeFileBackedUp, .groupWeakerThanMember,
            .longLivedWriteGrant,
            .linkLeavesContainer, .writableByOthers, .setIDOrSpecialFile:
            .medium
        case .backupMarkLost, .groupDefaultUnset, .documentsExposed, .grantOfUninstalledApp, .staleInboxFile,
            .databaseWithItsOwnKey:
            .low
        }
    }

    /// What the rule finds, in a few words.
    public var title: String {
        switch self {
        case .plainFile: "File not in the protected format"
        case .classNone: "File in class None"
        case .weakerThanDirectory: "File weaker than its directory's default class"
        case .containerDefaultNone: "Container whose default class is None"
        case .plaintextDatabase: "SQLite database stored in plaintext"
        case .weakDatabaseKey: "Database key file weaker than its container's default"
        case .plaintextDatabaseSidecar: "Plaintext WAL or journal next to an encrypted database"
        case .databaseWithItsOwnKey: "Database encrypted with a key of its own"
        case .largeFileBackedUp: "Large file that will be backed up"
        case .backupMarkLost: "Do-not-back-up mark half lost"
        case .groupDefaultUnset: "App Group container at the default class"
        case .groupWeakerThanMember: "App Group container weaker than a member app"
        case .secretInGroupPreferences: "Likely secret in App Group preferences"
        case .documentsExposed: "Documents exposed through the document browser"
        case .longLivedWriteGrant: "Write or delete grant without an end"
        case .grantOfUninstalledApp: "Grant of an app no longer installed"
        case .staleInboxFile: "Inbox file never cleaned up"
        case .linkLeavesContainer: "Link leading out of its container"
        case .writableByOthers: "Writable by other users"
        case .setIDOrSpecialFile: "Set-user-ID or set-group-ID item, FIFO, socket or device"
        case .looseDataRootMode: "Data root or device secret readable by others"
        }
    }

    /// Why it matters, in one sentence.
    public var why: String {
        switch self {
        case .plainFile:
            "Anyone who reads the disk reads this file: it is not encrypted under any protection class (Apple's guideline: set the class before writing)."
        case .classNone:
            "Class None's key is always available, so the file is readable whenever the device is, locked or not."
        case .weakerThanDirectory:
            "The file is weaker than what its directory gives new files: its class was set after it was written, or it was copied in."
        case .containerDefaultNone:
            "Every file the app creates inherits class None: readable while the device is locked."
        case .plaintextDatabase:
            "The database starts with \"SQLite format 3\": its rows are plaintext on disk, whatever the app believes."
        case .weakDatabaseKey:
            "The database is only as protected as its key file, which is of a weaker class than the container's default."
        case .plaintextDatabaseSidecar:
            "Its pages are plaintext copies of rows of an encrypted database (a left-over from before encryption, or a tool that bypassed it)."
        case .databaseWithItsOwnKey:
            "An SQLCipher database keyed by its app, not by a class: the device's lock does not govern it, and it is as safe as wherever its key is kept."
        case .largeFileBackedUp:
            "Large offline or re-downloadable data that is backed up gets iOS apps rejected by App Review: mark it do-not-back-up or move it to Caches."
        case .backupMarkLost:
            "Backup tools disagree about this directory: one of its two marks (the xattr and CACHEDIR.TAG) was lost by a copy or an archive."
        case .groupDefaultUnset:
            "The group container never had its class chosen: it keeps iOS's default whatever its member apps require (as on iOS)."
        case .groupWeakerThanMember:
            "Data a member app shares through the group is less protected there than in the app's own container."
        case .secretInGroupPreferences:
            "Every member of the group, and every extension, reads these preferences: a secret belongs in the keychain."
        case .documentsExposed:
            "Every other app can be granted items of this app's Documents (UISupportsDocumentBrowser exposes it silently on iOS)."
        case .longLivedWriteGrant:
            "Another app can change or delete this item for as long as the grant lasts, which is until someone remembers to revoke it."
        case .grantOfUninstalledApp:
            "The grant names an app that is gone; a new app installed under that identity must not inherit it."
        case .staleInboxFile:
            "Files opened in from other apps stay in Documents/Inbox until the app deletes them: copies of other apps' data pile up."
        case .linkLeavesContainer:
            "A link out of the container lets whoever follows it read or write outside the app's data."
        case .writableByOthers:
            "Another user on this machine can replace or change it."
        case .setIDOrSpecialFile:
            "Data is neither set-ID nor a FIFO, socket or device: such an item is left by a program that can do what the sandbox refuses, or is a trap for whoever opens or runs it."
        case .looseDataRootMode:
            "The device secret and keybag protect every class; other users must not read them or the directory holding them."
        }
    }
}
