@testable import DataProtection
@_spi(Testing) import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// An app's API speaks through the protected file system (it holds no key). Pointed anywhere
/// else — a directory the file system does not serve — it protects nothing, so it writes
/// nothing, and a class attribute found there is a label anyone could set, not a class.
@Suite struct ServedOutsideTheMountTests {
    @Test func writesOutsideTheFileSystemAreRefusedAndLabelsAreNotClasses() async throws {
        let base = temporaryDirectory()
        let keybag = try await Keybag.create(root: base.appendingPathComponent("root").path, passcode: nil, kdf: .insecureFastForTesting)
        var files = ProtectedFileManager(keybag: keybag)
        files.servedByFileSystem = true
        let target = base.appendingPathComponent("outside.txt")
        await #expect(throws: (any Error).self) { try await files.write(Data("a secret".utf8), to: target) }
        await #expect(throws: (any Error).self) { _ = try await files.createFile(at: base.appendingPathComponent("new.txt"), protection: .complete) }
        let left = try FileManager.default.contentsOfDirectory(atPath: base.path).filter { $0 != "root" }
        #expect(left.isEmpty, "nothing written: \(left)")
        // A plain file labelled with the class attribute is what its bytes are.
        let labelled = base.appendingPathComponent("labelled.txt")
        try Data("plain text".utf8).write(to: labelled)
        try DirectoryDefault.set(.complete, labelled.path)
        #expect(try files.protection(ofItemAt: labelled) == .plain)
    }
}
