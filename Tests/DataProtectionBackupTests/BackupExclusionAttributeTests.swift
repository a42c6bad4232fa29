import DataProtectionBackup
import DataProtectionTestSupport
import Foundation
import Testing

@Suite struct BackupExclusionAttributeTests {
    @Test func markIsTheFreedesktopAttributeAndCoversDescendants() throws {
        let tree = try MarkedTree.make()
        let offline = tree.root.appendingPathComponent("Documents/offline")
        #expect(try offline.backupExclusion() == .excludedByOwnAttribute)
        #expect(try offline.appendingPathComponent("maps/tile.bin").backupExclusion() == .excludedByAncestor(offline))
        #expect(try tree.root.appendingPathComponent("Documents/report.txt").backupExclusion() == .included)
        // The stored value is exactly the freedesktop convention.
        let value = try tool(["getfattr", "--only-values", "-n", "user.xdg.robots.backup", offline.path])
        #expect(value == "false")
        // Children carry no mark of their own.
        #expect(try tool(["getfattr", "-d", offline.appendingPathComponent("maps").path]).isEmpty)
    }

    @Test func directoriesGetAValidCacheDirectoryTagThatIncludeRemoves() throws {
        let tree = try MarkedTree.make()
        let offline = tree.root.appendingPathComponent("Documents/offline")
        let tag = try Data(contentsOf: offline.appendingPathComponent("CACHEDIR.TAG"))
        #expect(tag.prefix(43) == Data("Signature: 8a477f597d28d172789f06886806bc55".utf8))
        // The signature is MD5(".IsCacheDirectory"), checked with openssl.
        let md5 = try tool(["sh", "-c", "printf .IsCacheDirectory | openssl dgst -md5 -r"])
        #expect(md5.hasPrefix("8a477f597d28d172789f06886806bc55"))
        var values = URLResourceValues()
        values.isExcludedFromBackup = false
        try offline.setBackupResourceValues(values)
        #expect(!FileManager.default.fileExists(atPath: offline.appendingPathComponent("CACHEDIR.TAG").path))
        #expect(try offline.backupExclusion() == .included)
        // Without a tag, on request.
        try BackupExclusionAttribute.set(excluded: true, for: offline, cacheDirectoryTag: false)
        #expect(!FileManager.default.fileExists(atPath: offline.appendingPathComponent("CACHEDIR.TAG").path))
        #expect(try offline.backupExclusion() == .excludedByOwnAttribute)
    }

    @Test func aForeignCacheDirectoryTagIsLeftAlone() throws {
        let dir = temporaryDirectory()
        let foreign = Data("Signature: 8a477f597d28d172789f06886806bc55\n# written by some cache\n".utf8)
        try foreign.write(to: dir.appendingPathComponent("CACHEDIR.TAG"))
        try BackupExclusionAttribute.set(excluded: true, for: dir)
        try BackupExclusionAttribute.set(excluded: false, for: dir)
        #expect(try Data(contentsOf: dir.appendingPathComponent("CACHEDIR.TAG")) == foreign)
    }

    @Test func markingAMissingPathIsAnError() throws {
        let missing = temporaryDirectory().appendingPathComponent("nope")
        #expect(throws: BackupExclusionError.noSuchFile(path: missing.path)) { try BackupExclusionAttribute.set(excluded: true, for: missing) }
        #expect(throws: BackupExclusionError.noSuchFile(path: missing.path)) { _ = try missing.backupExclusion() }
    }

    @Test func exclusionListsInEveryFormat() throws {
        let tree = try MarkedTree.make()
        let list = try ExclusionList(scanning: tree.root)
        let root = tree.root.path
        #expect(list.excluded.map(\.path) == [
            root + "/Documents/offline", root + "/keep/secret.pdf", root + "/weird [1]*?$HOME/inside.txt",
        ])
        #expect(try list.rendered(as: .tar).contains(#"/weird \[1]\*\?$HOME/inside.txt"#))
        #expect(try list.rendered(as: .restic).contains(#"/weird \[1]\*\?$$HOME/inside.txt"#))
        #expect(try list.rendered(as: .borg).contains("pp:" + root + "/keep/secret.pdf\n"))
        // A tree under a marked directory is excluded as a whole.
        let inner = try ExclusionList(scanning: tree.root.appendingPathComponent("Documents/offline/maps"))
        #expect(inner.excluded.map(\.path) == [root + "/Documents/offline/maps"])
    }
}
