import DataProtectionObjects
import Foundation
import Testing

/// One suite, run on both stores: every expectation is a literal, so passing on both means
/// both give identical results.
@Suite struct SharedStoreSuite {
    @Test(arguments: StoreKind.allCases)
    func everyAttributeTypeRoundTrips(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let uuid = UUID()
        let account = Account(name: "Zoë", email: "z@example.org")
        account.joined = day(3)
        account.balance = Decimal(string: "1234567890.123456789")
        account.avatar = Data([0, 1, 2, 255])
        account.uuid = uuid
        account.homepage = URL(string: "https://example.org/zoë?q=1")
        account.age = Int16.max
        account.karma = Int32.min
        account.posts = Int64.max
        account.rating = -0.125
        account.isActive = false
        context.insert(account)
        try context.save()
        #expect(!account.persistentModelID.isTemporaryID)

        let fresh = ObjectContext(store: fixture.store)
        let read = try #require(try fresh.fetch(FetchDescriptor<Account>()).first)
        #expect(read !== account)
        #expect(read.name == "Zoë" && read.email == "z@example.org" && read.joined == day(3))
        #expect(read.balance == Decimal(string: "1234567890.123456789"))
        #expect(read.avatar == Data([0, 1, 2, 255]) && read.uuid == uuid)
        #expect(read.homepage == URL(string: "https://example.org/zoë?q=1"))
        #expect(read.age == Int16.max && read.karma == Int32.min && read.posts == Int64.max)
        #expect(read.rating == -0.125 && read.isActive == false)
        // nil round-trips too.
        read.email = nil
        read.balance = nil
        try fresh.save()
        let again = try #require(try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>()).first)
        #expect(again.email == nil && again.balance == nil && again.name == "Zoë")
    }

