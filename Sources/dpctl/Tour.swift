import ArgumentParser
import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

struct Tour: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tour",
        abstract: "A demonstration on a temporary virtual device.",
        discussion:
            "Every class in every lock state, the grace period, class B while locked, tamper detection, passcode delays. Runs in a temporary data root (removed afterwards) on a virtual clock, so it never waits."
    )

    @OptionGroup(title: "Ignored by the tour (it always uses a temporary device)") var device: DeviceOptions
    @Flag(help: "Keep the temporary data root and print its path.") var keep = false

    func run() async throws {
        DeviceOptions.bootstrapLogging(verbose: false)
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "dp-tour-\(UUID().uuidString.prefix(8))")
        defer { if !keep { try? FileManager.default.removeItem(at: base) } }
        try await TourScript(base: base).run()
        if keep { printOut("\nkept: \(base.path)") }
    }
}

/// The tour's steps. Every claim it prints is the outcome of a real call on the library.
struct TourScript {
    let base: URL
    let passcode = "123456"
    let clock = ManualClock()

    func section(_ title: String) { printOut("\n== \(title)\n") }
    func mark(_ ok: Bool) -> String { ok ? "✓" : "✗" }

    func run() async throws {
        printOut("DataProtection tour: a virtual device in \(base.path); time runs on a virtual clock.")
        let root = base.appendingPathComponent("device").path
        let docs = base.appendingPathComponent("files")
        try FileManager.default.createDirectory(at: docs, withIntermediateDirectories: true)

        section("1. A new device")
        let created = try await Keybag.create(root: root, passcode: passcode, clock: clock)
        let status = await created.status
        let cost = try status.kdf.measureOneAttempt()
        printOut(
            table([
                ["device secret:", "\(root)/device.secret (256 random bits, mode 0600)"],
                ["keybag:", "\(root)/keybag (424 bytes, HMAC-authenticated)"],
                [
                    "passcode KDF:",
                    "\(status.kdf), one attempt \(cost.formattedMilliseconds) on this machine (calibrated to ≥ 80 ms)",
                ],
                ["grace period:", "\(Int(status.gracePeriod)) s"],
            ]))

        let files = ProtectedFileManager(keybag: created)
        var urls: [ProtectionClass: URL] = [:]
        for cls in ProtectionClass.allCases {
            urls[cls] = docs.appendingPathComponent("\(cls.letter)-\(cls.shortName).txt")
            try await files.write(Data("class \(cls.letter) secret".utf8), to: urls[cls]!, protection: cls)
        }
        try await matrix(root: root, docs: docs, urls: urls)
        try await handles(root: root, docs: docs, urls: urls)
        try await tamper(files: files, docs: docs)
        try await delays(root: root, urls: urls)
        try await database(root: root, docs: docs)
        printOut(
            "\nEverything above ran against the real library: AES-256-GCM segments, AES key wrap, X25519 for class B, scrypt,"
        )
        printOut("and SQLCipher's page format (AES-256-CBC + HMAC-SHA512) under the system SQLite and GRDB.")
    }

    // MARK: 2. The matrix

