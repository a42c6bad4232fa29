import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// Where apps live in a data root (FORMAT.md §1 and §10.1) — the container layer's facet of the
/// root's one layout type: one entry, `Containers`, registered so that an erase removes it.
///
/// ```text
/// ROOT/Containers/
///   .lock                                   installs and uninstalls, one at a time
///   Data/Application/<UUID>/                an app's data container (NSHomeDirectory())
///   Shared/AppGroup/<UUID>/                 an App Group's container
/// ```
extension DataRootLayout {
    /// The name registered in the root's layout.
    static let containersEntry = "Containers"
    /// Each container's metadata file (the `.com.apple.mobile_container_manager.metadata.plist`
    /// analogue): readable by the app, never writable by it.
    public static let containerMetadataFileName = ".dataprotection-container.plist"
    /// The start of the name a share's snapshot is linked by in `ROOT/Containers` for a moment,
    /// to be opened through the protected file system (in no sandbox; one left by a killed
    /// supervisor is removed when the file system next starts).
    public static let servedSnapshotPrefix = ".dataprotection-snapshot-"

    /// `ROOT/Containers`.
    public var containers: String { path(Self.containersEntry) }
    /// The lock serializing installs and uninstalls.
    var containersLock: String { containers + "/.lock" }
    /// `ROOT/Containers/Data/Application`.
    public var applications: String { containers + "/Data/Application" }
    /// `ROOT/Containers/Shared/AppGroup`.
    public var appGroups: String { containers + "/Shared/AppGroup" }

    /// An app's data container.
    public func applicationContainer(_ uuid: UUID) -> String { applications + "/" + uuid.uuidString }
    /// A group's container.
    public func groupContainer(_ uuid: UUID) -> String { appGroups + "/" + uuid.uuidString }

    /// Creates `ROOT/Containers` and its directories (0700) and registers the entry.
    func prepareContainers() throws {
        try register(Self.containersEntry)
        for directory in [containers, containers + "/Data", applications, containers + "/Shared", appGroups] {
            try makeDirectory(directory)
        }
    }
}

/// `mkdir` with mode 0700; an existing directory is fine.
func makeDirectory(_ path: String, mode: mode_t = 0o700) throws {
    do {
        _ = try POSIXFile.call("mkdir", path) { mkdir($0, mode) }
    } catch let error as FileSystemError where error.errno == .fileExists {
        guard POSIXFile.kind(path).isDirectory else { throw ContainerError.fileSystem(error) }
    } catch let error as FileSystemError {
        throw ContainerError.fileSystem(error)
    }
}
