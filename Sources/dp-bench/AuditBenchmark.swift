import ArgumentParser
import DataProtection
import DataProtectionAudit
import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dpctl audit`'s walk over a large tree beside `find` walking the same tree (a stat per item):
/// the audit adds, per file, an open, a 160-byte header read and the rules.
struct AuditBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Auditing a tree of protected files vs find's walk.",
        discussion:
            "Audit of a tree of protected files (1% plain) vs find's walk of it; target: 100,000 files under 10 s.")

    @Option(help: "Files in the tree.") var files = 100_000
    @Option(help: "Runs of each (the best is kept).") var runs = 3

    func run() async throws {
        let workspace = try Workspace("audit")
        defer { workspace.remove() }
        let base = workspace.base
        let keybag = try await workspace.keybag()
        let manager = ProtectedFileManager(keybag: keybag)
        let sample = base.appendingPathComponent("sample")
        try await manager.write(
            Data(repeating: 7, count: 1_000), to: sample, protection: .completeUntilFirstUserAuthentication)
        let protected = try Data(contentsOf: sample)
        let tree = base.appendingPathComponent("tree")
        // 100 files a directory, ten directories a level: a tree apps have, not one flat directory.
        var plain = 0
        for index in 0..<files {
            let directory = tree.appendingPathComponent("d\(index / 10_000)/d\(index / 100 % 100)")
            if index % 100 == 0 {
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            }
            let isPlain = index % 100 == 99
            if isPlain { plain += 1 }
            let fd = open(
                directory.appendingPathComponent("f\(index)").path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            let bytes = isPlain ? Data("plain".utf8) : protected
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            close(fd)
            guard fd >= 0, written == bytes.count else { throw ValidationError("cannot write the tree") }
        }
        print("dp-bench audit: \(files) files (\(plain) plain) in \(files / 100) directories, best of \(runs)")

        var findings = 0
        var auditTimes: [Double] = [], findTimes: [Double] = []
        for _ in 0..<runs {
            auditTimes.append(try await seconds { findings = try Auditor().audit(tree: tree).findings.count })
            guard let find = runTool("/usr/bin/find", [tree.path, "-printf", "%m %s %p\\n"], discardOutput: true) else {
                throw ValidationError("find failed")
            }
            findTimes.append(find.seconds)
        }
        guard findings == plain else {
            throw ValidationError("the audit found \(findings) findings, not the \(plain) planted")
        }
        let audit = auditTimes.min()!, find = findTimes.min()!
        printTable([
            Row(
                metric: "audit of \(files) files", ours: Double(files) / audit,
                peerName: "find -printf (a stat per item)", peer: Double(files) / find, unit: "files/s")
        ])
        print("")
        print(String(format: "target: %d files under 10 s (%.2f s)", files, audit))
        print(
            String(
                format:
                    "summary: files=%d audit_s=%.2f find_s=%.2f audit_files_per_s=%.0f find_files_per_s=%.0f audit_vs_find=%.2f findings=%d",
                files, audit, find, Double(files) / audit, Double(files) / find, find / audit, findings))
    }
}
