import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// Where the broker keeps its records (FORMAT.md §1 and §11): outside every container, so no
/// app can read or change them, and registered so that an erase removes them.
///
/// ```text
/// ROOT/Sharing/
///   Deliveries/<app UUID>/<time>-<UUID>.plist   what an app is yet to be told (open-in copies)
///   Grants/<grant UUID>.plist                   file-provider grants and shares
///   Snapshots/<grant UUID>                      what a snapshot share reads
/// ```
extension DataRootLayout {
    static let sharingEntry = "Sharing"

    /// `ROOT/Sharing`.
    public var sharing: String { path(Self.sharingEntry) }
    /// The queue of what `app` is yet to be told.
    func deliveries(for app: UUID) -> String { sharing + "/Deliveries/" + app.uuidString }
    /// The grant records.
    var grants: String { sharing + "/Grants" }
    /// The snapshots of shares.
    var snapshots: String { sharing + "/Snapshots" }

    /// Creates `ROOT/Sharing` and its directories (0700) and registers the entry.
    func prepareSharing() throws {
        try register(Self.sharingEntry)
        for directory in [sharing, sharing + "/Deliveries", grants, snapshots] { try makeSharingDirectory(directory) }
    }
}

/// `mkdir` with mode 0700; an existing directory is fine.
func makeSharingDirectory(_ path: String) throws {
    do {
        _ = try POSIXFile.call("mkdir", path) { mkdir($0, 0o700) }
    } catch let error as FileSystemError where error.errno == .fileExists {
        guard POSIXFile.kind(path).isDirectory else { throw error }
    }
}
