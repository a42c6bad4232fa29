// An app for the container tests: run under `dpctl app run`, it does what a test asks from
// inside the sandbox and prints what happened (one line per attempt), as an attacker would.
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
import DataProtectionLifecycle
import DataProtectionSQLite
import GRDB
import SystemPackage
import Foundation

func fail(_ message: String, status: Int32 = 1) -> Never {
    FileHandle.standardError.write(Data("dp-test-app: \(message)\n".utf8))
    exit(status)
}

let arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else { fail("usage: dp-test-app COMMAND …") }

switch command {
case "lifecycle":
    // A line-driven app for the lifecycle tests: it prints each event and answers commands
    // read from standard input (one line each), as an app under test would behave.
    guard let app = CurrentApp.shared, let lifecycle = AppLifecycle.shared else { fail("lifecycle: not run as an app") }
    let say: @Sendable (String) -> Void = { line in FileHandle.standardOutput.write(Data((line + "\n").utf8)) }
    final class Flags: @unchecked Sendable { var exitOnTerminate = true; var handle: ProtectedFileHandle?; var tasks: [String: BackgroundTaskIdentifier] = [:] }
    let flags = Flags()
    let lock = NSLock()
    // An event's line and a state answer are never interleaved: the state is set before its
    // observers are called, so an answer printed after an event's line reads that event's state
    // or a later one (an answer read just before the change but printed after the line could not).
    let stateLock = NSLock()
    lifecycle.addObserver { event in
        stateLock.withLock { say("event \(event)") }
        if event == .willTerminate, lock.withLock({ flags.exitOnTerminate }) { exit(0) }
    }
    say("state \(lifecycle.applicationState)")
    say("ready")
    while let line = readLine() {
        let words = line.split(separator: " ", maxSplits: 2).map(String.init)
        guard let verb = words.first else { continue }
        switch verb {
        case "begin":
            // begin NAME [end-on-expiry]: a background task; its expiration handler says so
            // (and ends it with end-on-expiry).
            let name = words.count > 1 ? words[1] : "task"
            let endOnExpiry = words.count > 2 && words[2] == "end-on-expiry"
            let id = lifecycle.beginBackgroundTask(withName: name) {
                say("expiring \(name)")
                if endOnExpiry, let id = lock.withLock({ flags.tasks[name] }) {
                    say("ending \(name)")   // first: once ended, the app may be suspended at once
                    lifecycle.endBackgroundTask(id)
                }
            }
            lock.withLock { flags.tasks[name] = id }
            say("began \(name) \(id)")
        case "end":
            let name = words.count > 1 ? words[1] : "task"
            say("ending \(name)")   // first: once ended, the app may be suspended at once
            if let id = lock.withLock({ flags.tasks.removeValue(forKey: name) }) { lifecycle.endBackgroundTask(id) }
        case "activity":
            // performExpiringActivity: the block runs until its time is nearly up, then returns.
            let expired = DispatchSemaphore(value: 0)
            lifecycle.performExpiringActivity(withReason: "save") { isExpired in
                if isExpired {
                    say("activity expired")
                    expired.signal()
                } else {
                    say("activity running")
                    expired.wait()
                    say("activity done")
                }
            }
        case "remaining":
            let left = lifecycle.backgroundTimeRemaining
            say(left == .greatestFiniteMagnitude ? "remaining unlimited" : "remaining \(Int(left.rounded()))")
        case "state":
            stateLock.withLock { say("state \(lifecycle.applicationState)") }
        case "fork-chain":
            // fork-chain: starts a process that forever forks a successor and exits (so one of
            // the chain is always between a scan and a stop signal).
            let chain = Process()
            chain.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            chain.arguments = ["-c", "import os\nwhile True:\n    if os.fork() > 0:\n        os._exit(0)"]
            do { try chain.run(); say("chaining") } catch { say("chain failed: \(error)") }
        case "ignore-terminate":
            lock.withLock { flags.exitOnTerminate = false }
            say("ignoring willTerminate")
        case "counter":
            // counter PATH: counts as fast as it can into PATH (a suspended app's count stops).
            let path = words[1]
            Thread {
                var n = 0
                while true {
                    n += 1
                    try? Data(String(n).utf8).write(to: URL(fileURLWithPath: path))
                    usleep(200)
                }
            }.start()
            say("counting")
        case "open-b":
            // open-b PATH: a class-B file created and kept open (it stays writable after a lock).
            do {
                let url = URL(fileURLWithPath: words[1])
                try await app.files.write(Data(), to: url, protection: .completeUnlessOpen)
                let handle = try await app.files.openHandle(forUpdating: url)
                lock.withLock { flags.handle = handle }
                say("opened class B")
            } catch { say("error \(error)") }
        case "append":
            // append TEXT: to the open class-B file.
            guard let handle = lock.withLock({ flags.handle }) else { say("error no open file"); continue }
            do {
                try await handle.write(Data((words.count > 1 ? words[1...].joined(separator: " ") : "") .utf8), at: try await handle.size())
                say("appended")
            } catch { say("error \(error)") }
        case "create-b":
            do {
                try await app.files.write(Data(words.count > 2 ? words[2].utf8 : "new".utf8), to: URL(fileURLWithPath: words[1]), protection: .completeUnlessOpen)
                say("created class B")
            } catch { say("error \(error)") }
        case "read":
            do { say("read " + String(decoding: try await app.files.contents(of: URL(fileURLWithPath: words[1])), as: UTF8.self)) } catch let error as ProtectedFileError {
                if case .unavailable = error { say("unavailable") } else { say("error \(error)") }
            } catch { say("error \(error)") }
        case "quit":
            exit(0)
        default:
            say("error unknown command \(verb)")
        }
    }

case "places":
    // What unmodified Foundation code finds, and what the app API says.
    let fm = FileManager.default
    var places: [String: String] = [
        "home": NSHomeDirectory(),
        "tmp": NSTemporaryDirectory(),
        "documents": fm.urls(for: .documentDirectory, in: .userDomainMask).first?.path ?? "",
        "caches": fm.urls(for: .cachesDirectory, in: .userDomainMask).first?.path ?? "",
        "applicationSupport": fm.urls(for: .applicationSupportDirectory, in: .userDomainMask).first?.path ?? "",
    ]
    if let app = CurrentApp.shared {
        places["identifier"] = app.identifier.rawValue
        places["container"] = app.url.path
        places["sandboxed"] = app.isSandboxed ? "yes" : "no"
    }
    for group in arguments.dropFirst() {
        places["group:" + group] = fm.containerURL(forSecurityApplicationGroupIdentifier: group)?.path ?? "nil"
    }
    let data = try JSONSerialization.data(withJSONObject: places, options: [.sortedKeys])
    print(String(decoding: data, as: UTF8.self))

case "write":
    guard arguments.count == 3, let app = CurrentApp.shared else { fail("usage: write PATH TEXT (as an app)") }
    let url = URL(fileURLWithPath: arguments[1])
    do {
        try await app.files.write(Data(arguments[2].utf8), to: url)
        print("wrote \(url.path) class \(try app.files.protection(ofItemAt: url).fileClass.map(\.shortName) ?? "plain")")
    } catch { fail("\(error)", status: error is ProtectedFileError ? 3 : 1) }

case "database":
    // A database inside the app, as a Core Data store would be: 100 rows holding MARKER, class A.
    guard arguments.count == 3, let app = CurrentApp.shared else { fail("usage: database PATH MARKER (as an app)") }
    do {
        let db = try await ProtectedDatabase.open(at: URL(fileURLWithPath: arguments[1]), keybag: app.keybag, protection: .complete)
        let marker = arguments[2]
        try await db.write { d in
            try d.execute(sql: "CREATE TABLE IF NOT EXISTS t(v TEXT)")
            for i in 0..<100 { try d.execute(sql: "INSERT INTO t VALUES (?)", arguments: ["\(marker) \(i)"]) }
        }
        let count = try await db.read { d in try Int.fetchOne(d, sql: "SELECT count(*) FROM t") ?? 0 }
        print("rows \(count) served \(db.isServedByFileSystem ? "yes" : "no") class \(db.protectionClass.shortName)")
        try await db.close()
    } catch { fail("\(error)", status: error is ProtectedFileError ? 3 : 1) }

case "read":
    guard arguments.count == 2, let app = CurrentApp.shared else { fail("usage: read PATH (as an app)") }
    do {
        print(String(decoding: try await app.files.contents(of: URL(fileURLWithPath: arguments[1])), as: UTF8.self))
    } catch let error as ProtectedFileError {
        if case .unavailable = error { fail("\(error)", status: 3) }
        fail("\(error)")
    } catch { fail("\(error)") }

case "attack-keybag":
    // Everything an app must not do to the device, through the public API and through raw frames.
    guard let app = CurrentApp.shared else { fail("not an app") }
    var allowed: [String] = []
    func attempt(_ name: String, _ body: () async throws -> Void) async {
        do {
            try await body()
            allowed.append(name)
            print("\(name): ALLOWED")
        } catch {
            print("\(name): refused: \(error)")
        }
    }
    let passcode = arguments.count > 1 ? arguments[1] : "123456"
    await attempt("unlock") { try await app.keybag.unlock(passcode: passcode) }
    await attempt("erase") { try await app.keybag.erase() }
    await attempt("change-passcode") { try await app.keybag.changePasscode(from: passcode, to: "000000") }
    await attempt("remove-passcode") { try await app.keybag.removePasscode(current: passcode) }
    await attempt("set-grace-period") { try await app.keybag.setGracePeriod(3600) }
    await attempt("erase-after-ten-off") { try await app.keybag.setEraseAfterTenFailures(false) }
    await attempt("backup-password") { try await app.keybag.setBackupPassword("pw") }
    // lock() reports nothing: its effect is checked from outside.
    await app.keybag.lock()
    print("lock-state-after-lock: \(await app.keybag.lockState)")
    exit(allowed.isEmpty ? 0 : 1)

case "raw-op":
    // A hostile app's request on a keybag channel: OPCODE and a body given in hex (a key
    // wrapping copied from another container's file, say); prints the answer in hex.
    guard arguments.count >= 2, let op = UInt8(arguments[1]) else { fail("usage: raw-op OPCODE [BODY-HEX]") }
    let hex = arguments.count > 2 ? Array(arguments[2].utf8) : []
    let body = stride(from: 0, to: hex.count - 1, by: 2).compactMap { UInt8(String(decoding: hex[$0...$0 + 1], as: UTF8.self), radix: 16) }
    rawRequest(op: op, body: body)

case "raw-unlock":
    // FORMAT.md §10.3's test vector: the bytes of a channel request and of an unlock, as sent;
    // prints the answer in hex.
    rawUnlock()

case "wait-lock-event":
    // Subscribes to the device's protected-data events and waits (at most 30 s) for the lock.
    guard let app = CurrentApp.shared else { fail("not an app") }
    let events = await app.keybag.events()
    FileHandle.standardOutput.write(Data("subscribed\n".utf8))
    Task.detached { try? await Task.sleep(for: .seconds(30)); fail("no event within 30 s", status: 2) }
    for await event in events {
        print("event: \(event)")
        if event == .willBecomeUnavailable { exit(0) }
    }

case "defaults-hammer":
    // Sets PREFIX.0 … PREFIX.N-1 in the suite's defaults, one set at a time, then synchronizes.
    guard arguments.count == 4, let count = Int(arguments[3]), let defaults = ProtectedUserDefaults(suiteName: arguments[1]) else {
        fail("usage: defaults-hammer SUITE PREFIX COUNT (as a member app)")
    }
    for i in 0..<count {
        defaults.set(i, forKey: "\(arguments[2]).\(i)")
        if i % 100 == 99 { _ = defaults.synchronize() }
    }
    guard defaults.synchronize() else { fail("synchronize failed") }
    print("set \(count)")

case "defaults-count":
    // How many keys of the suite start with PREFIX.
    guard arguments.count == 3, let defaults = ProtectedUserDefaults(suiteName: arguments[1]) else { fail("usage: defaults-count SUITE PREFIX") }
    print(defaults.dictionaryRepresentation().keys.filter { $0.hasPrefix(arguments[2] + ".") }.count)

case "defaults-wait":
    // Waits (at most 30 s) until KEY holds VALUE, announced by a change notification.
    guard arguments.count == 4, let defaults = ProtectedUserDefaults(suiteName: arguments[1]) else { fail("usage: defaults-wait SUITE KEY VALUE") }
    let changes = defaults.changes()
    FileHandle.standardOutput.write(Data("waiting\n".utf8))   // unbuffered: the test reads it now
    Task.detached { try? await Task.sleep(for: .seconds(30)); fail("no change notification within 30 s", status: 2) }
    for await _ in changes where defaults.string(forKey: arguments[2]) == arguments[3] {
        print("notified: \(arguments[2]) = \(arguments[3])")
        exit(0)
    }

case "defaults-set":
    // With --exit-at-once: no synchronize, and the process exits the moment the value is set.
    let atOnce = arguments.last == "--exit-at-once"
    guard arguments.count == (atOnce ? 5 : 4), let defaults = ProtectedUserDefaults(suiteName: arguments[1]) else {
        fail("usage: defaults-set SUITE KEY VALUE [--exit-at-once]")
    }
    defaults.set(arguments[3], forKey: arguments[2])
    if atOnce { exit(0) }
    guard defaults.synchronize() else { fail("synchronize failed") }
    print("set")

case "counter-hammer":
    // Read-modify-write of a counter file COUNT times, coordinated or not.
    guard arguments.count >= 3, let count = Int(arguments[2]) else { fail("usage: counter-hammer PATH COUNT [--uncoordinated]") }
    let url = URL(fileURLWithPath: arguments[1])
    let coordinated = !arguments.contains("--uncoordinated")
    let coordinator = FileCoordinator()
    func increment(_ url: URL) throws {
        let value = Int(String(decoding: (try? Data(contentsOf: url)) ?? Data(), as: UTF8.self)) ?? 0
        for _ in 0..<50 { sched_yield() }   // a window as wide as real work leaves between read and write
        try Data(String(value + 1).utf8).write(to: url, options: .atomic)
    }
    for _ in 0..<count {
        if coordinated {
            try coordinator.coordinate(writingItemAt: url, options: .forMerging) { try increment($0) }
        } else {
            try increment(url)
        }
    }
    print("done")

case "present-wait":
    // Presents PATH and waits (at most 30 s) to be told another process changed it.
    guard arguments.count == 2 else { fail("usage: present-wait PATH") }
    final class Presenter: FilePresenter, @unchecked Sendable {
        let presentedItemURL: URL?
        init(_ url: URL) { presentedItemURL = url }
        func presentedItemDidChange() { print("changed"); exit(0) }
        func presentedItemWasDeleted() { print("deleted"); exit(0) }
        func presentedItemDidMove(to newURL: URL) { print("moved to \(newURL.path)"); exit(0) }
    }
    let presenter = Presenter(URL(fileURLWithPath: arguments[1]))
    FileCoordinator.addFilePresenter(presenter)
    FileHandle.standardOutput.write(Data("presenting\n".utf8))
    try? await Task.sleep(for: .seconds(30))
    fail("not told of a change within 30 s", status: 2)

case "coordinated-write":
    guard arguments.count == 3 else { fail("usage: coordinated-write PATH TEXT") }
    try FileCoordinator().coordinate(writingItemAt: URL(fileURLWithPath: arguments[1]), options: .forReplacing) { url in
        try Data(arguments[2].utf8).write(to: url, options: .atomic)
    }
    print("written")

case "open-in":
    // Asks the broker to open PATH in the app TARGET, showing NAME (hex of its bytes, so a test
    // can send any); exit 3 when the class is locked.
    guard arguments.count >= 3, let app = CurrentApp.shared else { fail("usage: open-in PATH TARGET [NAME-HEX] (as an app)") }
    let name = arguments.count > 3 ? String(decoding: stride(from: 0, to: arguments[3].count, by: 2).map {
        UInt8(arguments[3].dropFirst($0).prefix(2), radix: 16) ?? 0x5F
    }, as: UTF8.self) : nil
    do {
        try await app.open(URL(fileURLWithPath: arguments[1]), in: arguments[2], name: name)
        print("sent")
    } catch let error as SharingError {
        if case .protectedDataUnavailable = error { fail("\(error)", status: 3) }
        fail("\(error)")
    }

case "wait-opened":
    // Waits (at most 30 s) for COUNT opened URLs; prints each as "opened NAME from SENDER: CONTENT".
    guard arguments.count == 2, let count = Int(arguments[1]), let app = CurrentApp.shared else { fail("usage: wait-opened COUNT (as an app)") }
    FileHandle.standardOutput.write(Data("listening\n".utf8))
    let watchdog = Task { try await Task.sleep(for: .seconds(30)); fail("fewer than \(count) opened URLs within 30 s", status: 2) }
    var seen = 0
    for await opened in app.openedURLs {
        let content = (try? await app.files.contents(of: opened.url)).map { String(decoding: $0, as: UTF8.self) } ?? "<unreadable>"
        print("opened \(opened.url.lastPathComponent) from \(opened.sender) in \(opened.url.deletingLastPathComponent().path): \(content)")
        seen += 1
        if seen == count { break }
    }
    watchdog.cancel()

case "share":
    // Shares PATH with TARGET (a snapshot, or live with a third argument "live").
    guard arguments.count >= 3, let app = CurrentApp.shared else { fail("usage: share PATH TARGET [live] (as an app)") }
    do {
        try await app.share(URL(fileURLWithPath: arguments[1]), with: arguments[2], live: arguments.count > 3 && arguments[3] == "live")
        print("shared")
    } catch { fail("\(error)") }

case "wait-shared":
    // Waits for one shared item; reads it ("shared: …"), waits for a line on stdin, reads it again
    // ("again: …"), tries write(2) on its descriptor, ends the share and tries once more.
    let item = await firstSharedItem()
    do {
        FileHandle.standardOutput.write(Data("shared by \(item.provider): \(String(decoding: try await item.contents(), as: UTF8.self))\n".utf8))
        _ = readLine()
        print("again: \(String(decoding: try await item.contents(), as: UTF8.self))")
        let fd = try item.openDescriptor()
        let n = write(fd.rawValue, "XXXX", 4)
        print(n < 0 ? "write failed errno \(errno)" : "wrote \(n) bytes")
        try? fd.close()
        do { try await item.write(Data("overwritten".utf8)); print("write through the broker: done") } catch { print("write through the broker: \(error)") }
        try await item.endShare()
        do { _ = try await item.contents(); print("after end: read") } catch { print("after end: \(error)") }
        _ = item.startAccessingSecurityScopedResource() ? print("restart: started") : print("restart: refused")
    } catch { fail("\(error)", status: 6) }

case "hold-shared":
    // Waits for one shared item, opens its descriptor and reads it ("held: …"), tries to change
    // its mode and class ("chmod: …, class: …"); at each line on stdin, reads the same descriptor
    // again ("again: …", or "again: errno N"), or at "open" opens and reads another ("opened: …").
    let item = await firstSharedItem()
    do {
        let fd = try item.openDescriptor()
        func readAll() -> String {
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = pread(fd.rawValue, &buffer, buffer.count, 0)
            return n < 0 ? "errno \(errno)" : String(decoding: buffer[0..<n], as: UTF8.self)
        }
        FileHandle.standardOutput.write(Data("held: \(readAll())\n".utf8))
        // What a read-only share must refuse: a mode change and a class change on the descriptor.
        let chmodded = fchmod(fd.rawValue, 0o644) == 0 ? "ok" : "errno \(errno)"
        let none = Array("none".utf8)
        let reclassed = setAttributeOfDescriptor(fd.rawValue, "user.dataprotection.class", none, none.count, 0) == 0 ? "ok" : "errno \(errno)"
        FileHandle.standardOutput.write(Data("chmod: \(chmodded), class: \(reclassed)\n".utf8))
        var held: [FileDescriptor] = [fd]
        while let line = readLine() {
            if line == "open" {   // one more descriptor of the item, read from its start
                guard let again = try? item.openDescriptor() else { FileHandle.standardOutput.write(Data("opened: refused\n".utf8)); continue }
                held.append(again)
                var buffer = [UInt8](repeating: 0, count: 4096)
                let n = pread(again.rawValue, &buffer, buffer.count, 0)
                FileHandle.standardOutput.write(Data("opened: \(n < 0 ? "errno \(errno)" : String(decoding: buffer[0..<n], as: UTF8.self))\n".utf8))
                continue
            }
            FileHandle.standardOutput.write(Data("again: \(readAll())\n".utf8))
        }
        withExtendedLifetime(held) {}
    } catch { fail("\(error)", status: 6) }

case "granted-ops":
    // On a granted directory: tries every operation, and the escapes, one line each.
    guard arguments.count == 2, let app = CurrentApp.shared, let id = UUID(uuidString: arguments[1]) else { fail("usage: granted-ops GRANT-ID") }
    guard let item = try await app.grantedItems().first(where: { $0.id == id }), item.startAccessingSecurityScopedResource() else {
        fail("grant not usable", status: 5)
    }
    func line(_ name: String, _ body: () async throws -> String) async {
        do { print("\(name): ok \(try await body())") } catch { print("\(name): refused \(error)") }
    }
    await line("read") { String(decoding: try await item.contents(subpath: "a.txt"), as: UTF8.self) }
    await line("enumerate") { try item.contentsOfDirectory().map(\.name).joined(separator: ",") }
    await line("create") { try await item.createFile("new.txt", contents: Data("added".utf8)); return "" }
    await line("rename") { try item.rename(to: "b.txt", subpath: "a.txt"); return "" }
    await line("delete") { try item.remove(subpath: "old.txt"); return "" }
    await line("escape-read") { String(decoding: try await item.contents(subpath: "../BBB.txt"), as: UTF8.self) }
    await line("escape-create") { try await item.createFile("../evil.txt", contents: Data("x".utf8)); return "" }
    await line("escape-rename") { try item.rename(to: "../moved.txt", subpath: "a.txt"); return "" }
    await line("escape-delete") { try item.remove(subpath: "../BBB.txt"); return "" }
    await line("replace-by-rename") { try item.rename(to: "keep.txt", subpath: "b.txt"); return "" }

case "bookmark-save":
    // Keeps bookmark data for grant ID in FILE.
    guard arguments.count == 3, let app = CurrentApp.shared, let id = UUID(uuidString: arguments[1]) else { fail("usage: bookmark-save GRANT-ID FILE") }
    guard let item = try await app.grantedItems().first(where: { $0.id == id }) else { fail("grant \(id) not listed", status: 4) }
    try item.bookmarkData().write(to: URL(fileURLWithPath: arguments[2]))
    print("saved")

case "bookmark-read":
    // Resolves the bookmark in FILE and reads the item: "stale: yes|no" then the content.
    guard arguments.count == 2, let app = CurrentApp.shared else { fail("usage: bookmark-read FILE") }
    do {
        var stale = false
        let item = try await app.resolveBookmark(try Data(contentsOf: URL(fileURLWithPath: arguments[1])), bookmarkDataIsStale: &stale)
        guard item.startAccessingSecurityScopedResource() else { fail("could not start access", status: 5) }
        print("stale: \(stale ? "yes" : "no") at \(item.url.lastPathComponent): \(String(decoding: try await item.contents(), as: UTF8.self))")
    } catch { fail("\(error)", status: 6) }

case "granted":
    // Lists the grants made to this app: "ID PROVIDER CAPABILITIES LOCATION".
    guard let app = CurrentApp.shared else { fail("not an app") }
    for item in try await app.grantedItems() { print("\(item.id) \(item.provider) \(item.capabilities) \(item.url.path)") }

case "granted-exceed":
    // On a grant's descriptor, tries what no grant allows, one line each ("NAME: ok" or
    // "NAME: errno N"): reopening it for writing through /proc, truncating it by that path,
    // changing its mode, class, times and attributes.
    guard arguments.count == 2, let app = CurrentApp.shared, let id = UUID(uuidString: arguments[1]) else { fail("usage: granted-exceed GRANT-ID") }
    guard let item = try await app.grantedItems().first(where: { $0.id == id }), item.startAccessingSecurityScopedResource() else {
        fail("grant not usable", status: 5)
    }
    do {
        let fd = try item.openDescriptor().rawValue
        let path = "/proc/self/fd/\(fd)"
        func line(_ name: String, _ result: Int32) { print("\(name): \(result >= 0 ? "ok" : "errno \(errno)")") }
        let reopened = open(path, O_RDWR)
        line("reopen-write", reopened)
        if reopened >= 0 { _ = write(reopened, "PWND", 4); close(reopened) }
        line("reopen-append", { let fd = open(path, O_WRONLY | O_APPEND); if fd >= 0 { close(fd) }; return fd }())
        line("reopen-truncate", { let fd = open(path, O_RDONLY | O_TRUNC); if fd >= 0 { close(fd) }; return fd }())
        line("truncate-path", truncate(path, 0))
        line("chmod", fchmod(fd, 0o604))
        let raised = Array("A".utf8), mark = Array("1".utf8)
        line("class", setAttributeOfDescriptor(fd, "user.dataprotection.class", raised, raised.count, 0))
        line("attribute", setAttributeOfDescriptor(fd, "user.example", mark, mark.count, 0))
        var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000, tv_nsec: 0)]
        line("times", futimens(fd, &times))
    } catch { fail("\(error)", status: 6) }

