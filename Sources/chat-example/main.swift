import DataProtection
import DataProtectionObjects
import Foundation
import Logging

// The libraries' log lines (unlocked, locked…) are not the example's output: warnings only.
LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = .warning
    return handler
}

// A chat app on the encrypted object store: accounts, conversations, messages with
// attachments, kept in a class-A (`.complete`) SQLCipher database that follows the lock.
//
//     swift run chat-example [DIRECTORY]

func section(_ title: String) { print("\n== \(title)") }

let directory =
    CommandLine.arguments.dropFirst().first.map { URL(fileURLWithPath: $0) }
    ?? URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("chat-example-" + UUID().uuidString)
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)

// The device: a keybag with a passcode, on a virtual clock so the grace period passes at once.
let clock = ManualClock()
let root = directory.appendingPathComponent("device").path
let keybag =
    FileManager.default.fileExists(atPath: root)
    ? try await Keybag.open(root: root, clock: clock)
    : try await Keybag.create(root: root, passcode: "123456", clock: clock)
if await keybag.lockState != .unlocked { try await keybag.unlock(passcode: "123456") }

let model = try ObjectModel(types: [Account.self, Conversation.self, Message.self, Attachment.self])
let storeURL = directory.appendingPathComponent("Chat.sqlite")
let store = try await SQLiteObjectStore.open(at: storeURL, keybag: keybag, protection: .complete, model: model)
print("store: \(storeURL.path) (SQLCipher 4, class A, model \(model.versionHash.prefix(12))…)")

section("Insert a conversation with messages and an attachment, one save")
let context = ObjectContext(store: store)
let ayako = Account(name: "Ayako", handle: "@ayako")
let wei = Account(name: "Wei", handle: "@wei")
let team = Conversation(title: "Release planning")
context.insert(team)
team.members = [ayako, wei]
let start = Date(timeIntervalSinceReferenceDate: 815_000_000)
for (i, (sender, text)) in [
    (ayako, "Shall we ship on Friday?"), (wei, "Yes — the SQLite layer is done."),
    (ayako, "Here are the release notes."), (wei, "Looks good!"),
].enumerated() {
    let message = Message(text: text, sentAt: start.addingTimeInterval(Double(i) * 60))
    message.sender = sender
    message.conversation = team
}
let notes = Attachment(fileName: "notes.md", contents: Data("# 1.0\n- encrypted object store\n".utf8))
notes.message = team.messages.first { $0.text.contains("release notes") }
try context.save()
print(
    "saved \(try context.fetchCount(FetchDescriptor<Message>())) messages in \"\(team.title)\"; keys: \(team.messages.map(\.persistentModelID.primaryKey))"
)

section("Fetch: #Predicate, sort, limit; and the other result types")
let reader = ObjectContext(store: store)
let since = start.addingTimeInterval(30)
var recent = FetchDescriptor<Message>(
    predicate: #Predicate { $0.sentAt > since && $0.isRead == false },
    sortBy: [SortDescriptor(\.sentAt, order: .reverse)])
recent.fetchLimit = 2
for message in try reader.fetch(recent) {
    print(
        "  \(message.sender?.handle ?? "?"): \(message.text)  [\(message.attachments.map(\.fileName).joined(separator: ", "))]"
    )
}
print(
    "  from @wei (through a to-one):",
    try reader.fetchCount(FetchDescriptor<Message>(predicate: #Predicate { $0.sender?.handle == "@wei" })))
print(
    "  with an attachment (ANY over a to-many):",
    try reader.fetch(FetchDescriptor<Message>(predicate: #Predicate { $0.attachments.contains { $0.byteCount > 0 } }))
        .map(\.text))
print(
    "  case-insensitive \"looks\":",
    try reader.fetch(FetchDescriptor<Message>(condition: .string("text", .beginsWith, "LOOKS", caseInsensitive: true)))
        .map(\.text))
print(
    "  as dictionaries:",
    try reader.fetchDictionaries(
        FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)]),
        properties: ["text", "sender.name"]
    ).prefix(2).map { $0.mapValues(\.description) })

section("Faults load on first use")
var lazily = FetchDescriptor<Message>(sortBy: [SortDescriptor(\.sentAt)])
lazily.includesPropertyValues = false
let faults = try ObjectContext(store: store).fetch(lazily)
print("  fetched \(faults.count) faults; first is a fault: \(faults[0].managedObject.isFault)")
print("  first text: \"\(faults[0].text)\"; now a fault: \(faults[0].managedObject.isFault)")

section("Lock the device: after the grace period the class-A store refuses")
await keybag.lock()
clock.advance(by: await keybag.gracePeriod + 1)
_ = await keybag.isProtectedDataAvailable
do {
    _ = try reader.fetch(FetchDescriptor<Message>())
    print("  unexpectedly readable while locked")
} catch {
    print("  fetch while locked: \(error)")
}

section("Unlock: the same store and context work again")
try await keybag.unlock(passcode: "123456")
try await store.restoreAccess()
print("  messages: \(try reader.fetchCount(FetchDescriptor<Message>()))")

section("Delete rules")
do {
    try reader.delete(try reader.fetch(FetchDescriptor<Account>(predicate: #Predicate { $0.handle == "@wei" }))[0])
} catch {
    print("  deny: \(error)")
}
try reader.delete(try reader.fetch(FetchDescriptor<Conversation>())[0])
try reader.save()
print(
    "  cascade: conversations \(try reader.fetchCount(FetchDescriptor<Conversation>())), messages \(try reader.fetchCount(FetchDescriptor<Message>())), attachments \(try reader.fetchCount(FetchDescriptor<Attachment>())); accounts kept: \(try reader.fetchCount(FetchDescriptor<Account>()))"
)
try await store.close()
print("\nDone. Data in \(directory.path)")
