import DataProtection
import Foundation
import Testing

func temporaryDirectory() -> URL {
    let url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dp-tests-" + UUID().uuidString)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// A device with passcode "1234", weak scrypt parameters and a virtual clock, plus a work directory.
struct TestDevice {
    let keybag: Keybag
    let clock: ManualClock
    let root: String
    let files: ProtectedFileManager
    let dir: URL

    static func make(grace: TimeInterval = 10, passcode: String? = "1234") async throws -> TestDevice {
        let base = temporaryDirectory()
        let clock = ManualClock()
        let root = base.appendingPathComponent("root").path
        let keybag = try await Keybag.create(root: root, passcode: passcode, kdf: .insecureFastForTesting, gracePeriod: grace, clock: clock)
        let dir = base.appendingPathComponent("files")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return TestDevice(keybag: keybag, clock: clock, root: root, files: ProtectedFileManager(keybag: keybag), dir: dir)
    }

    /// The same device after a restart: before first unlock.
    func restarted() async throws -> TestDevice {
        let keybag = try await Keybag.open(root: root, clock: clock)
        return TestDevice(keybag: keybag, clock: clock, root: root, files: ProtectedFileManager(keybag: keybag), dir: dir)
    }

    func url(_ name: String) -> URL { dir.appendingPathComponent(name) }
}

func randomData(_ count: Int) -> Data { Data((0..<count).map { _ in UInt8.random(in: 0...255) }) }

func isUnavailable(_ error: any Error, writing: Bool? = nil) -> Bool {
    guard case ProtectedFileError.unavailable(_, _, _, let w) = error else { return false }
    return writing == nil || writing == w
}

func isDamaged(_ error: any Error) -> Bool {
    guard case ProtectedFileError.damaged = error else { return false }
    return true
}
