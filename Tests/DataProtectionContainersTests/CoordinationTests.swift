import DataProtectionContainers
import DataProtectionTestSupport
import Foundation
import Testing

/// File coordination between two member apps of a group, each in its own sandbox.
@Suite(.serialized) struct CoordinationTests {
    func hammer(_ world: AppWorld, _ counter: String, coordinated: Bool) throws -> Int {
        let extra = coordinated ? [] : ["--uncoordinated"]
        let runs = try ["com.example.one", "com.example.two"].map { try world.start($0, ["counter-hammer", counter, "1000"] + extra) }
        for (process, _) in runs { process.waitUntilExit(); #expect(process.terminationStatus == 0) }
        return Int(try world.dpctl(["cat", counter, "--passcode-file", world.passcode]).out) ?? -1   // a protected file on disk
    }

    @Test func readModifyWriteFromTwoProcessesLosesNothingWhenCoordinated() throws {
        let world = try AppWorld.make()
        try world.install("com.example.one", ["--group", "group.com.example.shared"])
        try world.install("com.example.two", ["--group", "group.com.example.shared"])
        let group = try world.groupContainer(of: "com.example.one", "group.com.example.shared")
        #expect(try hammer(world, group + "/counter", coordinated: true) == 2000)
        // The same work without coordination loses updates: the test above can fail.
        let lost = try hammer(world, group + "/uncoordinated-counter", coordinated: false)
        #expect(lost < 2000, "2000 increments uncoordinated lost nothing: the race was not exercised")
    }

    @Test func aPresenterInAnotherAppHearsOfACoordinatedChange() throws {
        let world = try AppWorld.make()
        try world.install("com.example.one", ["--group", "group.com.example.shared"])
        try world.install("com.example.two", ["--group", "group.com.example.shared"])
        let note = try world.groupContainer(of: "com.example.one", "group.com.example.shared") + "/note.txt"
        try Data("v1".utf8).write(to: URL(fileURLWithPath: note))
        let (presenter, out) = try world.start("com.example.two", ["present-wait", note])
        #expect(try readLine(out.fileHandleForReading) == "presenting")
        #expect(try world.testApp("com.example.one", ["coordinated-write", note, "v2"]).out == "written\n")
        presenter.waitUntilExit()
        #expect(presenter.terminationStatus == 0)
        #expect(String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "changed\n")
        #expect(try world.dpctl(["cat", note, "--passcode-file", world.passcode]).out == "v2")
    }

    @Test func presentersInThisProcessHearOfOthersButNotOfThemselves() throws {
        let dir = temporaryDirectory()
        let item = dir.appendingPathComponent("doc.txt")
        try Data("a".utf8).write(to: item)
        final class Recorder: FilePresenter, @unchecked Sendable {
            let presentedItemURL: URL?
            let lock = NSLock()
            var events: [String] = []
            init(_ url: URL) { presentedItemURL = url }
            func presentedItemDidChange() { lock.withLock { events.append("changed") } }
            func presentedItemWasDeleted() { lock.withLock { events.append("deleted") } }
            func presentedItemDidMove(to newURL: URL) { lock.withLock { events.append("moved:" + newURL.lastPathComponent) } }
        }
        let mine = Recorder(item), other = Recorder(item)
        FileCoordinator.addFilePresenter(mine)
        FileCoordinator.addFilePresenter(other)
        defer { FileCoordinator.removeFilePresenter(mine); FileCoordinator.removeFilePresenter(other) }
        try FileCoordinator(filePresenter: mine).coordinate(writingItemAt: item) { try Data("b".utf8).write(to: $0) }
        #expect(mine.lock.withLock { mine.events }.isEmpty)
        #expect(other.lock.withLock { other.events } == ["changed"])
        let moved = dir.appendingPathComponent("renamed.txt")
        try FileCoordinator().coordinate(writingItemAt: item, options: .forMoving) { url in
            try FileManager.default.moveItem(at: url, to: moved)
            FileCoordinator().item(at: url, didMoveTo: moved)
        }
        #expect(other.lock.withLock { other.events } == ["changed", "moved:renamed.txt"])
        // Readers share: a read inside another read does not wait.
        let coordinator = FileCoordinator()
        let nested = try coordinator.coordinate(readingItemAt: moved) { _ in
            try coordinator.coordinate(readingItemAt: moved) { try String(contentsOf: $0, encoding: .utf8) }
        }
        #expect(nested == "b")
        let atNewPlace = Recorder(moved)
        FileCoordinator.addFilePresenter(atNewPlace)
        defer { FileCoordinator.removeFilePresenter(atNewPlace) }
        try FileCoordinator().coordinate(writingItemAt: moved, options: .forDeleting) { try FileManager.default.removeItem(at: $0) }
        #expect(atNewPlace.lock.withLock { atNewPlace.events } == ["deleted"])
    }
}
