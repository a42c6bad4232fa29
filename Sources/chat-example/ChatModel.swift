import DataProtectionObjects
import Foundation

// The model of a chat app, as typed classes: what an iOS app would write for SwiftData.

@Model final class Account {
    var name: String
    var handle: String
    var joined: Date = Date()
    @Relationship(deleteRule: .deny, inverse: \Message.sender) var sentMessages: [Message] = []
    @Relationship(inverse: \Conversation.members) var conversations: [Conversation] = []

    init(name: String, handle: String) {
        self.name = name
        self.handle = handle
    }
}

@Model final class Conversation {
    var title: String
    var isMuted: Bool = false
    var members: [Account] = []
    @Relationship(deleteRule: .cascade, inverse: \Message.conversation) var messages: [Message] = []

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
    var fileName: String
    var byteCount: Int
    var contents: Data?
    var message: Message?

    init(fileName: String, contents: Data) {
        self.fileName = fileName
        self.byteCount = contents.count
        self.contents = contents
    }
}