    func matrix(root: String, docs: URL, urls: [ProtectionClass: URL]) async throws {
        section("2. Every class in every lock state (one file per class, then a restart)")
        let keybag = try await Keybag.open(root: root, clock: clock)
        let files = ProtectedFileManager(keybag: keybag)
        var columns: [(String, [ProtectionClass: String], Bool)] = []
        func probe(_ title: String) async {
            var cells: [ProtectionClass: String] = [:]
            for cls in ProtectionClass.allCases {
                let read = (try? await files.contents(of: urls[cls]!)) != nil
                let probeURL = docs.appendingPathComponent("probe-\(UUID().uuidString)")
                let create = (try? await files.write(Data("new".utf8), to: probeURL, protection: cls)) != nil
                try? FileManager.default.removeItem(at: probeURL)
                cells[cls] = "read \(mark(read))  create \(mark(create))"
            }
            columns.append((title, cells, await keybag.isProtectedDataAvailable))
        }
        await probe("BEFORE FIRST UNLOCK")
        try await keybag.unlock(passcode: passcode)
        await probe("UNLOCKED")
        await keybag.lock()
        clock.advance(by: 5)
        await probe("LOCKED +5 s (GRACE)")
        clock.advance(by: 5)
        await probe("LOCKED +10 s")
        var rows = [["CLASS"] + columns.map(\.0)]
        for cls in ProtectionClass.allCases {
            rows.append(
                [
                    "\(cls.letter) \(cls.fileProtectionType.rawValue.replacingOccurrences(of: "NSFileProtection", with: ""))"
                ] + columns.map { $0.1[cls]! })
        }
        rows.append(["isProtectedDataAvailable"] + columns.map { $0.2 ? "true" : "false" })
        printOut(table(rows))
        printOut(
            "\nA: only while unlocked (and the grace period).  B: new files while locked; reopening needs an unlock.")
        printOut(
            "C: from the first unlock on, locked or not.      D: always.  Denied reads bridge to CocoaError 257, writes to 513."
        )
    }

    // MARK: 3. Handles and events

