// queue-example: Apple's BackgroundQueueSample ("Task Completion"), rebuilt — a queue of
// 60 items processed one per second into a class-B journal, the badge counting down; the home
// button half-way, a background task that keeps it running, a lock meanwhile; then a second run
// whose short budget runs out: the expiration handler fires and the app is suspended with items
// left, and resumes when it comes back to the front.
//
//   swift run queue-example              sets up a device in a temporary directory
//   swift run queue-example --root DIR   uses (and keeps) DIR
//
// The same executable plays the app: the supervisor (what `dpctl app run` is) starts it again as
// `queue-example app`, sandboxed. Time is a virtual clock the example advances, so one "second"
// of the sample takes no real time.
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionLifecycle
import Foundation
import Logging
import SystemPackage

// The libraries' log lines (unlocked, locked…) are not the example's output: warnings only.
LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = .warning
    return handler
}

let arguments = Array(CommandLine.arguments.dropFirst())

func say(_ text: String) { FileHandle.standardOutput.write(Data((text + "\n").utf8)) }
func fail(_ text: String) -> Never {
    FileHandle.standardError.write(Data("queue-example: \(text)\n".utf8))
    exit(1)
}

if arguments.first == "app" {
    try await runApp()
} else {
    try await runDemo()
}
exit(0)

// MARK: - The app (sandboxed, under the supervisor)

/// The sample's app: a queue of 60 items, one processed per second on a thread of its own; a
/// background task begun in `willResignActive` and ended in `didBecomeActive` (the pair that
/// also fires for the sleep button, which is why the sample chose it) or when the queue empties.
func runApp() async throws {
    guard let app = CurrentApp.shared, let lifecycle = AppLifecycle.shared else {
        fail("run me through the supervisor")
    }
    /// `@unchecked Sendable`: every access is under `lock`.
    final class TaskBox: @unchecked Sendable {
        let lock = NSLock()
        var id = BackgroundTaskIdentifier.invalid
        func take() -> BackgroundTaskIdentifier {
            lock.withLock {
                defer { id = .invalid }; return id
            }
        }
        func set(_ new: BackgroundTaskIdentifier) { lock.withLock { id = new } }
    }
    let task = TaskBox()
    let remainingItems = Int(arguments.dropFirst().first ?? "60") ?? 60
    lifecycle.addObserver { event in
        say("event \(event)")
        switch event {
        case .willResignActive:
            let id = lifecycle.beginBackgroundTask(withName: "queue") {
                let ending = task.take()
                say("expired! (the expiration handler ends the task)")
                lifecycle.endBackgroundTask(ending)
            }
            task.set(id)
            say("beginBackgroundTask → \(id)")
        case .didBecomeActive:
            let id = task.take()
            if id != .invalid {
                lifecycle.endBackgroundTask(id)
                say("endBackgroundTask \(id) (back in front)")
            }
        case .willTerminate:
            exit(0)
        default:
            break
        }
    }
    // The journal is class B, opened now: it stays writable after a lock (Apple's advice for
    // apps that work in the background); the secret is class A.
    let journalURL = app.documents.appendingPathComponent("journal.txt")
    try await app.files.write(Data(), to: journalURL, protection: .completeUnlessOpen)
    let journal = try await app.files.openHandle(forUpdating: journalURL)
    let secret = app.documents.appendingPathComponent("secret.txt")
    var remaining = remainingItems
    say("badge \(remaining)")
    while true {
        let deadline = lifecycle.clock.now().addingTimeInterval(1)
        say("@wait \(deadline.timeIntervalSince1970)")
        try await lifecycle.clock.sleep(until: deadline)
        guard remaining > 0 else { continue }   // the sample's idle loop: look again in a second
        remaining -= 1
        try await journal.write(Data("item \(remainingItems - remaining)\n".utf8), at: try await journal.size())
        say("badge \(remaining)")
        if remaining == 9 {
            let read: String
            do { read = "read (\(try await app.files.contents(of: secret).count) bytes)" } catch ProtectedFileError
                .unavailable
            {
                read = "unavailable (locked)"
            }
            say("class-A read: \(read); class-B journal written: item \(remainingItems - remaining)")
        }
        if remaining == 0 {
            // Said first: once its last task ends in the background, the app may be suspended
            // at any instruction.
            let id = task.take()
            say("queue empty" + (id != .invalid ? " → endBackgroundTask \(id)" : ""))
            if id != .invalid { lifecycle.endBackgroundTask(id) }
        }
    }
}

