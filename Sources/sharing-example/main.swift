// sharing-example: test apps for iOS's ways of sharing files, rebuilt — the ways iOS apps share files, each run
// between real sandboxed apps, with what happened on iOS beside what happens here.
//
//   swift run sharing-example              sets up a device in a temporary directory
//   swift run sharing-example --root DIR   uses (and keeps) DIR
//
// The same executable plays every app: the supervisor starts it again as `sharing-example ROLE`.
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSharing
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
    FileHandle.standardError.write(Data("sharing-example: \(text)\n".utf8))
    exit(1)
}
/// One result line for the table: "ROW|here".
func report(_ row: String, _ text: String) { say("RESULT \(row)|\(text)") }
func text(_ data: Data) -> String { String(decoding: data, as: UTF8.self) }

guard let role = arguments.first, role != "--root" else {
    try await runAll()
    exit(0)
}
guard let app = CurrentApp.shared else { fail("run me through the supervisor") }

switch role {
case "test6-open-in":
    // test6: writes tmp/XXX.txt and opens it in test7 (UIDocumentInteractionController).
    let file = app.temporaryDirectory.appendingPathComponent("XXX.txt")
    try await app.files.write(Data("AAAA".utf8), to: file)
    try await app.open(file, in: "com.example.test7")
    try await app.files.write(Data("changed after sending".utf8), to: file)

case "test7":
    // test7: scene(_:openURLContexts:).
    for await opened in app.openedURLs {
        let content = text(try await app.files.contents(of: opened.url))
        let name = opened.url.deletingLastPathComponent().lastPathComponent + "/" + opened.url.lastPathComponent
        report("open-in", "its own copy in Documents/\(name): \"\(content)\"; test6's later write not seen")
        break
    }

case "test6-share":
    // test6 again, choosing test8's Share extension this time.
    let file = app.temporaryDirectory.appendingPathComponent("XXX.txt")
    try await app.files.write(Data("AAAA".utf8), to: file)
    try await app.share(file, with: "com.example.test8")
    try await app.files.write(Data("a secret written after sharing".utf8), to: file)

case "test8":
    // test8: a Share extension; loadItem gives it the sender's file.
    for await item in app.sharedItems {
        guard item.startAccessingSecurityScopedResource() else { fail("could not start access") }
        let content = text(try await item.contents())
        let write: String
        do { try await item.write(Data("BBBB".utf8)); write = "write WORKED" } catch { write = "write refused" }
        try await item.endShare()
        let after = (try? await item.contents()) == nil ? "no access after the share" : "STILL READABLE after the share"
        report(
            "share extension", "read-only snapshot: \"\(content)\" (the later write stays private); \(write); \(after)")
        break
    }

case "test9":
    // test9: a File Provider whose item says [.allowsReading, .allowsRenaming].
    let storage = app.url.appendingPathComponent("Documents/File Provider Storage/id2", isDirectory: true)
    try FileManager.default.createDirectory(at: storage, withIntermediateDirectories: true)
    let item = storage.appendingPathComponent("BBB.txt")
    try await app.files.write(Data("CCCC".utf8), to: item)
    let id = try await app.grant(item, to: "com.example.test10", capabilities: [.reading, .renaming], persistent: true)
    say("test9 granted \(id)")

case "test10":
    // test10: UIDocumentPickerViewController(.open), then startAccessingSecurityScopedResource().
    for item in try await app.grantedItems() {
        let before = (try? await item.contents()) == nil ? "nothing before start" : "READABLE before start"
        guard item.startAccessingSecurityScopedResource() else { fail("could not start access") }
        defer { item.stopAccessingSecurityScopedResource() }
        let content = text(try await item.contents())
        var write = "write refused (EBADF/not granted)"
        if let fd = try? item.openDescriptor(), Glibc.write(fd.rawValue, "XXXX", 4) == 4 { write = "write WORKED" }
        do { try await item.write(Data("XXXX".utf8)); write = "write WORKED" } catch {}
        let row = item.provider == "com.example.test9" ? "file provider" : "document browser"
        report(row, "\(before); read \"\(content)\"; \(write); now \"\(text(try await item.contents()))\"")
    }

case "test11":
    // test11: a document-based app (UISupportsDocumentBrowser = YES): its Documents is exposed.
    try await app.files.write(Data("draft".utf8), to: app.documents.appendingPathComponent("report.txt"))

default:
    fail("unknown role \(role)")
}