    @Test(arguments: StoreKind.allCases)
    func fourResultTypes(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let seeded = try seedChat(context)
        let reader = ObjectContext(store: fixture.store)
        var descriptor = FetchDescriptor<Message>(predicate: #Predicate { $0.isRead == true }, sortBy: [SortDescriptor(\.sentAt)])
        // Objects.
        #expect(try reader.fetch(descriptor).map(\.text) == ["Hello team", "Report due", "Pizza!", "ok", "HELLO"])
        // Object IDs: the same objects, as IDs.
        let ids = try reader.fetchIdentifiers(descriptor)
        #expect(ids == [0, 2, 4, 6, 8].map { seeded.messages[$0].persistentModelID })
        // Dictionaries of chosen properties, through a to-one too.
        descriptor.fetchLimit = 2
        let rows = try reader.fetchDictionaries(descriptor, properties: ["text", "conversation.title", "sender.age"])
        #expect(rows == [["text": .string("Hello team"), "conversation.title": .string("Team"), "sender.age": .integer(31)],
                         ["text": .string("Report due"), "conversation.title": .string("Team"), "sender.age": .integer(40)]])
        // Count (ignores limit only when none is set).
        #expect(try reader.fetchCount(FetchDescriptor<Message>(predicate: #Predicate { $0.isRead == true })) == 5)
        #expect(try reader.fetchCount(descriptor) == 2)
        #expect(try reader.fetchCount(FetchDescriptor<Attachment>()) == 3)
    }

    @Test(arguments: StoreKind.allCases)
    func predicatesFromFoundationAndBuilders(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        try seedChat(context)
        let reader = ObjectContext(store: fixture.store)
        func texts(_ predicate: Predicate<Message>) throws -> [String] {
            try reader.fetch(FetchDescriptor(predicate: predicate, sortBy: [SortDescriptor(\.sentAt)])).map(\.text)
        }
        func texts(_ condition: ObjectPredicate) throws -> [String] {
            try reader.fetch(FetchDescriptor<Message>(condition: condition, sortKeys: [SortKey("sentAt")])).map(\.text)
        }
        let from = day(2), to = day(4)
        // Comparisons, AND / OR / NOT.
        #expect(try texts(#Predicate { $0.sentAt > from && $0.sentAt <= to }) == ["lunch?", "Pizza!"])
        #expect(try texts(#Predicate { $0.sentAt < from || $0.text == "bye" }) == ["Hello team", "hello again", "bye"])
        #expect(try texts(#Predicate { !($0.sentAt >= from) }) == ["Hello team", "hello again"])
        #expect(try texts(#Predicate { $0.text != "ok" && $0.isRead }) == ["Hello team", "Report due", "Pizza!", "HELLO"])
        // IN and BETWEEN.
        #expect(try texts(#Predicate { ["ok", "bye", "nope"].contains($0.text) }) == ["ok", "bye"])
        #expect(try texts(#Predicate { (from...to).contains($0.sentAt) }) == ["Report due", "lunch?", "Pizza!"])
        #expect(try texts(#Predicate { (from..<to).contains($0.sentAt) }) == ["Report due", "lunch?"])
        #expect(try texts(.between("sentAt", .date(from), .date(to))) == ["Report due", "lunch?", "Pizza!"])
        #expect(try texts(.in("text", [.string("Sushi"), .string("ok")])) == ["Sushi", "ok"])
        // Strings: case-sensitive from #Predicate, case-insensitive and ends-with from the builders.
        #expect(try texts(#Predicate { $0.text.starts(with: "hello") }) == ["hello again"])
        #expect(try texts(#Predicate { $0.text.contains("e") && $0.text.contains("o") }) == ["Hello team", "hello again", "Report due", "See you"])
        #expect(try texts(.string("text", .beginsWith, "HELLO", caseInsensitive: true)) == ["Hello team", "hello again", "HELLO"])
        #expect(try texts(.string("text", .contains, "PI", caseInsensitive: true)) == ["Pizza!"])
        #expect(try texts(.string("text", .endsWith, "!")) == ["Pizza!"])
        #expect(try texts(.string("text", .endsWith, "AGAIN", caseInsensitive: true)) == ["hello again"])
        #expect(try texts(.string("text", .equals, "hello", caseInsensitive: true)) == ["HELLO"])
        // Key paths through to-one relationships.
        #expect(try texts(#Predicate { $0.conversation?.title == "lunch plans" && $0.sender?.name == "bob" }) == ["Pizza!", "See you"])
        #expect(try texts(.compare("sender.age", .greater, .integer(30)) && .compare("conversation.title", .equal, .string("Team")))
                == ["Hello team", "Report due", "HELLO", "bye"])
        #expect(try texts(#Predicate { $0.sender?.email == nil }) == ["hello again", "Pizza!", "See you"])
        // ANY over a to-many relationship.
        let big = 100_000
        #expect(try texts(#Predicate { $0.attachments.contains { $0.size > big } }) == ["Report due"])
        #expect(try texts(.any("attachments", .string("name", .endsWith, ".png"))) == ["Pizza!"])
        #expect(try reader.fetch(FetchDescriptor<Conversation>(predicate: #Predicate { $0.participants.contains { $0.name == "Carol Ünicode" } }))
                .map(\.title) == ["Team"])
        #expect(try reader.fetch(FetchDescriptor<Account>(condition: .any("conversations.messages", .compare("text", .equal, .string("Sushi"))),
                                                          sortKeys: [SortKey("name")])).map(\.name) == ["Alice", "bob"])
        // Comparing a to-one with an object.
        let team = try #require(try reader.fetch(FetchDescriptor<Conversation>(predicate: #Predicate { $0.title == "Team" })).first)
        let teamID = team.persistentModelID
        #expect(reader.objectID(forURIRepresentation: teamID.uriRepresentation) == teamID)
        #expect(try texts(#Predicate { $0.conversation?.persistentModelID == teamID }) == ["Hello team", "hello again", "Report due", "HELLO", "bye"])
        // Decimals compare by value; nil is never greater than anything.
        let ten = Decimal(10)
        #expect(try reader.fetch(FetchDescriptor<Account>(predicate: #Predicate { $0.balance != nil })).map(\.name) == ["Alice"])
        #expect(try reader.fetch(FetchDescriptor<Account>(condition: .compare("balance", .greater, .decimal(ten)))).map(\.name) == ["Alice"])
        #expect(try reader.fetch(FetchDescriptor<Account>(condition: !.compare("balance", .greater, .decimal(ten)))).map(\.name) == [])
        // Unsupported predicates say so.
        #expect(throws: ObjectGraphError.self) { try texts(#Predicate { $0.text.count > 3 }) }
    }

    @Test(arguments: StoreKind.allCases)
    func sortLimitOffset(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        try seedChat(context)
        let reader = ObjectContext(store: fixture.store)
        var descriptor = FetchDescriptor<Message>(condition: nil, sortKeys: [SortKey("isRead"), SortKey("sentAt", ascending: false)])
        descriptor.fetchOffset = 2
        descriptor.fetchLimit = 4
        #expect(try reader.fetch(descriptor).map(\.text) == ["Sushi", "lunch?", "hello again", "HELLO"])
        // Sorting through a to-one, strings by their UTF-8 bytes (uppercase first), nil first.
        let byConversation = FetchDescriptor<Message>(condition: nil, sortKeys: [SortKey("conversation.title", ascending: false), SortKey("text")])
        #expect(try reader.fetch(byConversation).map(\.text).prefix(4) == ["Pizza!", "See you", "Sushi", "lunch?"])
        let accounts = FetchDescriptor<Account>(condition: nil, sortKeys: [SortKey("email"), SortKey("name")])
        #expect(try reader.fetch(accounts).map(\.name) == ["bob", "Alice", "Carol Ünicode"])
    }

    @Test(arguments: StoreKind.allCases)
    func relationshipsKeepTheirInverses(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let (accounts, conversations, messages) = try seedChat(context)
        let (team, lunch) = (conversations[0], conversations[1])
        // One-to-many: moving a message moves it between both sides.
        #expect(team.messages.count == 5 && lunch.messages.count == 5)
        messages[0].conversation = lunch
        #expect(team.messages.count == 4 && lunch.messages.contains { $0 === messages[0] })
        lunch.messages = lunch.messages.filter { $0 !== messages[3] }
        #expect(messages[3].conversation == nil)
        // Many-to-many: both sides.
        #expect(Set(accounts[2].conversations.map(\.title)) == ["Team"])
        lunch.participants.append(accounts[2])
        #expect(Set(accounts[2].conversations.map(\.title)) == ["Team", "lunch plans"])
        accounts[0].conversations = []
        #expect(team.participants.map(\.name) == ["bob", "Carol Ünicode"])
        // One-to-one: a new partner takes the place of the old one.
        let p1 = Profile(bio: "first"), p2 = Profile(bio: "second")
        context.insert(p1)
        context.insert(p2)
        accounts[0].profile = p1
        #expect(p1.account === accounts[0])
        p2.account = accounts[0]
        #expect(accounts[0].profile === p2 && p1.account == nil)
        try context.save()

        // Another context reads the same graph from the store.
        let reader = ObjectContext(store: fixture.store)
        let read = try reader.fetch(FetchDescriptor<Conversation>(sortBy: [SortDescriptor(\.title)]))
        #expect(read.map(\.title) == ["Team", "lunch plans"])
        #expect(read[0].messages.map(\.text) == ["hello again", "Report due", "HELLO", "bye"])
        #expect(read[1].messages.map(\.text) == ["Hello team", "Pizza!", "Sushi", "ok", "See you"])
        #expect(read[0].participants.map(\.name) == ["bob", "Carol Ünicode"])
        #expect(read[1].participants.map(\.name) == ["bob", "Carol Ünicode"])
        let alice = try #require(try reader.fetch(FetchDescriptor<Account>(predicate: #Predicate { $0.name == "Alice" })).first)
        #expect(alice.profile?.bio == "second" && alice.conversations.isEmpty)
        #expect(try reader.fetch(FetchDescriptor<Profile>(predicate: #Predicate { $0.bio == "first" })).first?.account == nil)
    }

    @Test(arguments: StoreKind.allCases)
    func deleteRules(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let (accounts, conversations, _) = try seedChat(context)
        // Deny: an account with sent messages cannot be deleted; nothing changes.
        #expect(throws: ObjectGraphError.deleteDenied(object: accounts[0].persistentModelID.description, relationship: "sentMessages")) {
            try context.delete(accounts[0])
        }
        #expect(!context.hasChanges)
        // Cascade: deleting a conversation deletes its messages and their attachments.
        try context.delete(conversations[0])
        // Nullify: the participants stay, without the conversation.
        #expect(accounts.allSatisfy { !$0.conversations.contains { $0 === conversations[0] } })
        try context.save()
        let reader = ObjectContext(store: fixture.store)
        #expect(try reader.fetchCount(FetchDescriptor<Conversation>()) == 1)
        #expect(try reader.fetchCount(FetchDescriptor<Message>()) == 5)
        #expect(try reader.fetchCount(FetchDescriptor<Attachment>()) == 1)
        #expect(try reader.fetchCount(FetchDescriptor<Account>()) == 3)
        // Carol's Team messages went with Team; once her last one is deleted, she can be.
        let carol = try #require(try reader.fetch(FetchDescriptor<Account>(predicate: #Predicate { $0.age == 40 })).first)
        #expect(carol.sentMessages.map(\.text) == ["Sushi"])
        try reader.delete(carol.sentMessages[0])
        #expect(carol.sentMessages.isEmpty)
        try reader.delete(carol)
        try reader.save()
        let after = ObjectContext(store: fixture.store)   // objects refer to their context weakly, as in CoreData: keep it
        #expect(try after.fetch(FetchDescriptor<Conversation>()).first?.participants.map(\.name) == ["Alice", "bob"])
    }

    @Test(arguments: StoreKind.allCases)
    func requiredValuesAreCheckedAtSave(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try ObjectModel([
            EntityDescription("Note", attributes: [AttributeDescription("text", .string), AttributeDescription("tag", .string, optional: true)],
                              relationships: [RelationshipDescription("book", to: "Book", inverse: "notes", optional: false)]),
            EntityDescription("Book", attributes: [AttributeDescription("title", .string, default: .string("Untitled"))],
                              relationships: [RelationshipDescription("notes", to: "Note", inverse: "book", toMany: true, deleteRule: .cascade)]),
        ]))
        let context = ObjectContext(store: fixture.store)
        let note = try context.create("Note")
        #expect(throws: ObjectGraphError.missingValue(object: note.objectID.description, property: "text")) { try context.save() }
        try note.setValue(.string("hi"), forKey: "text")
        #expect(throws: ObjectGraphError.missingValue(object: note.objectID.description, property: "book")) { try context.save() }
        let book = try context.create("Book")
        #expect(try book.value(forKey: "title") == .string("Untitled"))
        try note.setObject(book, forKey: "book")
        #expect(throws: ObjectGraphError.typeMismatch(entity: "Note", property: "text", expected: "string")) {
            try note.setValue(.integer(1), forKey: "text")
        }
        try context.save()
        #expect(try ObjectContext(store: fixture.store).count(FetchRequest(entityName: "Note")) == 1)
    }

    @Test(arguments: StoreKind.allCases)
    func subEntityFetches(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try inheritanceModel())
        let context = ObjectContext(store: fixture.store)
        let folder = try context.create("Folder")
        try folder.setValue(.string("Work"), forKey: "name")
        for (entity, title) in [("Document", "notes"), ("Spreadsheet", "budget"), ("Photo", "beach"), ("Document", "plan")] {
            let item = try context.create(entity)
            try item.setValue(.string(title), forKey: "title")
            try item.setObject(folder, forKey: "folder")
        }
        #expect(throws: ObjectGraphError.invalidModel("Item is abstract")) { try context.create("Item") }
        try context.save()
        let reader = ObjectContext(store: fixture.store)
        func titles(_ entity: String, subentities: Bool = true, _ predicate: ObjectPredicate? = nil) throws -> [String] {
            var request = FetchRequest(entityName: entity, predicate: predicate, sortKeys: [SortKey("title")])
            request.includesSubentities = subentities
            return try reader.fetch(request).map { try $0.value(forKey: "title").description }
        }
        #expect(try titles("Item") == ["\"beach\"", "\"budget\"", "\"notes\"", "\"plan\""])
        #expect(try titles("Document") == ["\"budget\"", "\"notes\"", "\"plan\""])
        #expect(try titles("Document", subentities: false) == ["\"notes\"", "\"plan\""])
        #expect(try titles("Spreadsheet") == ["\"budget\""])
        #expect(try titles("Item", .compare("size", .equal, .integer(0)) && .string("title", .beginsWith, "b")) == ["\"beach\"", "\"budget\""])
        // Each object comes back as its own entity, with its own attributes.
        let items = try reader.fetch(FetchRequest(entityName: "Item", sortKeys: [SortKey("title")]))
        #expect(items.map(\.objectID.entity.name) == ["Photo", "Spreadsheet", "Document", "Document"])
        #expect(try items[1].value(forKey: "sheets") == .integer(1) && items[1].value(forKey: "pages") == .integer(1))
        #expect(try items[0].value(forKey: "width") == .null)
        // As faults (keys only, batched or not), each still knows its entity.
        var lazily = FetchRequest(entityName: "Item")
        lazily.includesPropertyValues = false
        let faults = try ObjectContext(store: fixture.store).fetch(lazily)
        #expect(faults.map(\.objectID.entity.name) == ["Document", "Spreadsheet", "Photo", "Document"])
        let batched = try reader.fetch(FetchRequest(entityName: "Document"), batchSize: 2)
        #expect(try batched.map { try $0.value(forKey: "title") } == [.string("notes"), .string("budget"), .string("plan")])
        #expect(batched.map(\.objectID.entity.name) == ["Document", "Spreadsheet", "Document"])
        // A to-many to the parent entity holds every kind; a cascade reaches them all.
        let readFolder = try #require(try reader.fetch(FetchRequest(entityName: "Folder")).first)
        #expect(try readFolder.objects(forKey: "items").map(\.objectID.entity.name) == ["Document", "Spreadsheet", "Photo", "Document"])
        try reader.delete(readFolder)
        try reader.save()
        #expect(try ObjectContext(store: fixture.store).count(FetchRequest(entityName: "Item")) == 0)
    }

    @Test(arguments: StoreKind.allCases)
    func unsavedChangesCountInFetchesAndRollbackUndoesThem(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let (accounts, _, messages) = try seedChat(context)
        let extra = Message(text: "a new one", sentAt: day(100))
        context.insert(extra)
        try context.delete(messages[9])
        accounts[1].name = "Bob"
        let all = FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt, order: .reverse)])
        #expect(try context.fetch(all).prefix(2).map(\.text) == ["a new one", "HELLO"])
        #expect(try context.fetchCount(all) == 10)
        #expect(context.hasChanges)
        context.rollback()
        #expect(!context.hasChanges && accounts[1].name == "bob")
        #expect(try context.fetch(all).prefix(2).map(\.text) == ["bye", "HELLO"])
        #expect(messages[9].text == "bye" && !messages[9].isDeleted)
    }

    @Test(arguments: StoreKind.allCases)
    func permanentKeysAreMaxPlusOneAndNeverZero(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let first = ObjectContext(store: fixture.store), second = ObjectContext(store: fixture.store)
        let a = Account(name: "a"), b = Account(name: "b"), c = Account(name: "c")
        first.insert(a)
        second.insert(b)
        #expect(a.persistentModelID.isTemporaryID)
        try first.obtainPermanentIDs(for: [a.managedObject])
        try second.save()
        first.insert(c)
        try first.save()
        #expect([a, b, c].map(\.persistentModelID.primaryKey) == [1, 2, 3])
        #expect(a.persistentModelID.uriRepresentation.absoluteString == "x-dataprotection:///Account/p1")
    }

    @Test(arguments: StoreKind.allCases)
    func twoContextsConflictAndMergePolicies(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let setup = ObjectContext(store: fixture.store)
        let account = Account(name: "Dana", email: "d@example.org")
        account.age = 20
        setup.insert(account)
        try setup.save()
        func twoEdits(_ policy: MergePolicy) throws -> (ObjectContext, Account) {
            let one = ObjectContext(store: fixture.store), two = ObjectContext(store: fixture.store)
            let a1 = try #require(try one.fetch(FetchDescriptor<Account>()).first)
            let a2 = try #require(try two.fetch(FetchDescriptor<Account>()).first)
            a1.age += 1
            a1.email = "one@example.org"
            try one.save()
            a2.name = "Dana (two)"
            a2.email = "two@example.org"
            two.mergePolicy = policy
            return (two, a2)
        }
        var (two, a2) = try twoEdits(.error)
        #expect(throws: ObjectGraphError.conflict(objects: [a2.persistentModelID.description])) { try two.save() }
        (two, a2) = try twoEdits(.mergeByPropertyObjectTrump)
        try two.save()
        var stored = try #require(try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>()).first)
        #expect(stored.name == "Dana (two)" && stored.email == "two@example.org" && stored.age == 22)
        (two, a2) = try twoEdits(.mergeByPropertyStoreTrump)
        try two.save()
        stored = try #require(try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>()).first)
        #expect(stored.name == "Dana (two)" && stored.email == "one@example.org" && stored.age == 23)
        (two, a2) = try twoEdits(.rollback)
        try two.save()
        stored = try #require(try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>()).first)
        #expect(stored.email == "one@example.org" && stored.age == 24 && a2.email == "one@example.org")
        (two, a2) = try twoEdits(.overwrite)
        try two.save()
        stored = try #require(try ObjectContext(store: fixture.store).fetch(FetchDescriptor<Account>()).first)
        #expect(stored.email == "two@example.org" && stored.age == 24)
    }
}

