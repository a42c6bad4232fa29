import DataProtectionObjects
import Foundation
import Testing

/// The vectors of docs/FORMAT.md §9, computed independently (Python's hashlib and json).
@Suite struct ObjectStoreFormatVectorTests {
    @Test func entityCodesAndModelHash() throws {
        let model = try ObjectModel([
            EntityDescription("Note", attributes: [AttributeDescription("text", .string)]),
        ])
        #expect(model.versionHash == "a46436f9dd906336a8226f6137e88afe7ee1cc1419b8a1918f2bdfb8ed380768")
        let chat = try ObjectModel(types: chatTypes)
        #expect(try chat.entity(named: "Message").code == 796_354_186)
        #expect(try chat.entity(named: "Conversation").code == 1_288_312_855)
        let items = try inheritanceModel()
        #expect(try items.entity(named: "Item").code == 1_697_369_146)
        #expect(try items.entity(named: "Document").code == 1_455_262_730)
        // A default's value is not part of the hash (only that there is one), so a default of
        // Date() does not change the model on every launch.
        let a = try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("at", .date, default: .date(Date(timeIntervalSince1970: 0)))])])
        let b = try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("at", .date, default: .date(Date()))])])
        #expect(a.versionHash == b.versionHash)
    }

    @Test func invalidModelsAreRefusedWithTheReason() throws {
        #expect(throws: ObjectGraphError.invalidModel("Note.book points to unknown entity Book")) {
            try ObjectModel([EntityDescription("Note", relationships: [RelationshipDescription("book", to: "Book")])])
        }
        #expect(throws: ObjectGraphError.invalidModel("entity Note is declared twice")) {
            try ObjectModel([EntityDescription("Note"), EntityDescription("Note")])
        }
        #expect(throws: ObjectGraphError.invalidModel("Z_PK is not a valid entity name")) {
            try ObjectModel([EntityDescription("Z_PK")])
        }
        #expect(throws: ObjectGraphError.invalidModel("the default of Note.n is not a integer16")) {
            try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("n", .integer16, default: .integer(70_000))])])
        }
    }
}
