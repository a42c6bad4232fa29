@_spi(Testing) import DataProtectionKeybag
import Foundation

/// A fresh temporary directory per test.
func temporaryDirectory(_ function: String = #function) -> String {
    let path = NSTemporaryDirectory() + "dp-tests-" + UUID().uuidString
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// A device with a passcode, weak scrypt parameters and a virtual clock.
func makeDevice(passcode: String? = "123456", grace: TimeInterval = 10, erasePolicy: Bool = false)
    async throws -> (Keybag, ManualClock, String) {
    let root = temporaryDirectory() + "/root"
    let clock = ManualClock()
    let keybag = try await Keybag.create(root: root, passcode: passcode, kdf: .insecureFastForTesting, gracePeriod: grace,
                                         eraseAfterTenFailures: erasePolicy, clock: clock)
    return (keybag, clock, root)
}