case "granted-read", "granted-write", "granted-raw-write", "granted-read-unstarted", "granted-hold":
    // Uses grant ID: read it; write TEXT through the broker's descriptor; write(2) straight on
    // a read descriptor (prints the errno); read without starting; or start, say "started",
    // wait for a line on stdin, then try to read again.
    guard arguments.count >= 2, let app = CurrentApp.shared, let id = UUID(uuidString: arguments[1]) else { fail("usage: \(command) GRANT-ID [TEXT]") }
    guard let item = try await app.grantedItems().first(where: { $0.id == id }) else { fail("grant \(id) not listed", status: 4) }
    if command != "granted-read-unstarted" {
        guard item.startAccessingSecurityScopedResource() else { fail("could not start access", status: 5) }
    }
    do {
        switch command {
        case "granted-write":
            try await item.write(Data(arguments[2].utf8))
            print("written")
        case "granted-raw-write":
            let fd = try item.openDescriptor()
            let n = write(fd.rawValue, "XXXX", 4)
            print(n < 0 ? "write failed errno \(errno)" : "wrote \(n) bytes")
        case "granted-hold":
            FileHandle.standardOutput.write(Data("started: \(String(decoding: try await item.contents(), as: UTF8.self))\n".utf8))
            _ = readLine()
            print("again: \(String(decoding: try await item.contents(), as: UTF8.self))")
        default:
            print(String(decoding: try await item.contents(), as: UTF8.self))
        }
    } catch { fail("\(error)", status: 6) }
    item.stopAccessingSecurityScopedResource()