@Suite struct SharedStoreSuiteMore {
    @Test(arguments: StoreKind.allCases)
    func batchedFaultsLoadInAnyOrderAroundDeletedRowsAndLocalObjects(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        try seedChat(ObjectContext(store: fixture.store))
        let context = ObjectContext(store: fixture.store)
        // Newest first (keys descending), batches of 4: the rows come back in key order.
        let messages = try context.fetch(FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt, order: .reverse)]), batchSize: 4)
        // One of the first batch deleted by another context, one already loaded and changed here.
        let other = ObjectContext(store: fixture.store)
        let doomed = try #require(try other.fetch(FetchDescriptor<Message>()).first { $0.text == "See you" })
        try other.delete(doomed)
        try other.save()
        let changed = context.model(for: messages.objectIDs[1], as: Message.self)
        changed.text = "changed here"
        #expect(messages[0].text == "bye" && !messages[3].managedObject.isFault)
        #expect(messages[1] === changed && messages[1].text == "changed here")
        #expect(messages[3].text == "ok" && messages[8].text == "hello again" && messages[9].text == "Hello team")
        #expect(messages[2].managedObject.isFault && messages[2].text == "")
        #expect(context.lastFaultError as? ObjectGraphError == .objectDeleted(messages.objectIDs[2].description))
    }

    @Test(arguments: StoreKind.allCases)
    func temporaryIDsNameOneObjectAndEarlyKeysReachEveryReference(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store), other = ObjectContext(store: fixture.store)
        let conversation = Conversation(title: "team")
        context.insert(conversation)
        let first = Message(text: "one", sentAt: day(1)), second = Message(text: "two", sentAt: day(2))
        first.conversation = conversation
        second.conversation = conversation
        let stranger = Account(name: "s")
        other.insert(stranger)
        let temporary: [ObjectID] = [conversation.persistentModelID, first.persistentModelID, second.persistentModelID,
                                     stranger.persistentModelID]
        #expect(temporary.allSatisfy { $0.isTemporaryID } && Set(temporary.map { $0.primaryKey }).count == 4)
        // A temporary ID, through its URI too, names its object in its own context only, and
        // only under its own entity.
        let uri = first.persistentModelID.uriRepresentation
        #expect(context.object(with: try #require(context.objectID(forURIRepresentation: uri))) === first.managedObject)
        #expect(other.object(with: first.persistentModelID) !== first.managedObject)
        let forged = try #require(URL(string: uri.absoluteString.replacingOccurrences(of: "/Message/", with: "/Account/")))
        #expect(context.object(with: try #require(context.objectID(forURIRepresentation: forged))) !== first.managedObject)

        // A key obtained early for one object reaches the references other unsaved objects hold.
        try context.obtainPermanentIDs(for: [conversation.managedObject])
        #expect(!conversation.persistentModelID.isTemporaryID && first.persistentModelID.isTemporaryID)
        #expect(first.conversation === conversation && second.conversation === conversation)
        #expect(conversation.messages.map(\.text) == ["one", "two"])

        // An inserted object deleted after it got its key leaves the context: a rollback does
        // not bring it back, a save writes nothing of it.
        let third = Message(text: "three", sentAt: day(3))
        third.conversation = conversation
        try context.obtainPermanentIDs(for: [third.managedObject])
        try context.delete(third)
        #expect(third.modelContext == nil && conversation.messages.map(\.text) == ["one", "two"])
        #expect(!context.registeredObjects.contains { $0 === third.managedObject })
        try context.save()
        #expect(!context.hasChanges)
        let gone = Message(text: "gone", sentAt: day(4))
        gone.conversation = conversation
        try context.obtainPermanentIDs(for: [gone.managedObject])
        try context.delete(gone)
        context.rollback()
        #expect(!context.hasChanges && !context.registeredObjects.contains { $0 === gone.managedObject })

        let fresh = ObjectContext(store: fixture.store)
        let saved = try fresh.fetch(FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)]))
        #expect(saved.map(\.text) == ["one", "two"] && saved.map { $0.conversation?.title } == ["team", "team"])
        #expect(try fresh.fetchCount(FetchDescriptor<Conversation>()) == 1)

        // Later inserts, after a save or a rollback, never get a temporary ID used before.
        let fourth = Message(text: "four", sentAt: day(5))
        context.insert(fourth)
        context.rollback()
        let fifth = Message(text: "five", sentAt: day(6))
        context.insert(fifth)
        let used = Set(temporary.map { $0.primaryKey } + [fourth.persistentModelID.primaryKey])
        #expect(fifth.persistentModelID.isTemporaryID && !used.contains(fifth.persistentModelID.primaryKey))
        #expect(context.insertedObjects.count == 1 && context.insertedObjects[0] === fifth.managedObject)
    }

    @Test(arguments: StoreKind.allCases)
    func oneObjectPerIDPerContext(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try chatModel())
        let context = ObjectContext(store: fixture.store)
        let (accounts, conversations, messages) = try seedChat(context)
        #expect(try context.fetch(FetchDescriptor<Account>(sortBy: [SortDescriptor(\.name)]))[0] === accounts[0])
        #expect(messages[0].conversation === conversations[0])
        #expect(context.model(for: messages[1].persistentModelID, as: Message.self) === messages[1])
        let other = ObjectContext(store: fixture.store)
        let a = try other.fetch(FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)]))
        let b = try other.fetch(FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)]))
        #expect(zip(a, b).allSatisfy { $0 === $1 } && a[0] !== messages[0])
        #expect(a[0].conversation === b[1].conversation)
        // An unknown property is an error, never a crash.
        #expect(throws: ObjectGraphError.unknownProperty(entity: "Message", property: "nope")) {
            try other.fetch(FetchDescriptor<Message>(condition: .compare("nope", .equal, .integer(1))))
        }
    }

    @Test(arguments: StoreKind.allCases)
    func relationshipsWithoutInverse(kind: StoreKind) async throws {
        let fixture = try await Fixture.make(kind, model: try ObjectModel([
            EntityDescription("Playlist", attributes: [AttributeDescription("name", .string)],
                              relationships: [RelationshipDescription("songs", to: "Song", toMany: true),
                                              RelationshipDescription("cover", to: "Song")]),
            EntityDescription("Song", attributes: [AttributeDescription("title", .string)]),
        ]))
        let context = ObjectContext(store: fixture.store)
        let playlist = try context.create("Playlist")
        try playlist.setValue(.string("mix"), forKey: "name")
        var songs: [ManagedObject] = []
        for title in ["a", "b", "c"] {
            let song = try context.create("Song")
            try song.setValue(.string(title), forKey: "title")
            try playlist.add(song, toKey: "songs")
            songs.append(song)
        }
        try playlist.setObject(songs[1], forKey: "cover")
        try context.save()
        try playlist.remove(songs[0], fromKey: "songs")
        try context.delete(songs[2])
        try context.save()
        let reader = ObjectContext(store: fixture.store)
        let read = try #require(try reader.fetch(FetchRequest(entityName: "Playlist")).first)
        #expect(try read.objects(forKey: "songs").map { try $0.value(forKey: "title") } == [.string("b")])
        #expect(try read.object(forKey: "cover")?.value(forKey: "title") == .string("b"))
        #expect(try reader.count(FetchRequest(entityName: "Song")) == 2)
        // A new song added, then deleted before the save (with its key obtained early, or not):
        // the list keeps no reference to a row that never existed.
        for early in [true, false] {
            let song = try context.create("Song")
            try song.setValue(.string("gone"), forKey: "title")
            try playlist.add(song, toKey: "songs")
            try playlist.setObject(song, forKey: "cover")
            if early { try context.obtainPermanentIDs(for: [song, song, playlist]) }
            #expect(context.registeredObjects.filter { $0 === song }.count == 1)
            try context.delete(song)
            try context.save()
            let again = ObjectContext(store: fixture.store)
            let list = try #require(try again.fetch(FetchRequest(entityName: "Playlist")).first)
            #expect(try list.objects(forKey: "songs").map { try $0.value(forKey: "title") } == [.string("b")])
            #expect(try again.count(FetchRequest(entityName: "Song")) == 2)
            try playlist.setObject(songs[1], forKey: "cover")
            try context.save()
        }
    }
}

