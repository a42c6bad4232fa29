import ArgumentParser
import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionObjects
import DataProtectionSQLite
import Foundation
import GRDB

@Model final class BenchConversation {
    var title: String
    var createdAt: Date
    @Relationship(deleteRule: .cascade, inverse: \BenchMessage.conversation) var messages: [BenchMessage] = []
    init(title: String, createdAt: Date) {
        self.title = title
        self.createdAt = createdAt
    }
}

@Model final class BenchMessage {
    var text: String
    @Attribute(.indexed) var sentAt: Date
    var isRead: Bool
    var conversation: BenchConversation?
    init(text: String, sentAt: Date, isRead: Bool) {
        self.text = text
        self.sentAt = sentAt
        self.isRead = isRead
    }
}

/// The GRDB peer: plain records, the same columns, the same encrypted database format.
struct ConversationRecord: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "conversation"
    var id: Int64?
    var title: String
    var createdAt: Date
    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

struct MessageRecord: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "message"
    var id: Int64?
    var text: String
    var sentAt: Date
    var isRead: Bool
    var conversationId: Int64?
    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

/// `dp-bench objects`: the object graph beside plain GRDB records doing the same work, both on
/// a class-C encrypted database in the same run, so the ratio is the object layer's own cost.
struct ObjectsBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "objects",
        abstract: "The object graph vs plain GRDB records.",
        usage: "dp-bench objects [<options>]",
        discussion:
            "Object graph (contexts, faults, #Predicate) beside plain GRDB records: insert, fetch as faults, fire faults, indexed predicate."
    )

    @Option(help: "Objects inserted in one save (1 conversation per 100 messages).")
    var objects = 100_000

    @Option(help: "Runs of each measurement; the median is reported.")
    var runs = 3

    @Option(help: "Directory for the databases (default: a new one under $TMPDIR).")
    var directory: String?

    func run() async throws {
        let dir = directory ?? NSTemporaryDirectory() + "dp-bench-objects-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if directory == nil { try? FileManager.default.removeItem(atPath: dir) } }
        let keybag = try await Keybag.create(root: dir + "/root", passcode: "123456", kdf: .insecureFastForTesting)
        let conversations = max(objects / 100, 1)
        let messages = objects - conversations
        let base = Date(timeIntervalSinceReferenceDate: 800_000_000)
        // 20 queries, each selecting 1% of the messages through the sentAt index.
        let windows = (0..<20).map { q in
            (
                base.addingTimeInterval(Double(messages * q / 20)),
                base.addingTimeInterval(Double(messages * q / 20 + messages / 100))
            )
        }
        print(
            "dp-bench objects: \(conversations) conversations + \(messages) messages (one save), \(runs) runs, encrypted class C; in \(dir)"
        )

        var ours: [String: [Double]] = [:], grdb: [String: [Double]] = [:]
        var checks: [String: Int] = [:]
        for run in 0..<runs {
            // Ours.
            let model = try ObjectModel(types: [BenchConversation.self, BenchMessage.self])
            let store = try await SQLiteObjectStore.open(
                at: URL(fileURLWithPath: "\(dir)/objects-\(run).sqlite"), keybag: keybag,
                protection: .completeUntilFirstUserAuthentication, model: model)
            ours["insert", default: []].append(
                try await seconds {
                    let context = ObjectContext(store: store)
                    var current: BenchConversation?
                    for i in 0..<messages {
                        if i % 99 == 0 || current == nil {
                            let conversation = BenchConversation(title: "conversation \(i / 99)", createdAt: base)
                            context.insert(conversation)
                            current = conversation
                        }
                        let message = BenchMessage(
                            text: "message number \(i)", sentAt: base.addingTimeInterval(Double(i)), isRead: i % 3 == 0)
                        message.conversation = current
                    }
                    try context.save()
                })
            let context = ObjectContext(store: store)
            var faults: FetchResults<BenchMessage>?
            // Both sides: one untimed read after the big insert, so reads start warm.
            _ = try await store.writer.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM BenchMessage") }
            ours["fault_fetch", default: []].append(
                try await seconds {
                    faults = try context.fetch(FetchDescriptor<BenchMessage>(), batchSize: 512)
                })
            var fired = 0
            ours["fire_faults", default: []].append(
                await seconds {
                    for message in faults! where message.isRead { fired += message.text.utf8.count }
                })
            checks["ours_fired"] = fired
            // For the record: faults made all at once, as an array.
            ours["fault_array", default: []].append(
                try await seconds {
                    var descriptor = FetchDescriptor<BenchMessage>()
                    descriptor.includesPropertyValues = false
                    checks["ours_array"] = try ObjectContext(store: store).fetch(descriptor).count
                })
            var matched = 0
            ours["predicate", default: []].append(
                try await seconds {
                    for (from, to) in windows {
                        let found = try ObjectContext(store: store).fetch(
                            FetchDescriptor<BenchMessage>(predicate: #Predicate { $0.sentAt >= from && $0.sentAt < to })
                        )
                        matched += found.reduce(0) { $0 + ($1.isRead ? 1 : 0) }
                    }
                })
            checks["ours_matched"] = matched
            try await store.close()

            // GRDB records.
            let database = try await ProtectedDatabase.open(
                at: URL(fileURLWithPath: "\(dir)/grdb-\(run).sqlite"), keybag: keybag,
                protection: .completeUntilFirstUserAuthentication)
            try await database.write { db in
                try db.execute(
                    sql: """
                        CREATE TABLE conversation (id INTEGER PRIMARY KEY, title TEXT NOT NULL, createdAt REAL NOT NULL);
                        CREATE TABLE message (id INTEGER PRIMARY KEY, text TEXT NOT NULL, sentAt REAL NOT NULL, isRead INTEGER NOT NULL,
                                              conversationId INTEGER REFERENCES conversation(id));
                        CREATE INDEX message_sentAt ON message(sentAt);
                        CREATE INDEX message_conversationId ON message(conversationId);
                        """)
            }
            let writer = try database.writer
            grdb["insert", default: []].append(
                try await seconds {
                    try await writer.write { db in
                        var conversationID: Int64?
                        for i in 0..<messages {
                            if i % 99 == 0 || conversationID == nil {
                                var conversation = ConversationRecord(
                                    id: nil, title: "conversation \(i / 99)", createdAt: base)
                                try conversation.insert(db)
                                conversationID = conversation.id
                            }
                            var message = MessageRecord(
                                id: nil, text: "message number \(i)", sentAt: base.addingTimeInterval(Double(i)),
                                isRead: i % 3 == 0, conversationId: conversationID)
                            try message.insert(db)
                        }
                    }
                })
            _ = try await writer.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM message") }
            var ids: [Int64] = []
            grdb["fault_fetch", default: []].append(
                try await seconds {
                    ids = try await writer.read { try Int64.fetchAll($0, sql: "SELECT id FROM message") }
                })
            checks["grdb_ids"] = ids.count
            grdb["fault_array"] = grdb["fault_fetch"]
            var grdbFired = 0
            grdb["fire_faults", default: []].append(
                try await seconds {
                    let records = try await writer.read { try MessageRecord.fetchAll($0) }
                    for message in records where message.isRead { grdbFired += message.text.utf8.count }
                })
            checks["grdb_fired"] = grdbFired
            var grdbMatched = 0
            grdb["predicate", default: []].append(
                try await seconds {
                    for (from, to) in windows {
                        let found = try await writer.read { db in
                            try MessageRecord.filter(Column("sentAt") >= from && Column("sentAt") < to).fetchAll(db)
                        }
                        grdbMatched += found.reduce(0) { $0 + ($1.isRead ? 1 : 0) }
                    }
                })
            checks["grdb_matched"] = grdbMatched
            try await database.close()
        }
        guard checks["ours_fired"] == checks["grdb_fired"], checks["ours_matched"] == checks["grdb_matched"] else {
            throw ValidationError("the two sides disagree: \(checks)")
        }

        let metrics: [(String, String)] = [
            ("insert", "insert \(objects) objects, one save"),
            ("fault_fetch", "fetch \(messages) as faults, batched (GRDB: their keys)"),
            ("fire_faults", "fire every fault (GRDB: fetchAll records)"),
            ("predicate", "20 × #Predicate on an index, \(messages / 100) rows each"),
        ]
        var lines = [["METRIC", "OURS", "GRDB RECORDS", "OURS ÷ GRDB"]]
        var summary: [String] = []
        for (key, label) in metrics {
            let o = percentile(ours[key]!, 50), g = percentile(grdb[key]!, 50)
            lines.append([
                label, String(format: "%.1f ms", o * 1000), String(format: "%.1f ms", g * 1000),
                String(format: "%.2f×", o / g),
            ])
            summary.append("\(key)_ratio=\(String(format: "%.2f", o / g))")
        }
        let o = percentile(ours["fault_array"]!, 50), g = percentile(grdb["fault_array"]!, 50)
        lines.append([
            "(info) the same faults made at once, as an array", String(format: "%.1f ms", o * 1000),
            String(format: "%.1f ms", g * 1000),
            String(format: "%.2f×", o / g),
        ])
        printColumns(lines)
        print("(ratio: ours ÷ GRDB, lower is better; target ≤ 1.5× each)")
        print("summary: " + summary.joined(separator: " "))
    }
}
