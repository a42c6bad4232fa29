// notes-example: two small apps of one App Group share a note — through the group container
// (a protected file, written and read under file coordination) and the group's preferences —
// each confined in its own sandbox, as `dpctl app run` would run them.
//
//   swift run notes-example              sets up a device in a temporary directory and runs both
//   swift run notes-example --root DIR   uses (and keeps) DIR
//
// The same executable plays the two apps: the supervisor starts it again as
// `notes-example writer TEXT` and `notes-example reader`.
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import Foundation
import Logging

// The libraries' log lines (unlocked, locked…) are not the example's output: warnings only.
LoggingSystem.bootstrap { label in
    var handler = StreamLogHandler.standardError(label: label)
    handler.logLevel = .warning
    return handler
}

let group = "group.com.example.notes"
let arguments = Array(CommandLine.arguments.dropFirst())

func say(_ text: String) { FileHandle.standardOutput.write(Data((text + "\n").utf8)) }
func fail(_ text: String) -> Never {
    FileHandle.standardError.write(Data("notes-example: \(text)\n".utf8))
    exit(1)
}

switch arguments.first {
case "writer":
    // Inside the writer's sandbox.
    guard let app = CurrentApp.shared,
        let shared = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: group),
        let defaults = ProtectedUserDefaults(suiteName: group)
    else { fail("run me through the supervisor") }
    let note = shared.appendingPathComponent("Notes/shopping.txt")
    try FileManager.default.createDirectory(at: note.deletingLastPathComponent(), withIntermediateDirectories: true)
    let text = arguments.dropFirst().joined(separator: " ")
    let coordinator = FileCoordinator()
    // A coordinated write: a reader in the other app never sees half a note.
    try await coordinator.coordinate(writingItemAt: note, options: .forReplacing) { url in
        try await app.files.write(Data(text.utf8), to: url)
    }
    defaults.set(app.identifier.rawValue, forKey: "lastEditor")
    defaults.set(defaults.integer(forKey: "edits") + 1, forKey: "edits")
    guard defaults.synchronize() else { fail("the group's preferences could not be written") }
    let cls = try app.files.protection(ofItemAt: note).fileClass.map { "\($0)" } ?? "plain"
    say("[\(app.identifier)] wrote \"\(text)\" to the group container (class \(cls))")

case "reader":
    guard let app = CurrentApp.shared,
        let shared = FileManager.default.containerURL(forSecurityApplicationGroupIdentifier: group),
        let defaults = ProtectedUserDefaults(suiteName: group)
    else { fail("run me through the supervisor") }
    let note = shared.appendingPathComponent("Notes/shopping.txt")
    let text = try await FileCoordinator().coordinate(readingItemAt: note) { url in
        String(decoding: try await app.files.contents(of: url), as: UTF8.self)
    }
    say(
        "[\(app.identifier)] read \"\(text)\" — last edited by \(defaults.string(forKey: "lastEditor") ?? "?"), \(defaults.integer(forKey: "edits")) edit(s)"
    )
    // The writer's own container is out of reach, even knowing its path.
    if let writerHome = arguments.dropFirst().first {
        let reachable = FileManager.default.isReadableFile(atPath: writerHome + "/Documents")
        say(
            "[\(app.identifier)] the writer's container is \(reachable ? "READABLE (not confined!)" : "out of reach, as on iOS")"
        )
        if reachable { exit(1) }
    }

default:
    // The device and the two apps, then each app in its sandbox.
    var root: String
    if let index = arguments.firstIndex(of: "--root"), index + 1 < arguments.count {
        root = arguments[index + 1]
    } else {
        root = NSTemporaryDirectory() + "notes-example-" + UUID().uuidString
    }
    let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .calibrated())
    try await keybag.unlock(passcode: "123456")
    let manager = ContainerManager(files: ProtectedFileManager(keybag: keybag))
    let writer = try await manager.install(
        try AppIdentifier("com.example.notes.writer"), defaultProtection: .complete,
        groups: [try AppGroupIdentifier(group)])
    let reader = try await manager.install(
        try AppIdentifier("com.example.notes.reader"), groups: [try AppGroupIdentifier(group)])
    // A group container starts at iOS's default class: give it the apps' (as on iOS).
    try await manager.setDefaultProtection(.completeUnlessOpen, ofGroup: try AppGroupIdentifier(group))
    say("device in \(root); installed \(writer.identifier) and \(reader.identifier), both in \(group)")

    let supervisor = AppSupervisor(manager: manager, fileSystem: ContainerFileSystem.inProcess(manager))
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    do {
        guard try await supervisor.run(writer.identifier, command: [me, "writer", "milk, eggs, coffee"]) == 0,
            try await supervisor.run(reader.identifier, command: [me, "reader", writer.url.path]) == 0
        else { fail("an app failed") }
    } catch {
        fail("\(error)")
    }
    if !arguments.contains("--root") { try? FileManager.default.removeItem(atPath: root) }
    say("done: two sandboxed apps shared a protected note and their preferences through their App Group")
}