default:
    fail("unknown command \(command)")
}

/// Sends FORMAT.md §10.3's bytes on the supervisor socket and prints the answer in hex.
func rawUnlock() -> Never { rawRequest(op: 3, body: [0, 4, 0x31, 0x32, 0x33, 0x34]) }

/// Sends one keybag request (version 1, `op`, `body`) on a new channel and prints the answer in hex.
func rawRequest(op: UInt8, body: [UInt8]) -> Never {
    guard let text = ProcessInfo.processInfo.environment["DATAPROTECTION_SUPERVISOR_FD"], let control = Int32(text) else { fail("not an app") }
    func sendAll(_ fd: Int32, _ bytes: [UInt8]) { _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) } }
    sendAll(control, [0, 0, 0, 2, 1, 2])
    // One byte with a descriptor (SCM_RIGHTS).
    var byte: UInt8 = 0
    var channel: Int32 = -1
    let controlLength = 24   // CMSG_SPACE(sizeof(int))
    var controlBuffer = [UInt8](repeating: 0, count: controlLength)
    let received = withUnsafeMutablePointer(to: &byte) { bytePointer -> Int in
        var iov = iovec(iov_base: UnsafeMutableRawPointer(bytePointer), iov_len: 1)
        return controlBuffer.withUnsafeMutableBytes { cbuf -> Int in
            withUnsafeMutablePointer(to: &iov) { iovPointer -> Int in
                var message = msghdr(msg_name: nil, msg_namelen: 0, msg_iov: iovPointer, msg_iovlen: 1,
                                     msg_control: cbuf.baseAddress, msg_controllen: controlLength, msg_flags: 0)
                return recvmsg(control, &message, 0)
            }
        }
    }
    guard received == 1, byte == 0 else { fail("no channel") }
    channel = controlBuffer.withUnsafeBytes { $0.load(fromByteOffset: 16, as: Int32.self) }
    let length = UInt32(2 + body.count)
    sendAll(channel, [UInt8(length >> 24), UInt8(length >> 16 & 0xff), UInt8(length >> 8 & 0xff), UInt8(length & 0xff), 1, op] + body)
    var answer = [UInt8](repeating: 0, count: 4096)
    var total = 0
    while total < 4 || total < 4 + (Int(answer[0]) << 24 | Int(answer[1]) << 16 | Int(answer[2]) << 8 | Int(answer[3])) {
        let n = answer.withUnsafeMutableBytes { recv(channel, $0.baseAddress! + total, $0.count - total, 0) }
        if n <= 0 { break }
        total += n
    }
    print(answer[0..<total].map { String(format: "%02x", $0) }.joined())
    exit(0)
}

/// `fsetxattr(2)` (not in Swift's Glibc module).
@_silgen_name("fsetxattr")
func setAttributeOfDescriptor(_ fd: Int32, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer, _ size: Int, _ flags: Int32) -> Int32

/// Says "listening", waits (at most 30 s) for the first item shared with this app and starts
/// accessing it.
func firstSharedItem() async -> SecurityScopedURL {
    guard let app = CurrentApp.shared else { fail("not an app") }
    FileHandle.standardOutput.write(Data("listening\n".utf8))
    let watchdog = Task { try await Task.sleep(for: .seconds(30)); fail("nothing shared within 30 s", status: 2) }
    var items = app.sharedItems.makeAsyncIterator()
    guard let item = await items.next() else { fail("the supervisor ended") }
    watchdog.cancel()
    guard item.startAccessingSecurityScopedResource() else { fail("could not start access", status: 5) }
    return item
}
