import DataProtection
import DataProtectionBackup
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing


/// The seed's scenario: documents next to an offline directory marked right after it is
/// created, a PDF saved into it and marked too, a marked single file, and names that need
/// escaping in pattern languages.
struct MarkedTree {
    let root: URL

    static func make() throws -> MarkedTree {
        let root = temporaryDirectory().appendingPathComponent("tree")
        let fm = FileManager.default
        for dir in ["Documents", "Documents/offline", "Documents/offline/maps", "keep", "weird [1]*?$HOME"] {
            try fm.createDirectory(at: root.appendingPathComponent(dir), withIntermediateDirectories: true)
        }
        try BackupExclusionAttribute.set(excluded: true, for: root.appendingPathComponent("Documents/offline"))
        let files = [
            "Documents/report.txt": "report",
            "Documents/offline/book.pdf": "pdf",
            "Documents/offline/maps/tile.bin": "tile",
            "keep/normal.txt": "normal",
            "keep/secret.pdf": "secret",
            "weird [1]*?$HOME/inside.txt": "weird",
            "weird [1]*?$HOME/kept.txt": "kept",
        ]
        for (name, text) in files { try Data(text.utf8).write(to: root.appendingPathComponent(name)) }
        try BackupExclusionAttribute.set(excluded: true, for: root.appendingPathComponent("Documents/offline/book.pdf"))
        try BackupExclusionAttribute.set(excluded: true, for: root.appendingPathComponent("keep/secret.pdf"))
        try BackupExclusionAttribute.set(excluded: true, for: root.appendingPathComponent("weird [1]*?$HOME/inside.txt"))
        return MarkedTree(root: root)
    }

    /// Relative paths of the files that must be in a backup / must not be.
    static let backedUp = ["Documents/report.txt", "keep/normal.txt", "weird [1]*?$HOME/kept.txt"]
    static let markedDirectoryContents = ["Documents/offline/book.pdf", "Documents/offline/maps/tile.bin"]
    static let markedFiles = ["keep/secret.pdf", "weird [1]*?$HOME/inside.txt"]
}

/// Runs a tool; fails with its output when it exits non-zero.
@discardableResult
func tool(_ arguments: [String], environment: [String: String] = [:]) throws -> String {
    let result = try ChildProcess.run(arguments[0], Array(arguments.dropFirst()), environment: environment)
    guard result.status == 0 else { throw ToolFailure(command: arguments.joined(separator: " "), status: result.status) }
    return result.out
}

struct ToolFailure: Error, CustomStringConvertible {
    let command: String
    let status: Int32
    var description: String { "`\(command)` exited with \(status) (is it installed? scripts/test installs tar, restic, borgbackup)" }
}

/// A device without a passcode, a repository and an empty source directory, in a new temporary
/// directory: what the forget, prune and interruption tests start from.
struct BackupBench {
    let base: URL
    let files: ProtectedFileManager
    let repository: BackupRepository
    let source: URL

    static func make() async throws -> BackupBench {
        let base = temporaryDirectory()
        let keybag = try await Keybag.create(root: base.appendingPathComponent("device").path, passcode: nil, kdf: .insecureFastForTesting)
        let source = base.appendingPathComponent("src")
        try FileManager.default.createDirectory(at: source, withIntermediateDirectories: true)
        return BackupBench(base: base, files: ProtectedFileManager(keybag: keybag),
                           repository: BackupRepository(url: base.appendingPathComponent("repo")), source: source)
    }
}
