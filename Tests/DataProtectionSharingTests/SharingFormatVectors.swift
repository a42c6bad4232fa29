import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
@testable import DataProtectionSharing
import Foundation
import Testing

/// FORMAT.md §11.2 and §11.4, byte for byte.
@Suite struct SharingFormatVectors {
    func hex(_ text: String) -> [UInt8] {
        let digits = text.filter(\.isHexDigit)
        return stride(from: 0, to: digits.count, by: 2).map { UInt8(String(Array(digits)[$0..<$0 + 2]), radix: 16)! }
    }

    @Test func openInAndSubscribeRequests() {
        let open = SharingProtocol.request(.openIn) { w in
            SharingProtocol.string(&w, "com.example.b")
            SharingProtocol.string(&w, "Documents/x.txt")
            SharingProtocol.string(&w, "")
        }
        #expect(IPCFrame.header(open.count) + open == hex("""
            00 00 00 24 01 01 00 0d 63 6f 6d 2e 65 78 61 6d 70 6c 65 2e 62
            00 0f 44 6f 63 75 6d 65 6e 74 73 2f 78 2e 74 78 74 00 00
            """))
        let subscribe = SharingProtocol.request(.subscribe)
        #expect(IPCFrame.header(subscribe.count) + subscribe == hex("00 00 00 02 01 02"))
    }

    @Test func answersAndEvents() throws {
        #expect(try SharingProtocol.outcome([1, 0]) == nil)
        #expect(try SharingProtocol.outcome([1, 1, 1, 0, 6] + Array("locked".utf8)) == .protectedDataUnavailable("locked"))
        #expect(try SharingProtocol.outcome([1, 1, 2, 0, 2] + Array("no".utf8)) == .refused("no"))
        #expect(throws: (any Error).self) { try SharingProtocol.outcome([1, 1, 2, 0, 9, 0x61]) }   // truncated message

        let event = [1, 2, 1, 0, 0x18] + Array("/c/Documents/Inbox/x.txt".utf8) + [0, 0x0d] + Array("com.example.a".utf8)
        let opened = try #require(OpenedURL(event: event))
        #expect(opened.url.path == "/c/Documents/Inbox/x.txt" && opened.sender == "com.example.a")
        #expect(OpenedURL(event: Array(event.dropLast())) == nil)
    }

    @Test func inboxNameVectors() {
        let vectors: [([UInt8], String, String)] = [
            (Array("report.pdf".utf8), "report.pdf", "report 2.pdf"), (Array("../../x".utf8), "x", "x 2"),
            (Array("/etc/passwd".utf8), "etcpasswd", "etcpasswd 2"), (Array("line\nbreak.txt".utf8), "linebreak.txt", "linebreak 2.txt"),
            ([0x6C, 0x61, 0x74, 0xE9, 0x2E, 0x74, 0x78, 0x74], "lat_.txt", "lat_ 2.txt"), (Array(".hidden".utf8), "hidden", "hidden 2"),
            (Array("..".utf8), "Untitled", "Untitled 2"), (Array("evil\u{202E}txt.exe".utf8), "eviltxt.exe", "eviltxt 2.exe"),
        ]
        for (bytes, first, second) in vectors {
            let name = InboxName(bytes: bytes)
            #expect(name.candidate(1) == first && name.candidate(2) == second, "\(bytes)")
        }
    }
}
