import DataProtectionObjects
import Foundation

// A chat app's model, written as typed classes.

@Model final class Account {
    var name: String
    var email: String?
    var joined: Date = Date(timeIntervalSinceReferenceDate: 0)
    var balance: Decimal?
    var avatar: Data?
    var uuid: UUID = UUID()
    var homepage: URL?
    var age: Int16 = 0
    var rating: Double = 0
    var isActive: Bool = true
    var karma: Int32 = 0
    var posts: Int64 = 0
    @Relationship(deleteRule: .deny, inverse: \Message.sender) var sentMessages: [Message] = []
    @Relationship(inverse: \Conversation.participants) var conversations: [Conversation] = []
    @Relationship(inverse: \Profile.account) var profile: Profile?

    init(name: String, email: String? = nil) {
        self.name = name
        self.email = email
    }
}

@Model final class Profile {
    var bio: String = ""
    var account: Account?
    init(bio: String) { self.bio = bio }
}

@Model final class Conversation {
    var title: String
    var createdAt: Date = Date(timeIntervalSinceReferenceDate: 0)
    @Relationship(deleteRule: .cascade, inverse: \Message.conversation) var messages: [Message] = []
    var participants: [Account] = []

    init(title: String) { self.title = title }
}

@Model final class Message {
    var text: String
    @Attribute(.indexed) var sentAt: Date
    var isRead: Bool = false
    var conversation: Conversation?
    var sender: Account?
    @Relationship(deleteRule: .cascade, inverse: \Attachment.message) var attachments: [Attachment] = []

    #Index<Message>([\.conversation, \.sentAt])

    init(text: String, sentAt: Date) {
        self.text = text
        self.sentAt = sentAt
    }
}

@Model final class Attachment {
    var name: String
    var size: Int = 0
    var message: Message?
    init(name: String, size: Int) {
        self.name = name
        self.size = size
    }
}

var chatTypes: [any PersistentModel.Type] { [Account.self, Profile.self, Conversation.self, Message.self, Attachment.self] }

/// An untyped model with sub-entities: Item ← Document ← Spreadsheet, Item ← Photo; all kept in Item's table.
func inheritanceModel() throws -> ObjectModel {
    try ObjectModel([
        EntityDescription("Folder", attributes: [AttributeDescription("name", .string)],
                          relationships: [RelationshipDescription("items", to: "Item", inverse: "folder", toMany: true, deleteRule: .cascade)]),
        EntityDescription("Item", abstract: true, attributes: [AttributeDescription("title", .string), AttributeDescription("size", .integer64, default: .integer(0))],
                          relationships: [RelationshipDescription("folder", to: "Folder", inverse: "items")]),
        EntityDescription("Document", parent: "Item", attributes: [AttributeDescription("pages", .integer32, default: .integer(1))]),
        EntityDescription("Spreadsheet", parent: "Document", attributes: [AttributeDescription("sheets", .integer16, default: .integer(1))]),
        EntityDescription("Photo", parent: "Item", attributes: [AttributeDescription("width", .integer32, optional: true)],
                          indexes: [IndexDescription(["width"])]),
    ])
}

// Typed sub-entities: a class hierarchy of models, kept in the root's table.

@Model class Shape {
    var label: String
    var sides: Int = 0
    init(label: String) { self.label = label }
}

@Model final class Square: Shape {
    var edge: Double
    init(label: String, edge: Double) {
        super.init(label: label)   // a subclass's properties live in the backing: set them after super.init
        self.edge = edge
        sides = 4
    }
}

@Model final class Circle: Shape {
    var radius: Double
    init(label: String, radius: Double) {
        super.init(label: label)
        self.radius = radius
    }
}
