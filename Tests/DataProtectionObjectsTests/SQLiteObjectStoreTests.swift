import DataProtectionSQLite
import DataProtection
@testable import DataProtectionObjects
import DataProtectionTestSupport
import Foundation
import GRDB
import Testing

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// Runs real SQLCipher 4 (Tests/oracle/sqlcipher_oracle.py, PyPI sqlcipher3-binary) on a store file.
func sqlcipher(_ db: String, rawKey: String, _ sql: String...) throws -> [[Any]] {
    let python = ProcessInfo.processInfo.environment["DP_PYTHON"] ?? packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
    let process = Process()
    process.executableURL = URL(fileURLWithPath: python)
    process.arguments = [packageRoot.appendingPathComponent("Tests/oracle/sqlcipher_oracle.py").path, db, "raw:" + rawKey] + sql
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    let errors = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    if process.terminationStatus != 0 { Issue.record("SQLCipher failed: \(errors)") }
    return String(decoding: data, as: UTF8.self).split(separator: "\n")
        .compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [Any] }
}

extension Entity {
    /// An ID of this entity (tests build IDs the way a store does).
    func entity(_ model: ObjectModel, key: Int64) -> ObjectID { ObjectID(entity: self, primaryKey: key) }
}

@Suite struct SQLiteObjectStoreTests {
    @Test func faultsAreLazyCountedInStatements() async throws {
        let fixture = try await Fixture.make(.encryptedSQLite, model: try chatModel())
        try seedChat(ObjectContext(store: fixture.store))
        let context = ObjectContext(store: fixture.store)
        fixture.statements.reset()
        var descriptor = FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)])
        descriptor.includesPropertyValues = false
        let messages = try context.fetch(descriptor)
        #expect(messages.count == 10)
        #expect(fixture.statements.value == 1, "one SELECT of keys: \(fixture.statements.all)")
        #expect(messages.allSatisfy { $0.managedObject.isFault })
        // The first attribute read fires the fault — with its neighbours, in one statement.
        #expect(messages[0].text == "Hello team")
        #expect(fixture.statements.value == 2)
        #expect(messages.map(\.text).count == 10 && fixture.statements.value == 2)
        #expect(!messages[9].managedObject.isFault)
        // A to-one is a key: reading it gives a fault, not a query.
        let conversation = try #require(messages[0].conversation)
        #expect(conversation.managedObject.isFault && fixture.statements.value == 2)
        #expect(conversation.title == "Team" && fixture.statements.value == 3)
        // A to-many loads when first read, once.
        let attachments = messages[2].attachments
        #expect(attachments.count == 2 && fixture.statements.value == 4)
        #expect(messages[2].attachments.count == 2 && fixture.statements.value == 4)
        // Fetching with values (the default) fills the objects: firing costs nothing more.
        fixture.statements.reset()
        let filled = try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>())
        #expect(filled.map(\.name).sorted() == ["Alice", "Carol Ünicode", "bob"] && fixture.statements.value == 1)
    }

    @Test func tablesFollowTheModelAndRealSQLCipherReadsThem() async throws {
        let fixture = try await Fixture.make(.encryptedSQLite, model: try chatModel())
        try seedChat(ObjectContext(store: fixture.store))
        let store = try #require(fixture.store as? SQLiteObjectStore)
        let key = try await store.protectedDatabase!.rawKeyHex()
        try await store.close()
        let tables = try sqlcipher(store.path, rawKey: key, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .map { $0[0] as! String }
        #expect(tables == ["Account", "Attachment", "Conversation", "Message", "Profile", "Z_Account_conversations", "Z_METADATA", "Z_PRIMARYKEY"])
        let indexes = Set(try sqlcipher(store.path, rawKey: key, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'Message'")
            .map { $0[0] as! String })
        #expect(indexes.isSuperset(of: ["Z_Message_sentAt", "Z_Message_conversation_sentAt", "Z_Message_conversation", "Z_Message_sender"]))
        // Keys start at 1; to-one are key columns; many-to-many pairs are rows.
        let rows = try sqlcipher(store.path, rawKey: key,
                                 "SELECT m.Z_PK, m.text, c.title FROM Message m JOIN Conversation c ON c.Z_PK = m.conversation ORDER BY m.Z_PK LIMIT 2",
                                 "SELECT count(*) FROM Z_Account_conversations", "PRAGMA cipher_integrity_check")
        #expect(rows.count == 3)
        #expect(rows[0][0] as? Int == 1 && rows[0][1] as? String == "Hello team" && rows[0][2] as? String == "Team")
        #expect(rows[2][0] as? Int == 5)
    }

    static func storeURL(_ device: TestDevice) -> URL { device.dir.appendingPathComponent("migrating.sqlite") }

    @Test func lightweightMigrationAddsAndRefusesWhatItCannotDo() async throws {
        let device = try await TestDevice.make()
        let url = Self.storeURL(device)
        let v1 = try ObjectModel([
            EntityDescription("Note", attributes: [AttributeDescription("text", .string)]),
        ])
        var store = try await SQLiteObjectStore.open(at: url, keybag: device.keybag, protection: .complete, model: v1)
        var context = ObjectContext(store: store)
        for text in ["one", "two"] { try context.create("Note").setValue(.string(text), forKey: "text") }
        try context.save()
        let identifier = try store.loadMetadata().storeIdentifier
        try await store.close()

        // v2: a new entity, a new optional attribute, a new defaulted one, a new index, a new relationship.
        let v2 = try ObjectModel([
            EntityDescription("Note", attributes: [AttributeDescription("text", .string, indexed: true),
                                                   AttributeDescription("pinned", .boolean, default: .boolean(false)),
                                                   AttributeDescription("color", .string, optional: true)],
                              relationships: [RelationshipDescription("tags", to: "Tag", inverse: "notes", toMany: true)]),
            EntityDescription("Tag", attributes: [AttributeDescription("name", .string)],
                              relationships: [RelationshipDescription("notes", to: "Note", inverse: "tags", toMany: true)]),
        ])
        store = try await SQLiteObjectStore.open(at: url, keybag: device.keybag, model: v2)
        #expect(try store.loadMetadata().storeIdentifier == identifier)
        #expect(try store.loadMetadata().modelVersionHash == v2.versionHash)
        context = ObjectContext(store: store)
        let notes = try context.fetch(FetchRequest(entityName: "Note", sortKeys: [SortKey("text", ascending: false)]))
        #expect(try notes.map { try $0.value(forKey: "text") } == [.string("two"), .string("one")])
        #expect(try notes.map { try $0.value(forKey: "pinned") } == [.boolean(false), .boolean(false)])
        #expect(try notes[0].value(forKey: "color") == .null)
        let tag = try context.create("Tag")
        try tag.setValue(.string("work"), forKey: "name")
        try tag.add(notes[0], toKey: "notes")
        try context.save()
        let indexNames = try await store.writer.read { try String.fetchAll($0, sql: "SELECT name FROM sqlite_master WHERE type = 'index'") }
        #expect(indexNames.contains("Z_Note_text"))
        try await store.close()

        // Changes that would lose data or leave rows invalid are refused, and change nothing.
        let refused: [(ObjectModel, String)] = [
            (try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("text", .string)])]), "was removed"),
            (try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("text", .integer64), AttributeDescription("pinned", .boolean, default: .boolean(false)), AttributeDescription("color", .string, optional: true)], relationships: [RelationshipDescription("tags", to: "Tag", inverse: "notes", toMany: true)]),
                              EntityDescription("Tag", attributes: [AttributeDescription("name", .string)], relationships: [RelationshipDescription("notes", to: "Note", inverse: "tags", toMany: true)])]),
             "changed type"),
            (try ObjectModel([EntityDescription("Note", attributes: [AttributeDescription("text", .string), AttributeDescription("pinned", .boolean, default: .boolean(false)), AttributeDescription("color", .string, optional: true), AttributeDescription("due", .date)], relationships: [RelationshipDescription("tags", to: "Tag", inverse: "notes", toMany: true)]),
                              EntityDescription("Tag", attributes: [AttributeDescription("name", .string)], relationships: [RelationshipDescription("notes", to: "Note", inverse: "tags", toMany: true)])]),
             "required and has no default"),
        ]
        for (model, reason) in refused {
            await #expect {
                _ = try await SQLiteObjectStore.open(at: url, keybag: device.keybag, model: model)
            } throws: { error in
                guard case ObjectGraphError.incompatibleModel(let path, let why) = error else { return false }
                return path == url.path && why.contains(reason)
            }
        }
        store = try await SQLiteObjectStore.open(at: url, keybag: device.keybag, model: v2)
        context = ObjectContext(store: store)
        #expect(try context.count(FetchRequest(entityName: "Note")) == 2)
        #expect(try context.fetch(FetchRequest(entityName: "Tag")).first?.objects(forKey: "notes").count == 1)
    }

    @Test func aClassAStoreFollowsTheLock() async throws {
        let fixture = try await Fixture.make(.encryptedSQLite, model: try chatModel(), protection: .complete)
        let device = try #require(fixture.device)
        let store = try #require(fixture.store as? SQLiteObjectStore)
        let context = ObjectContext(store: store)
        let (_, _, messages) = try seedChat(context)
        let other = ObjectContext(store: store)
        var lazily = FetchDescriptor<Message>()
        lazily.includesPropertyValues = false
        let faults = try other.fetch(lazily)

        await device.lockPastGrace()
        func isUnavailable(_ error: any Error) -> Bool {
            if case ProtectedFileError.unavailable(_, .complete, .locked, _) = error { return true }
            return false
        }
        // Fetches and saves fail with the typed error of files.
        #expect(throws: (any Error).self) { try context.fetch(FetchDescriptor<Account>()) }
        do { _ = try context.fetch(FetchDescriptor<Account>()) } catch { #expect(isUnavailable(error)) }
        messages[0].text = "changed while locked"
        do { try context.save(); Issue.record("saved while locked") } catch { #expect(isUnavailable(error)) }
        // A fault cannot fire: the getter gives a placeholder, the error is kept, a setter's
        // failure blocks the next save.
        #expect(faults[0].text == "")
        #expect(other.lastFaultError.map(isUnavailable) == true)
        faults[1].isRead = true
        do { try other.save(); Issue.record("saved a placeholder") } catch { #expect(isUnavailable(error)) }
        other.rollback()

        // Unlock: the same store and contexts work again, without reopening.
        try await device.keybag.unlock(passcode: "123456")
        try await store.restoreAccess()
        try context.save()
        #expect(faults[0].text == "changed while locked")
        #expect(try ObjectContext(store: store).fetchCount(FetchDescriptor<Message>()) == 10)
    }

    @Test func idsFromAnotherModelInstanceWorkAndForeignOnesAreRefused() async throws {
        let fixture = try await Fixture.make(.encryptedSQLite, model: try chatModel())
        let (_, _, messages) = try seedChat(ObjectContext(store: fixture.store))
        // The same model built again (as a second launch or another module would): IDs carry over by name.
        let again = try ObjectModel(types: chatTypes)
        let id = try #require(again.entitiesByName["Message"]).entity(again, key: messages[0].persistentModelID.primaryKey)
        let context = ObjectContext(store: fixture.store)
        #expect(context.model(for: id, as: Message.self).text == "Hello team")
        // An entity this store does not have: a clear error, not a crash.
        let foreign = try inheritanceModel()
        let folder = try #require(foreign.entitiesByName["Folder"]).entity(foreign, key: 1)
        #expect(throws: ObjectGraphError.unknownEntity("Folder (an entity of another model than this store's)")) {
            try context.existingObject(with: folder)
        }
    }

    @Test func aDamagedOrForeignStoreIsAClearError() async throws {
        let dir = temporaryDirectory()
        let path = dir.appendingPathComponent("plain.sqlite").path
        let queue = try DatabaseQueue(path: path)
        try await queue.write { try $0.execute(sql: "CREATE TABLE Z_METADATA (Z_KEY TEXT PRIMARY KEY, Z_VALUE BLOB NOT NULL); INSERT INTO Z_METADATA VALUES ('junk', x'00')") }
        try queue.close()
        #expect(throws: ObjectGraphError.damagedStore(store: path, detail: "metadata without a store identifier")) {
            _ = try SQLiteObjectStore(path: path, model: try chatModel())
        }
        // A plain (unencrypted) store works too, for data that needs no protection.
        let plain = try SQLiteObjectStore(path: dir.appendingPathComponent("cache.sqlite").path, model: try chatModel())
        let context = ObjectContext(store: plain)
        try seedChat(context)
        #expect(try ObjectContext(store: plain).fetchCount(FetchDescriptor<Message>()) == 10)
    }
}
