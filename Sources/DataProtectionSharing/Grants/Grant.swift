import DataProtectionContainers
import Foundation

/// What a grant lets its recipient do with the item — `NSFileProviderItemCapabilities`'
/// words, but enforced: a grant without `.writing` hands out read-only descriptors, and the
/// broker refuses what is not granted (FORMAT.md §11.5).
public struct GrantCapabilities: OptionSet, Sendable, Hashable, Codable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let reading = GrantCapabilities(rawValue: 1 << 0)
    public static let writing = GrantCapabilities(rawValue: 1 << 1)
    public static let renaming = GrantCapabilities(rawValue: 1 << 2)
    public static let deleting = GrantCapabilities(rawValue: 1 << 3)
    public static let addingSubItems = GrantCapabilities(rawValue: 1 << 4)
    public static let contentEnumerating = GrantCapabilities(rawValue: 1 << 5)

    static let names: [(GrantCapabilities, String)] = [
        (.reading, "read"), (.writing, "write"), (.renaming, "rename"),
        (.deleting, "delete"), (.addingSubItems, "add"), (.contentEnumerating, "enumerate"),
    ]
    public var description: String { Self.names.filter { contains($0.0) }.map(\.1).joined(separator: ",") }
}

/// One grant: an item of a providing app, the app it is granted to, what that app may do with
/// it, and for how long. Kept by the broker outside every container (FORMAT.md §11.5).
public struct Grant: Codable, Sendable, Equatable, Identifiable {
    public var version = 1
    public let id: UUID
    /// The providing app and the container it had when granting (a reinstall does not inherit).
    public let provider: String
    public let providerContainer: UUID
    /// The item: a path relative to the provider's container (`Documents/report.txt`).
    public let path: String
    /// The item's device and inode when granted: a bookmark resolving elsewhere is stale.
    public let device: UInt64
    public let inode: UInt64
    /// The item's birth time (`statx`, "seconds.nanoseconds") and kind when granted. An item
    /// found elsewhere by its inode is the granted one only if both match: a file system reuses
    /// a freed inode number at once, for whatever is made next. Without a birth time (a grant
    /// recorded before these keys existed, a file system that keeps none) a moved item is not followed.
    public var birthTime: String? = nil
    public var isDirectory: Bool? = nil
    public let recipient: String
    public let recipientContainer: UUID
    public let capabilities: GrantCapabilities
    public let created: Date
    /// After this, the grant starts no new access (descriptors handed out stay valid).
    public let expires: Date?
    /// Kept across the recipient's launches; otherwise gone when the recipient's run ends.
    public let persistent: Bool
    /// For a share (crossing 2) read from a snapshot: the snapshot's name in
    /// `ROOT/Sharing/Snapshots`, which the recipient reads instead of the item.
    public var snapshot: String? = nil
    /// Whether this is a share (crossing 2: read-only, ended by the recipient or its exit).
    public var isShare: Bool = false
    /// Whether the user made it through the provider's document browser (`true`), or the
    /// provider itself (`false`); `nil` for a grant recorded before this was kept. A grant the
    /// user made starts no access once the provider stops exposing its Documents.
    public var byUser: Bool? = nil

    public func isExpired(at now: Date) -> Bool { expires.map { now >= $0 } ?? false }

    /// The same grant for the item renamed to `path`.
    func moved(to path: String) -> Grant {
        var moved = Grant(
            id: id, provider: provider, providerContainer: providerContainer, path: path, device: device, inode: inode,
            recipient: recipient,
            recipientContainer: recipientContainer, capabilities: capabilities, created: created, expires: expires,
            persistent: persistent,
            snapshot: snapshot, isShare: isShare)
        (moved.version, moved.birthTime, moved.isDirectory, moved.byUser) = (version, birthTime, isDirectory, byUser)
        return moved
    }

    enum CodingKeys: String, CodingKey {
        case version = "Version", id = "ID", provider = "Provider", providerContainer = "ProviderContainer", path =
            "Path",
            device = "Device", inode = "Inode", recipient = "Recipient", recipientContainer = "RecipientContainer",
            capabilities = "Capabilities", created = "Created", expires = "Expires", persistent = "Persistent",
            snapshot = "Snapshot", isShare = "Share", birthTime = "BirthTime", isDirectory = "Directory", byUser =
            "ByUser"
    }

    public init(
        id: UUID, provider: String, providerContainer: UUID, path: String, device: UInt64, inode: UInt64,
        recipient: String,
        recipientContainer: UUID, capabilities: GrantCapabilities, created: Date, expires: Date?, persistent: Bool,
        snapshot: String? = nil, isShare: Bool = false
    ) {
        (self.id, self.provider, self.providerContainer, self.path, self.device, self.inode) = (
            id, provider, providerContainer, path, device, inode
        )
        (self.recipient, self.recipientContainer, self.capabilities, self.created, self.expires, self.persistent) =
            (recipient, recipientContainer, capabilities, created, expires, persistent)
        (self.snapshot, self.isShare) = (snapshot, isShare)
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        version = try c.decode(Int.self, forKey: .version)
        id = try c.decode(UUID.self, forKey: .id)
        provider = try c.decode(String.self, forKey: .provider)
        providerContainer = try c.decode(UUID.self, forKey: .providerContainer)
        path = try c.decode(String.self, forKey: .path)
        device = try c.decode(UInt64.self, forKey: .device)
        inode = try c.decode(UInt64.self, forKey: .inode)
        recipient = try c.decode(String.self, forKey: .recipient)
        recipientContainer = try c.decode(UUID.self, forKey: .recipientContainer)
        capabilities = try c.decode(GrantCapabilities.self, forKey: .capabilities)
        created = try c.decode(Date.self, forKey: .created)
        expires = try c.decodeIfPresent(Date.self, forKey: .expires)
        persistent = try c.decode(Bool.self, forKey: .persistent)
        snapshot = try c.decodeIfPresent(String.self, forKey: .snapshot)
        isShare = try c.decodeIfPresent(Bool.self, forKey: .isShare) ?? false
        birthTime = try c.decodeIfPresent(String.self, forKey: .birthTime)
        isDirectory = try c.decodeIfPresent(Bool.self, forKey: .isDirectory)
        byUser = try c.decodeIfPresent(Bool.self, forKey: .byUser)
    }
}