    func handles(root: String, docs: URL, urls: [ProtectionClass: URL]) async throws {
        section("3. Open handles across a lock, and the events apps hear")
        let keybag = try await Keybag.open(root: root, clock: clock)
        let files = ProtectedFileManager(keybag: keybag)
        let start = clock.now()
        let log = EventRecorder()
        await keybag.addObserver { [clock] event in log.record(event, at: clock.now().timeIntervalSince(start)) }
        try await keybag.unlock(passcode: passcode)
        let handleA = try await files.openHandle(forReadingFrom: urls[.complete]!)
        let handleB = try await files.openHandle(forUpdating: urls[.completeUnlessOpen]!)
        clock.advance(by: 1)
        await keybag.lock()
        clock.advance(by: 5)
        let aInGrace = (try? await handleA.read(at: 0, count: 64)) != nil
        clock.advance(by: 5)
        var aAfterGrace = "read ✓"
        do { _ = try await handleA.read(at: 0, count: 64) } catch {
            aAfterGrace = "read ✗ (CocoaError \((error as NSError).code))"
        }
        let bWrite = (try? await handleB.append(Data(" + appended while locked".utf8))) != nil
        let bRead = (try? await handleB.read(at: 0, count: 100)) ?? Data()
        try await handleB.close()
        let bReopen = (try? await files.openHandle(forReadingFrom: urls[.completeUnlessOpen]!)) != nil

        // A class-B download started while locked.
        let download = docs.appendingPathComponent("B-created-while-locked.bin")
        let payload = Data((0..<150_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let created = try await files.createFile(at: download, protection: .completeUnlessOpen)
        try await created.write(contentsOf: payload)
        try await created.close()
        let downloadReopen = (try? await files.contents(of: download)) != nil
        clock.advance(by: 50)
        try await keybag.unlock(passcode: passcode)
        let aAfterUnlock = (try? await handleA.read(at: 0, count: 64)) != nil
        let downloadAfterUnlock = (try? await files.contents(of: download)) == payload
        try await handleA.close()

        printOut(
            table([
                ["HANDLE", "WHILE LOCKED", "AFTER UNLOCK"],
                [
                    "A, opened while unlocked", "+5 s read \(mark(aInGrace)); +10 s \(aAfterGrace)",
                    "read \(mark(aAfterUnlock))",
                ],
                [
                    "B, opened while unlocked",
                    "+10 s write \(mark(bWrite)), read \(mark(!bRead.isEmpty)) \"\(String(decoding: bRead, as: UTF8.self))\"; after close reopen \(mark(bReopen))",
                    "reopen ✓",
                ],
                [
                    "B, created while locked", "write 150,000 bytes ✓; after close reopen \(mark(downloadReopen))",
                    "read \(mark(downloadAfterUnlock)) (bytes match)",
                ],
            ]))
        printOut("\nEvents (virtual time since the first unlock):")
        printOut(table([["T", "EVENT"]] + log.entries.map { [String(format: "+%.0f s", $0.0), $0.1.rawValue] }))
    }

    // MARK: 6. Databases

    func database(root: String, docs: URL) async throws {
        section("6. Encrypted databases (SQLCipher 4 format) across a lock")
        let keybag = try await Keybag.open(root: root, clock: clock)
        try await keybag.unlock(passcode: "new-passcode")   // set in section 5
        let urlA = docs.appendingPathComponent("notes-A.db"), urlB = docs.appendingPathComponent("inbox-B.db")
        let notes = try await ProtectedDatabase.open(at: urlA, keybag: keybag, protection: .complete)
        let inbox = try await ProtectedDatabase.open(at: urlB, keybag: keybag, protection: .completeUnlessOpen)
        for db in [notes, inbox] {
            try await db.write { db in
                try db.execute(sql: "CREATE TABLE message(id INTEGER PRIMARY KEY, text TEXT)")
                for i in 1...1000 {
                    try db.execute(sql: "INSERT INTO message(text) VALUES (?)", arguments: ["message \(i)"])
                }
            }
        }
        let head = try FileHandle(forReadingFrom: urlA).read(upToCount: 16) ?? Data()
        let count: @Sendable (Database) throws -> Int = {
            try Int.fetchOne($0, sql: "SELECT count(*) FROM message") ?? 0
        }
        await keybag.lock()
        clock.advance(by: 11)
        _ = await keybag.isProtectedDataAvailable
        var aLocked = "✓"
        do { _ = try await notes.read(count) } catch {
            aLocked = "✗ (\((error as NSError).domain) \((error as NSError).code))"
        }
        let bWrite =
            (try? await inbox.write { db in
                try db.execute(sql: "INSERT INTO message(text) VALUES ('pushed while locked')")
            }) != nil
        let bCount = (try? await inbox.read(count)) ?? -1
        try await keybag.unlock(passcode: "new-passcode")
        let aAfter = (try? await notes.read(count)) ?? -1
        printOut(
            table([
                ["DATABASE", "FILE STARTS WITH", "+11 s AFTER LOCK", "AFTER UNLOCK"],
                [
                    "notes-A.db (class A)",
                    head.map { String(format: "%02x", $0) }.joined().prefix(16) + "… (salt, not \"SQLite format 3\")",
                    "read \(aLocked)", "\(aAfter) rows, same object, not reopened",
                ],
                ["inbox-B.db (class B)", "", "write \(mark(bWrite)), \(bCount) rows", "✓"],
            ]))
        try await notes.close()
        try await inbox.close()
        printOut("\nSQLCipher opens them too: dpctl sql-key DB prints the raw key for PRAGMA key = \"x'…'\".")
    }

    // MARK: 4. Tamper detection

    func tamper(files: ProtectedFileManager, docs: URL) async throws {
        section("4. Tamper detection (a 200,000-byte class C file: header + 4 segments of 64 KiB)")
        let url = docs.appendingPathComponent("C-tamper.bin")
        let other = docs.appendingPathComponent("C-other.bin")
        let data = Data((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try await files.write(data, to: url, protection: .completeUntilFirstUserAuthentication)
        try await files.write(data, to: other, protection: .completeUntilFirstUserAuthentication)
        let original = [UInt8](try Data(contentsOf: url))
        let otherBytes = [UInt8](try Data(contentsOf: other))
        let header = 160, segment = 65_536 + 28
        let s1 = (header + segment)..<(header + 2 * segment)
        let s2 = (header + 2 * segment)..<(header + 3 * segment)
        var cases: [(String, [UInt8])] = []
        var flipped = original; flipped[header + segment + 1000] ^= 0x01
        cases.append(("flip one bit in segment 1", flipped))
        var classByte = original; classByte[12] = 4
        cases.append(("change the class byte to D", classByte))
        cases.append(("truncate at a segment boundary", Array(original.prefix(header + 3 * segment))))
        cases.append(("truncate inside a segment", Array(original.prefix(original.count - 100))))
        cases.append(("extend with a copy of the last segment", original + Array(original[(header + 3 * segment)...])))
        var reordered = original; reordered.replaceSubrange(s1, with: original[s2]);
        reordered.replaceSubrange(s2, with: original[s1])
        cases.append(("swap segments 1 and 2", reordered))
        var swapped = original; swapped.replaceSubrange(s1, with: otherBytes[s1])
        cases.append(("segment 1 from another file", swapped))
        var rows = [["TAMPERING", "RESULT"]]
        for (name, bytes) in cases {
            try Data(bytes).write(to: url)
            do {
                let read = try await files.contents(of: url)
                rows.append([name, read == data ? "NOT DETECTED (read the original)" : "NOT DETECTED (wrong bytes!)"])
            } catch {
                rows.append([name, "detected: \(error)".replacingOccurrences(of: url.path + ": ", with: "")])
            }
        }
        try Data(original).write(to: url)
        rows.append(["(original bytes restored)", (try? await files.contents(of: url)) == data ? "reads back ✓" : "✗"])
        printOut(table(rows))
    }

    // MARK: 5. Passcode delays

    func delays(root: String, urls: [ProtectionClass: URL]) async throws {
        section("5. Wrong passcodes: escalating delays, counted in the keybag across restarts")
        var keybag = try await Keybag.open(root: root, clock: clock)
        var rows = [["ATTEMPT", "RESULT", "NEXT ATTEMPT"]]
        for attempt in 1...10 {
            if attempt == 6 { keybag = try await Keybag.open(root: root, clock: clock) }   // a restart changes nothing
            var result: String
            do { try await keybag.unlock(passcode: "wrong-\(attempt)"); result = "unlocked?!" } catch {
                result = "\(error)"
            }
            let wait = await keybag.status.delayRemaining
            rows.append([
                "\(attempt)\(attempt == 6 ? " (after a restart)" : "")", result,
                wait.map { "in \(Self.duration($0))" } ?? "now",
            ])
            if let wait {
                var early = "—"
                do { try await keybag.unlock(passcode: passcode) } catch { early = "\(error)" }
                if attempt == 5 { rows.append(["", "right passcode too early: \(early)", ""]) }
                clock.advance(by: wait)
            }
        }
        try await keybag.unlock(passcode: passcode)
        rows.append(["11", "right passcode: unlocked, counter reset to \(await keybag.status.failedAttempts)", "—"])
        printOut(table(rows))
        printOut("\nWith `dpctl policy --erase-after-ten-failures`, attempt 10 would have crypto-erased the device.")

        let before = try Data(contentsOf: urls[.complete]!)
        try await keybag.changePasscode(from: passcode, to: "new-passcode")
        let after = try Data(contentsOf: urls[.complete]!)
        let reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "new-passcode")
        let readable = (try? await ProtectedFileManager(keybag: reopened).contents(of: urls[.complete]!)) != nil
        printOut(
            "Passcode change: class keys rewrapped; class A file bytes unchanged \(mark(before == after)); readable with the new passcode \(mark(readable))."
        )
    }

    static func duration(_ seconds: TimeInterval) -> String {
        let s = Int(seconds.rounded(.up))
        return s >= 3600 ? "\(s / 3600) h" : s >= 60 ? "\(s / 60) min" : "\(s) s"
    }
}

/// Collects events from the keybag's observer callback.
/// `@unchecked Sendable`: every access is under `lock`.
final class EventRecorder: @unchecked Sendable {
    private let lock = NSLock()
    private var _entries: [(TimeInterval, ProtectedDataEvent)] = []
    func record(_ event: ProtectedDataEvent, at t: TimeInterval) {
        lock.lock(); _entries.append((t, event)); lock.unlock()
    }
    var entries: [(TimeInterval, ProtectedDataEvent)] { lock.lock(); defer { lock.unlock() }; return _entries }
}

extension Duration {
    var formattedMilliseconds: String {
        let ms = Double(components.seconds) * 1000 + Double(components.attoseconds) / 1e15
        return String(format: "%.0f ms", ms)
    }
}
