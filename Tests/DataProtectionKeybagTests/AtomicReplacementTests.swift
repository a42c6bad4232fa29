@testable import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// An atomic replacement left unflushed (the caller flushes later) swaps the new file in rather
/// than renaming over the old one: the name holds one whole file at every moment, a reader of
/// the old file keeps reading it, nothing is left behind, and nothing but a file is ever replaced.
struct AtomicReplacementTests {
    private func write(_ text: String, to path: String, _ replacement: POSIXFile.Replacement) throws {
        try POSIXFile.replaceAtomically(path, replacement: replacement) { fd, temp in
            try POSIXFile.write(fd, Array(text.utf8), at: 0, path: temp)
        }
    }

    private func contents(_ fd: Int32) -> String {
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = pread(fd, &buffer, buffer.count, 0)
        return String(decoding: buffer.prefix(max(0, n)), as: UTF8.self)
    }

    private func names(in directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
    }

    @Test func anUnflushedReplacementLeavesOnlyTheNewFileAndReadersOfTheOldOneReadIt() throws {
        let directory = temporaryDirectory()
        let path = directory + "/p.plist"
        try write("old", to: path, .durable)
        let reader = open(path, O_RDONLY)
        defer { close(reader) }
        try write("new", to: path, POSIXFile.Replacement(flushes: false))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "new")
        #expect(contents(reader) == "old", "a reader of the old file keeps reading it, whole")
        var st = stat()
        #expect(fstat(reader, &st) == 0 && st.st_nlink == 0, "the replaced file has no name left")
        #expect(try names(in: directory) == ["p.plist"])
    }

    @Test func theReplacedFileIsKeptWhereAsked() throws {
        let directory = temporaryDirectory()
        let path = directory + "/p.plist", kept = directory + "/.p.plist.durable"
        try write("old", to: path, .durable)
        try write("new", to: path, POSIXFile.Replacement(flushes: false, keepingReplacedAt: kept))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "new")
        #expect(try String(contentsOfFile: kept, encoding: .utf8) == "old")
        #expect(try names(in: directory) == [".p.plist.durable", "p.plist"])
    }

    /// A directory put where the file was is never moved aside: the replacement fails, as a
    /// `rename` over a directory does, and the directory stays with what it holds.
    @Test func aDirectoryAtThePathIsNeverReplaced() throws {
        let directory = temporaryDirectory()
        let path = directory + "/p.plist"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: path + "/inside", contents: Data("kept".utf8)))
        #expect(throws: FileSystemError.self) { try write("new", to: path, POSIXFile.Replacement(flushes: false)) }
        #expect(try String(contentsOfFile: path + "/inside", encoding: .utf8) == "kept")
        #expect(try names(in: directory) == ["p.plist"], "no temporary file left")
    }

    /// A first write (nothing to swap with) and a link at the path (replaced, never followed)
    /// end as a rename would.
    @Test func aFirstWriteAndALinkAtThePathEndAsARenameWould() throws {
        let directory = temporaryDirectory()
        let path = directory + "/p.plist", target = directory + "/target"
        try write("first", to: path, POSIXFile.Replacement(flushes: false))
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "first")
        try write("target", to: target, .durable)
        try FileManager.default.removeItem(atPath: path)
        #expect(symlink(target, path) == 0)
        try write("new", to: path, POSIXFile.Replacement(flushes: false))
        #expect(POSIXFile.linkStatus(path).map { $0.st_mode & S_IFMT } == S_IFREG, "the link itself was replaced")
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "new")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "target")
        #expect(try names(in: directory) == ["p.plist", "target"])
    }
}