/// The device, the apps, and each crossing in turn; then the table.
func runAll() async throws {
    var root = NSTemporaryDirectory() + "sharing-example-" + UUID().uuidString
    if let index = arguments.firstIndex(of: "--root"), index + 1 < arguments.count { root = arguments[index + 1] }
    let keybag = try await Keybag.create(root: root, passcode: "123456", kdf: .calibrated())
    try await keybag.unlock(passcode: "123456")
    let manager = ContainerManager(files: ProtectedFileManager(keybag: keybag))
    for n in [6, 7, 8, 9, 10, 12] { _ = try await manager.install(try AppIdentifier("com.example.test\(n)")) }
    _ = try await manager.install(try AppIdentifier("com.example.test11"), documentBrowser: true)
    say("device in \(root); installed test6 … test12 (test11 with the document browser)")

    let supervisor = AppSupervisor(
        manager: manager, services: [SharingService(manager: manager)],
        fileSystem: ContainerFileSystem.inProcess(manager))
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var results: [String: String] = [:]
    func run(_ app: String, _ role: String) async throws {
        let output = Pipe()
        // The app's standard output is this process's: collect RESULT lines by running it through a pipe.
        let saved = dup(1)
        dup2(output.fileHandleForWriting.fileDescriptor, 1)
        let status = try await supervisor.run(try AppIdentifier("com.example.\(app)"), command: [me, role])
        dup2(saved, 1)
        close(saved)
        try output.fileHandleForWriting.close()
        for line in text(output.fileHandleForReading.readDataToEndOfFile()).split(separator: "\n") {
            if line.hasPrefix("RESULT "), let bar = line.firstIndex(of: "|") {
                results[String(line[line.index(line.startIndex, offsetBy: 7)..<bar])] = String(
                    line[line.index(after: bar)...])
            } else {
                say(String(line))
            }
        }
        guard status == 0 else { fail("\(app) (\(role)) exited with \(status)") }
    }
    try await run("test6", "test6-open-in")
    try await run("test7", "test7")
    try await run("test6", "test6-share")
    try await run("test8", "test8")
    try await run("test9", "test9")
    try await run("test11", "test11")
    // The user grants test10 an item of test11's exposed Documents; test12 exposes nothing.
    let broker = SharingBroker(manager: manager)
    _ = try broker.grant(
        "Documents/report.txt", from: try AppIdentifier("com.example.test11"),
        to: try AppIdentifier("com.example.test10"),
        capabilities: [.reading], persistent: true)
    let refused: String
    do {
        _ = try broker.grant(
            "Documents/x", from: try AppIdentifier("com.example.test12"), to: try AppIdentifier("com.example.test10"),
            capabilities: [.reading])
        refused = "test12's Documents WAS GRANTED without exposure"
    } catch { refused = "an app without the entitlement: refused" }
    try await run("test10", "test10")
    results["document browser", default: "?"] += "; \(refused)"

    let rows: [(String, String, String)] = [
        ("open-in", "test6 → test7", "transitd copied the file into test7's Documents/Inbox"),
        ("share extension", "test6 → test8", "test8 read test6's own file and saw its later writes"),
        ("file provider", "test9 → test10", "capabilities [reading, renaming], yet test10 wrote \"XXXX\""),
        ("document browser", "test11 → test10", "UISupportsDocumentBrowser (Xcode's default) exposed all of Documents"),
    ]
    say("")
    say("CROSSING          APPS              ON iOS          ")
    say("                                    HERE")
    for (key, apps, ios) in rows {
        say(
            key.padding(toLength: 18, withPad: " ", startingAt: 0)
                + apps.padding(toLength: 18, withPad: " ", startingAt: 0) + ios)
        say(String(repeating: " ", count: 36) + (results[key] ?? "NO RESULT"))
    }
    if !arguments.contains("--root") { try? FileManager.default.removeItem(atPath: root) }
    let failed = rows.filter {
        results[$0.0] == nil || results[$0.0]!.contains("WORKED") || results[$0.0]!.contains("STILL")
            || results[$0.0]!.contains("WAS GRANTED")
    }
    guard failed.isEmpty else { fail("a pitfall is open: \(failed.map(\.0))") }
    say("done: every crossing went through the broker, and each known pitfall is closed")
}