// MARK: - The demo (the user, the device and the supervisor)

func runDemo() async throws {
    var root = NSTemporaryDirectory() + "queue-example-" + UUID().uuidString
    if let index = arguments.firstIndex(of: "--root"), index + 1 < arguments.count { root = arguments[index + 1] }
    let clock = ManualClock()
    let keybag = try await Keybag.create(
        root: root, passcode: "123456", kdf: .calibrated(), gracePeriod: 10, clock: clock)
    try await keybag.unlock(passcode: "123456")
    let files = ProtectedFileManager(keybag: keybag)
    let manager = ContainerManager(files: files)
    let queue = try await manager.install(try AppIdentifier("com.example.queue"))
    try await files.write(
        Data("class A".utf8), to: queue.documents.appendingPathComponent("secret.txt"), protection: .complete)
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    let start = clock.now()
    func stamp() -> String { String(format: "t=%4.0fs", clock.now().timeIntervalSince(start)) }

    say("queue-example: Apple's BackgroundQueueSample (Task Completion), a sandboxed app under the supervisor")
    say("device in \(root); virtual clock; grace period 10 s")

    /// Runs the app once; `script` is called with each badge it shows and may act (the user).
    /// `script` returns a line to wait for before the clock moves on (the app's answer to what
    /// the user just did), or `nil`.
    func run(
        budget: TimeInterval, items: Int, _ script: @escaping (Int, LifecycleService) async throws -> String?
    ) async throws -> [String: String] {
        let lifecycle = LifecycleService(
            manager: manager, settings: LifecycleSettings(backgroundTimeBudget: budget), clock: clock)
        let supervisor = AppSupervisor(
            manager: manager, services: [lifecycle], fileSystem: ContainerFileSystem.inProcess(manager))
        let output = Pipe()
        let writeEnd = output.fileHandleForWriting.fileDescriptor
        let run = Task {
            try await supervisor.run(
                queue.identifier, command: [me, "app", String(items)],
                standardInput: FileDescriptor(rawValue: open("/dev/null", O_RDONLY)),
                standardOutput: FileDescriptor(rawValue: writeEnd))
        }
        var facts: [String: String] = [:]
        var badge = items
        let lines = LineReader(output.fileHandleForReading.fileDescriptor)
        var hold: (line: String, target: Date)?
        func advance(to target: Date) {
            if target > clock.now() { clock.advance(by: target.timeIntervalSince(clock.now())) }
        }
        var ownCopyClosed = false
        while let line = await lines.next() {
            if !ownCopyClosed {
                // The app has its copy of the pipe now: ours closed, its exit ends the lines.
                try output.fileHandleForWriting.close()
                ownCopyClosed = true
            }
            if line.hasPrefix("@wait "), let due = Double(line.dropFirst(6)) {
                let target = Date(timeIntervalSince1970: due)
                if let awaited = try await script(badge, lifecycle) {
                    hold = (awaited, target)
                } else {
                    advance(to: target)
                }
                continue
            }
            if line.hasPrefix("badge "), let value = Int(line.dropFirst(6)) {
                badge = value
                if value % 10 == 0 {
                    say("\(stamp())  badge \(String(value).padding(toLength: 3, withPad: " ", startingAt: 0))")
                }
                continue
            }
            say("\(stamp())  badge \(String(badge).padding(toLength: 3, withPad: " ", startingAt: 0)) app: \(line)")
            if line.hasPrefix("class-A read:") { facts["class A"] = String(line.dropFirst(14)) }
            if line.hasPrefix("queue empty") { facts["queue empty"] = stamp() }
            if line.hasPrefix("expired!") { facts["expired"] = "badge \(badge)" }
            if let held = hold, line == held.line {
                hold = nil
                advance(to: held.target)
            }
            // Its task just ended in the background: the supervisor suspends it (no more lines
            // until the user brings it back or stops it).
            if line.hasPrefix("queue empty") || line.hasPrefix("expired!"),
                lifecycle.states(of: queue.identifier).first != .active
            {
                await lifecycle.wait(until: queue.identifier, is: .suspended)
                facts["suspended at badge"] = String(badge)
                say(
                    "\(stamp())            suspended by the supervisor (\(lifecycle.status(of: queue.identifier).first?.suspension ?? "?")): no CPU at all"
                )
                _ = try await script(-1, lifecycle)
            }
        }
        let status = try await run.value
        facts["exit"] = String(status)
        return facts
    }

    // Run 1: iOS 4's 10 minutes.
    say("")
    say("run 1: 60 items, a background budget of 600 s (iOS 4's 10 minutes)")
    var pressed = false, locked = false
    let first = try await run(budget: 600, items: 60) { badge, lifecycle in
        if badge == 30, !pressed {
            pressed = true
            say("\(stamp())  badge 30  the user presses the home button")
            lifecycle.moveToBackground(queue.identifier)
            return "event didEnterBackground"
        }
        if badge == 20, !locked {
            locked = true
            say(
                "\(stamp())  badge 20  the device locks (class-A keys go 10 s later; class-B files opened before stay writable)"
            )
            await keybag.lock()
        }
        if badge == -1 {
            say(
                "\(stamp())            the user unlocks (the app was sent home, so it stays in the background), then stops it"
            )
            try await keybag.unlock(passcode: "123456")
            lifecycle.terminateAll()
        }
        return nil
    }
    let journal = String(
        decoding: try await files.contents(of: queue.documents.appendingPathComponent("journal.txt")), as: UTF8.self)
    let written = journal.split(separator: "\n").count

    // Run 2: a short budget runs out.
    say("")
    say("run 2: 60 items, a background budget of 20 s (the handler is called 5 s before its end)")
    var pressed2 = false, resumed = false
    let second = try await run(budget: 20, items: 60) { badge, lifecycle in
        if badge == 50, !pressed2 {
            pressed2 = true
            say("\(stamp())  badge 50  the user presses the home button")
            lifecycle.moveToBackground(queue.identifier)
            return "event didEnterBackground"
        }
        if badge == -1, !resumed {
            resumed = true
            say("\(stamp())            the user brings the app back: it resumes where it stopped")
            try lifecycle.moveToForeground(queue.identifier)
        }
        if badge == 0, resumed {
            lifecycle.terminateAll()
        }
        return nil
    }
    let ok1 = first["class A"]?.hasPrefix("unavailable") == true && written == 60 && first["suspended at badge"] == "0"
    let ok2 =
        second["expired"] != nil && (Int(second["suspended at badge"] ?? "0") ?? 0) > 0 && second["queue empty"] != nil

    say("")
    say("WHAT                                   ON iOS                                      HERE")
    say(
        "home button with a task running        keeps running, up to 10 minutes             "
            + (first["queue empty"].map { "kept running; queue empty at \($0)" } ?? "DID NOT FINISH"))
    say(
        "device locked meanwhile                runs on while asleep (up to the limit)      kept running; "
            + (first["class A"] ?? "no class-A read"))
    say(
        "class-B journal after the lock         writable (opened before the lock)           \(written) of 60 items written"
    )
    say(
        "task ended, app in the background      suspended                                   "
            + (first["suspended at badge"] != nil
                ? "suspended (\(first["suspended at badge"] == "0" ? "queue empty" : "items left"))" : "NOT SUSPENDED"))
    say(
        "budget runs out                        expiration handler, then suspended          "
            + (second["expired"].map { "handler at \($0); suspended at badge \(second["suspended at badge"] ?? "?")" }
                ?? "NO HANDLER"))
    say(
        "back in front                          resumes                                     "
            + (second["queue empty"].map { "resumed; queue empty at \($0)" } ?? "DID NOT RESUME"))
    if !arguments.contains("--root") { try? FileManager.default.removeItem(atPath: root) }
    guard ok1, ok2 else { fail("the sample did not behave as Apple describes it") }
    say("done: the task kept the queue going in the background and across a lock, and an app without one was suspended")
}

/// Lines from a descriptor, read on a thread of their own (the supervisor's timers need the tasks).
/// `@unchecked Sendable`: `fd` never changes, and one `next()` runs at a time (its caller awaits it).
final class LineReader: @unchecked Sendable {
    let fd: Int32
    init(_ fd: Int32) { self.fd = fd }
    func next() async -> String? {
        await withCheckedContinuation { continuation in
            Thread { [fd] in
                var line: [UInt8] = []
                var byte: UInt8 = 0
                while true {
                    let n = read(fd, &byte, 1)
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 {
                        continuation.resume(returning: line.isEmpty ? nil : String(decoding: line, as: UTF8.self));
                        return
                    }
                    if byte == 0x0A { continuation.resume(returning: String(decoding: line, as: UTF8.self)); return }
                    line.append(byte)
                }
            }.start()
        }
    }
}