@Suite struct TypedSubEntityTests {
    @Test(arguments: StoreKind.allCases)
    func subclassesAreSubEntities(kind: StoreKind) async throws {
        let model = try ObjectModel(types: [Shape.self, Square.self, Circle.self])
        #expect(try model.entity(named: "Square").root == "Shape")
        let fixture = try await Fixture.make(kind, model: model)
        let context = ObjectContext(store: fixture.store)
        context.insert(Square(label: "a", edge: 2))
        context.insert(Circle(label: "b", radius: 1))
        context.insert(Shape(label: "c"))
        try context.save()
        let reader = ObjectContext(store: fixture.store)
        let shapes = try reader.fetch(FetchDescriptor<Shape>(sortBy: [SortDescriptor(\.label)]))
        #expect(shapes.map { String(describing: type(of: $0)) } == ["Square", "Circle", "Shape"])
        #expect(shapes.map(\.sides) == [4, 0, 0])
        #expect((shapes[0] as? Square)?.edge == 2 && (shapes[1] as? Circle)?.radius == 1)
        #expect(try reader.fetch(FetchDescriptor<Square>()).map(\.label) == ["a"])
        #expect(try reader.fetch(FetchDescriptor<Circle>(predicate: #Predicate { $0.radius > 0.5 })).map(\.label) == ["b"])
        #expect(try reader.fetch(FetchDescriptor<Shape>(predicate: #Predicate { $0.sides == 4 })).map(\.label) == ["a"])
    }
}
