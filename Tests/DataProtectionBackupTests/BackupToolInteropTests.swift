import DataProtectionBackup
import Foundation
import Testing

/// The real tools judge the marks: tar, restic and borg must leave marked items out, both
/// through `--exclude-caches` (CACHEDIR.TAG) and through `dpctl exclusions` lists.
@Suite(.serialized) struct BackupToolInteropTests {
    func relativeFiles(_ names: [String], under prefix: String) -> Set<String> {
        Set(names.compactMap { name in
            var n = name
            if n.hasPrefix("./") { n.removeFirst(2) }
            if n.hasPrefix("/") { n.removeFirst() }
            let p = prefix.hasPrefix("/") ? String(prefix.dropFirst()) : prefix
            guard n.hasPrefix(p + "/") else { return nil }
            return String(n.dropFirst(p.count + 1))
        })
    }

    func check(_ stored: Set<String>, cachesOnly: Bool, _ tool: String) {
        for name in MarkedTree.backedUp { #expect(stored.contains(name), "\(tool) left out \(name)") }
        for name in MarkedTree.markedDirectoryContents { #expect(!stored.contains(name), "\(tool) kept \(name)") }
        for name in MarkedTree.markedFiles {
            // --exclude-caches knows only directories: single marked files need the exclude list.
            if !cachesOnly { #expect(!stored.contains(name), "\(tool) kept \(name)") }
        }
    }

    func writeList(_ tree: MarkedTree, _ format: ExclusionList.Format) throws -> String {
        let file = tree.root.deletingLastPathComponent().appendingPathComponent("exclude.\(format.rawValue)").path
        try Data(try ExclusionList(scanning: tree.root).rendered(as: format).utf8).write(to: URL(fileURLWithPath: file))
        return file
    }

    @Test func tar() throws {
        let tree = try MarkedTree.make()
        let archive = tree.root.deletingLastPathComponent().appendingPathComponent("a.tar").path
        try tool(["tar", "--exclude-caches", "-cf", archive, tree.root.path])
        check(relativeFiles(try tool(["tar", "-tf", archive]).split(separator: "\n").map(String.init), under: tree.root.path), cachesOnly: true, "tar --exclude-caches")
        let list = try writeList(tree, .tar)
        try tool(["tar", "-X", list, "-cf", archive, tree.root.path])
        check(relativeFiles(try tool(["tar", "-tf", archive]).split(separator: "\n").map(String.init), under: tree.root.path), cachesOnly: false, "tar -X")
    }

    @Test func restic() throws {
        let tree = try MarkedTree.make()
        let repo = tree.root.deletingLastPathComponent().appendingPathComponent("restic-repo").path
        let env = ["RESTIC_PASSWORD": "test", "RESTIC_REPOSITORY": repo, "RESTIC_CACHE_DIR": repo + "-cache"]
        try tool(["restic", "init", "--quiet"], environment: env)
        try tool(["restic", "backup", "--quiet", "--exclude-caches", tree.root.path], environment: env)
        let first = try tool(["restic", "ls", "latest"], environment: env).split(separator: "\n").map(String.init)
        check(relativeFiles(first, under: tree.root.path), cachesOnly: true, "restic --exclude-caches")
        let list = try writeList(tree, .restic)
        try tool(["restic", "backup", "--quiet", "--exclude-file", list, tree.root.path], environment: env)
        let second = try tool(["restic", "ls", "latest"], environment: env).split(separator: "\n").map(String.init)
        check(relativeFiles(second, under: tree.root.path), cachesOnly: false, "restic --exclude-file")
    }

    @Test func borg() throws {
        let tree = try MarkedTree.make()
        let repo = tree.root.deletingLastPathComponent().appendingPathComponent("borg-repo").path
        let env = ["BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes", "BORG_BASE_DIR": repo + "-base"]
        try tool(["borg", "init", "--encryption=none", repo], environment: env)
        try tool(["borg", "create", "--exclude-caches", repo + "::caches", tree.root.path], environment: env)
        let first = try tool(["borg", "list", "--short", repo + "::caches"], environment: env).split(separator: "\n").map(String.init)
        check(relativeFiles(first, under: tree.root.path), cachesOnly: true, "borg --exclude-caches")
        let list = try writeList(tree, .borg)
        try tool(["borg", "create", "--exclude-from", list, repo + "::list", tree.root.path], environment: env)
        let second = try tool(["borg", "list", "--short", repo + "::list"], environment: env).split(separator: "\n").map(String.init)
        check(relativeFiles(second, under: tree.root.path), cachesOnly: false, "borg --exclude-from")
    }
}
