import DataProtection
import DataProtectionTestSupport
import Foundation
import Testing

@Suite struct InheritanceAndCopyTests {
    @Test func newFilesInheritTheNearestAncestorsDefault() async throws {
        let device = try await TestDevice.make()
        let outer = device.url("outer"), inner = outer.appendingPathComponent("inner")
        try FileManager.default.createDirectory(at: inner, withIntermediateDirectories: true)
        // Nothing set: iOS's default, class C.
        try await device.files.write(Data("a".utf8), to: outer.appendingPathComponent("a"), protection: nil)
        #expect(try device.files.protection(ofItemAt: outer.appendingPathComponent("a")) == .protected(.completeUntilFirstUserAuthentication))

        try await device.files.setProtection(.complete, ofItemAt: outer)
        #expect(try device.files.protection(ofItemAt: outer) == .directory(defaultClass: .complete))
        // Setting a directory's class leaves the files already in it alone.
        #expect(try device.files.protection(ofItemAt: outer.appendingPathComponent("a")) == .protected(.completeUntilFirstUserAuthentication))
        try await device.files.write(Data("b".utf8), to: inner.appendingPathComponent("b"), protection: nil)
        #expect(try device.files.protection(ofItemAt: inner.appendingPathComponent("b")) == .protected(.complete))

        try await device.files.setProtection(.noProtection, ofItemAt: inner)
        try await device.files.write(Data("c".utf8), to: inner.appendingPathComponent("c"), protection: nil)
        #expect(try device.files.protection(ofItemAt: inner.appendingPathComponent("c")) == .protected(.noProtection))
        // An explicit class wins.
        try await device.files.write(Data("d".utf8), to: inner.appendingPathComponent("d"), protection: .completeUnlessOpen)
        #expect(try device.files.protection(ofItemAt: inner.appendingPathComponent("d")) == .protected(.completeUnlessOpen))
    }

    @Test func overwritingWithoutAClassNeverLowersIt() async throws {
        let device = try await TestDevice.make()
        let url = device.url("keep")
        try await device.files.write(Data("1".utf8), to: url, protection: .complete)
        try await device.files.write(Data("2".utf8), to: url, options: [])
        #expect(try device.files.protection(ofItemAt: url) == .protected(.complete))
    }

    @Test func oneCallReprotectsATreeWithProgress() async throws {
        let device = try await TestDevice.make()
        let tree = device.url("tree")
        try FileManager.default.createDirectory(at: tree.appendingPathComponent("sub/deeper"), withIntermediateDirectories: true)
        try Data("plain".utf8).write(to: tree.appendingPathComponent("plain.txt"))
        try await device.files.write(Data("x".utf8), to: tree.appendingPathComponent("sub/x"), protection: .noProtection)
        try await device.files.write(Data("y".utf8), to: tree.appendingPathComponent("sub/deeper/y"), protection: .complete)
        let seen = ProgressLog()
        let report = try await device.files.reprotectItems(at: tree, to: .complete) { seen.add($0) }
        #expect(report.filesChanged == 2)
        #expect(report.filesUnchanged == 1)
        #expect(report.directories == 3)
        #expect(report.failures.isEmpty)
        #expect(seen.items.count == 6)
        #expect(seen.items.last?.completed == 6 && seen.items.last?.total == 6)
        for name in ["plain.txt", "sub/x", "sub/deeper/y"] {
            #expect(try device.files.protection(ofItemAt: tree.appendingPathComponent(name)) == .protected(.complete))
        }
        #expect(try await device.files.contents(of: tree.appendingPathComponent("plain.txt")) == Data("plain".utf8))
        #expect(try device.files.protection(ofItemAt: tree.appendingPathComponent("sub/deeper")) == .directory(defaultClass: .complete))
    }

