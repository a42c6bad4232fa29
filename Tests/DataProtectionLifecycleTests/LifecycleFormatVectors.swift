@testable import DataProtectionLifecycle
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Testing

/// FORMAT.md §12.2–12.3's test vectors, built by the code that speaks the protocol.
@Suite struct LifecycleFormatVectors {
    func frame(_ payload: [UInt8]) -> [UInt8] { IPCFrame.header(payload.count) + payload }
    func hex(_ text: String) -> [UInt8] { text.split(separator: " ").map { UInt8($0, radix: 16)! } }

    @Test func theChannelsVectors() {
        #expect(frame(LifecycleProtocol.request(LifecycleProtocol.Op.subscribe.rawValue)) == hex("00 00 00 02 01 01"))
        #expect(frame(LifecycleProtocol.ok + [ApplicationState.active.rawValue]) == hex("00 00 00 03 01 00 00"))
        #expect(frame(LifecycleProtocol.request(LifecycleProtocol.Op.beginTask.rawValue) { LifecycleProtocol.string(&$0, "upload") })
                == hex("00 00 00 0a 01 02 00 06 75 70 6c 6f 61 64"))
        var answer = ByteWriter()
        answer.raw(LifecycleProtocol.ok)
        answer.u32(1)
        #expect(frame(answer.bytes) == hex("00 00 00 06 01 00 00 00 00 01"))
        #expect(frame([LifecycleProtocol.version, LifecycleProtocol.Status.event.rawValue, LifecycleEvent.didEnterBackground.rawValue]) == hex("00 00 00 03 01 02 02"))
        #expect(frame([LifecycleProtocol.version, LifecycleProtocol.Status.event.rawValue, LifecycleProtocol.taskExpiring, 0, 0, 0, 1]) == hex("00 00 00 07 01 02 06 00 00 00 01"))
        let second = Date(timeIntervalSince1970: 1_767_225_601)   // 2026-01-01T00:00:01Z
        #expect(frame(LifecycleProtocol.request(LifecycleProtocol.Op.sleepUntil.rawValue) { LifecycleProtocol.double(&$0, second.timeIntervalSince1970) })
                == hex("00 00 00 0a 01 06 41 da 55 6e 40 40 00 00"))
    }

    @Test func theControlSocketsVectors() throws {
        #expect(frame(LifecycleProtocol.request(LifecycleProtocol.ControlOp.background.rawValue)) == hex("00 00 00 02 01 01"))
        var body = try LifecycleProtocol.body(Array(hex("00 00 00 03 01 00 02").dropFirst(4)))
        #expect(ApplicationState(rawValue: try body.u8("state")) == .background)
        #expect(throws: LifecycleError.refused("no")) { try LifecycleProtocol.body([1, 1, 0, 2] + Array("no".utf8)) }
        #expect(throws: LifecycleError.self) { try LifecycleProtocol.body([2, 0]) }
    }
}
