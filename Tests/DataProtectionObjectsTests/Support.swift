import DataProtection
import DataProtectionObjects
import DataProtectionTestSupport
import Foundation
import GRDB
import Synchronization
import Testing


/// The two stores the shared suite runs on.
enum StoreKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case inMemory, encryptedSQLite
    var testDescription: String { rawValue }
}

/// Counts the SQL statements a store's connections run.
final class StatementCounter: Sendable {
    private let count = Atomic<Int>(0)
    private let log = Mutex<[String]>([])
    /// The queries of the store's data (SELECTs on its tables; not transaction control, nor
    /// the schema checks GRDB makes when it opens a read).
    var value: Int { statements.count }
    var statements: [String] { all.filter { $0.hasPrefix("SELECT") && !$0.contains("sqlite_master") } }
    var all: [String] { log.withLock { $0 } }
    func reset() {
        count.store(0, ordering: .relaxed)
        log.withLock { $0 = [] }
    }
    func record(_ sql: String) {
        count.add(1, ordering: .relaxed)
        log.withLock { $0.append(sql) }
    }
    var configuration: Configuration {
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            db.trace(options: .statement) { event in
                if case .statement(let statement) = event { self.record(statement.sql) }
            }
        }
        return configuration
    }
}

/// A device with passcode "123456", weak scrypt parameters and a virtual clock.
struct Fixture {
    let store: any PersistentStore
    let counter = StatementCounter()
    let device: TestDevice?

    static func make(_ kind: StoreKind, model: ObjectModel, protection: ProtectionClass = .completeUntilFirstUserAuthentication) async throws -> Fixture {
        switch kind {
        case .inMemory:
            return Fixture(store: InMemoryObjectStore(model: model), device: nil)
        case .encryptedSQLite:
            let device = try await TestDevice.make()
            let counter = StatementCounter()
            let store = try await SQLiteObjectStore.open(at: device.dir.appendingPathComponent("chat.sqlite"), keybag: device.keybag,
                                                         protection: protection, model: model, configuration: counter.configuration)
            return Fixture(store: store, counter: counter, device: device)
        }
    }

    init(store: any PersistentStore, counter: StatementCounter = StatementCounter(), device: TestDevice?) {
        self.store = store
        self.device = device
        self.counterStorage = counter
    }
    private let counterStorage: StatementCounter
    var statements: StatementCounter { counterStorage }
}

func chatModel() throws -> ObjectModel { try ObjectModel(types: chatTypes) }

let day0 = Date(timeIntervalSinceReferenceDate: 800_000_000)
func day(_ n: Int) -> Date { day0.addingTimeInterval(Double(n) * 86_400) }

/// A small chat: 3 accounts, 2 conversations, 10 messages, some attachments.
@discardableResult
func seedChat(_ context: ObjectContext) throws -> (accounts: [Account], conversations: [Conversation], messages: [Message]) {
    let alice = Account(name: "Alice", email: "alice@example.org")
    alice.age = 31
    alice.rating = 4.5
    alice.balance = Decimal(string: "12.50")
    let bob = Account(name: "bob", email: nil)
    bob.age = 25
    bob.rating = 3.0
    let carol = Account(name: "Carol Ünicode", email: "carol@example.org")
    carol.age = 40
    carol.isActive = false
    for account in [alice, bob, carol] { context.insert(account) }
    let team = Conversation(title: "Team")
    let lunch = Conversation(title: "lunch plans")
    context.insert(team)
    context.insert(lunch)
    team.participants = [alice, bob, carol]
    lunch.participants = [alice, bob]
    var messages: [Message] = []
    let texts = ["Hello team", "hello again", "Report due", "lunch?", "Pizza!", "Sushi", "ok", "See you", "HELLO", "bye"]
    for (i, text) in texts.enumerated() {
        let message = Message(text: text, sentAt: day(i))
        message.conversation = i < 3 || i >= 8 ? team : lunch
        message.sender = [alice, bob, carol][i % 3]
        message.isRead = i % 2 == 0
        context.insert(message)
        messages.append(message)
    }
    let photo = Attachment(name: "photo.jpg", size: 2_000_000)
    photo.message = messages[2]
    let doc = Attachment(name: "report.pdf", size: 300_000)
    doc.message = messages[2]
    let menu = Attachment(name: "menu.png", size: 50_000)
    menu.message = messages[4]
    try context.save()
    return ([alice, bob, carol], [team, lunch], messages)
}
