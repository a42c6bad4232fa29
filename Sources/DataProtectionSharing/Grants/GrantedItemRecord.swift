import DataProtectionContainers
import Foundation

/// What a recipient is told of a grant made to it (`list`, FORMAT.md §11.5): not the containers'
/// UUIDs or the inode, which are the broker's business.
struct GrantedItemRecord: Codable, Sendable {
    var id: UUID
    var provider: String
    /// Where the item is (a path the recipient cannot open itself: access goes through the broker).
    var location: String
    var capabilities: UInt8
    var expires: Date?
    var persistent: Bool

    init(_ grant: Grant, provider: AppContainer) {
        id = grant.id
        self.provider = grant.provider
        location = provider.url.appendingPathComponent(grant.path).path
        capabilities = grant.capabilities.rawValue
        expires = grant.expires
        persistent = grant.persistent
    }

    enum CodingKeys: String, CodingKey {
        case id = "ID", provider = "Provider", location = "Location", capabilities = "Capabilities", expires =
            "Expires", persistent = "Persistent"
    }
}