    /// Interrupted (its task cancelled, as Ctrl-C does in dpctl) after 3 of 6 items: it says
    /// so, each item is whole, and running it again finishes the rest.
    @Test func anInterruptedReprotectionSaysHowFarItGotAndFinishesWhenRunAgain() async throws {
        let device = try await TestDevice.make()
        let tree = device.url("tree")
        try FileManager.default.createDirectory(at: tree.appendingPathComponent("sub"), withIntermediateDirectories: true)
        for name in ["a.txt", "b.txt", "sub/c.txt", "sub/d.txt"] { try Data(name.utf8).write(to: tree.appendingPathComponent(name)) }
        let files = device.files
        let stopped = await Task {
            try await files.reprotectItems(at: tree, to: .complete) { progress in
                if progress.completed == 3 { withUnsafeCurrentTask { $0?.cancel() } }
            }
        }.result
        guard case .failure(ProtectedFileError.interrupted(let completed, let total)) = stopped else {
            Issue.record("not interrupted: \(stopped)")
            return
        }
        #expect(completed == 3 && total == 6)
        var converted = 0
        for name in ["a.txt", "b.txt", "sub/c.txt", "sub/d.txt"] {
            switch try files.protection(ofItemAt: tree.appendingPathComponent(name)) {
            case .protected(.complete): converted += 1
            case .plain: break
            default: Issue.record("\(name) is neither its old nor its new self")
            }
            #expect(try await files.contents(of: tree.appendingPathComponent(name)) == Data(name.utf8))
        }
        #expect(converted > 0 && converted < 4)
        let again = try await files.reprotectItems(at: tree, to: .complete)
        #expect(again.filesUnchanged == converted && again.filesChanged == 4 - converted)
    }

    @Test func aCopyGetsTheStrongerOfSourceAndDestinationDefault() async throws {
        let device = try await TestDevice.make()
        let weakDir = device.url("weak"), strongDir = device.url("strong")
        for d in [weakDir, strongDir] { try FileManager.default.createDirectory(at: d, withIntermediateDirectories: true) }
        try await device.files.setProtection(.noProtection, ofItemAt: weakDir)
        try await device.files.setProtection(.complete, ofItemAt: strongDir)
        let secret = device.url("secret"), ordinary = device.url("ordinary")
        try await device.files.write(Data("s".utf8), to: secret, protection: .complete)
        try await device.files.write(Data("o".utf8), to: ordinary, protection: .noProtection)

        try await device.files.copyItem(at: secret, to: weakDir.appendingPathComponent("secret"))
        #expect(try device.files.protection(ofItemAt: weakDir.appendingPathComponent("secret")) == .protected(.complete))
        try await device.files.copyItem(at: ordinary, to: strongDir.appendingPathComponent("ordinary"))
        #expect(try device.files.protection(ofItemAt: strongDir.appendingPathComponent("ordinary")) == .protected(.complete))
        // Naming a class is the only way to lower it.
        try await device.files.copyItem(at: secret, to: weakDir.appendingPathComponent("lowered"), protection: .noProtection)
        #expect(try device.files.protection(ofItemAt: weakDir.appendingPathComponent("lowered")) == .protected(.noProtection))
        #expect(try await device.files.contents(of: weakDir.appendingPathComponent("lowered")) == Data("s".utf8))
        // A copy has its own key and identity: its segments differ from the source's.
        let a = try Data(contentsOf: secret), b = try Data(contentsOf: weakDir.appendingPathComponent("secret"))
        #expect(a[16..<32] != b[16..<32])
    }

    @Test func moveKeepsTheClassAndRemoveRemoves() async throws {
        let device = try await TestDevice.make()
        let a = device.url("a"), b = device.url("b")
        try await device.files.write(Data("m".utf8), to: a, protection: .completeUnlessOpen)
        try await device.files.moveItem(at: a, to: b)
        #expect(try device.files.protection(ofItemAt: b) == .protected(.completeUnlessOpen))
        #expect(try await device.files.contents(of: b) == Data("m".utf8))
        try device.files.removeItem(at: b)
        #expect(!FileManager.default.fileExists(atPath: b.path))
        #expect(throws: ProtectedFileError.noSuchFile(path: b.path)) { try device.files.removeItem(at: b) }
    }
}

final class ProgressLog: @unchecked Sendable {
    private let lock = NSLock()
    private var _items: [ReprotectionProgress] = []
    func add(_ p: ReprotectionProgress) { lock.lock(); _items.append(p); lock.unlock() }
    var items: [ReprotectionProgress] { lock.lock(); defer { lock.unlock() }; return _items }
}
