@testable import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The path helpers agree with Foundation, and extended attributes of any length are read whole.
struct PathAndAttributeTests {
    @Test(arguments: ["/", "/a", "/a/b.plist", "/a/b/", "/a//b", "//a", "/a/./b", "/a/../b", "/a/b/..", "/a/b/.", "/a/.hidden/..x",
                      "/a/...", "/a/.b.", "/ü/ñ", "relative/x", "./x", "/a/b//",
                      "/private/tmp/x", "/private", "/var/automount/x", "/privateer/x"])
    func aStandardizedPathIsFoundations(_ path: String) {
        #expect(POSIXFile.standardized(path) == URL(fileURLWithPath: path, isDirectory: false).standardizedFileURL.path)
    }

    @Test func aPathSplitsAtItsLastSlash() {
        #expect(POSIXFile.split("/a/b.plist") == ("/a", "b.plist"))
        #expect(POSIXFile.split("/a/b//") == ("/a", "b"))
        #expect(POSIXFile.split("/b") == ("/", "b"))
        #expect(POSIXFile.split("/") == ("/", "/"))
        #expect(POSIXFile.split("b") == (".", "b"))
        #expect(POSIXFile.split("/é/\u{301}x") == ("/é", "\u{301}x"), "a name may start with a combining mark")
        #expect(POSIXFile.split("/d/\u{600}/") == ("/d", "\u{600}"), "a trailing slash ending a grapheme cluster goes alone")
    }

    @Test func attributesLongerThanTheFirstBufferAreReadWholeAndKeptAcrossAReplacement() throws {
        let path = temporaryDirectory() + "/f"
        try POSIXFile.writeAtomically(path, Array("old".utf8))
        let long = (0..<1000).map { UInt8(truncatingIfNeeded: $0 * 7 + 1) }
        try POSIXFile.setAttribute("user.long", long, path: path)
        // Names whose list is longer than the first buffer too.
        let names = (0..<10).map { "user.mark-with-a-long-name-\($0)" }
        for name in names { try POSIXFile.setAttribute(name, [1], path: path) }
        #expect(try POSIXFile.getAttribute("user.long", path: path) == long)
        #expect(try POSIXFile.getAttribute("user.absent", path: path) == nil)
        try POSIXFile.writeAtomically(path, Array("new".utf8))
        let kept = try POSIXFile.userAttributes(path)
        #expect(kept.first { $0.name == "user.long" }?.value == long)
        #expect(Set(kept.map(\.name)) == Set(names + ["user.long"]))
    }
}
