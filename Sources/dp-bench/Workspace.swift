@_spi(Testing) import DataProtectionKeybag
import Foundation

/// A suite's scratch directory, removed when the suite ends, and a device in it: a keybag with the
/// fast test KDF (setting up is not what is timed) under `ROOT/root`.
struct Workspace {
    /// The directory (`dp-bench-SUITE-XXXXXXXX` in the temporary directory, or under `parent`).
    let base: URL

    /// Makes `dp-bench-SUITE-…` under `parent` (default: the temporary directory).
    init(_ suite: String, under parent: String? = nil) throws {
        base = URL(fileURLWithPath: parent ?? NSTemporaryDirectory())
            .appendingPathComponent("dp-bench-\(suite)-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
    }

    /// In memory where the machine has `/dev/shm` (the disk then does not dominate the figures),
    /// else the temporary directory: the default of suites that time throughput.
    static var memoryBacked: String {
        FileManager.default.isWritableFile(atPath: "/dev/shm") ? "/dev/shm" : NSTemporaryDirectory()
    }

    /// A new device at `ROOT/root`, unlocked (no passcode unless one is given).
    func keybag(passcode: String? = nil) async throws -> Keybag {
        try await Keybag.create(
            root: base.appendingPathComponent("root").path, passcode: passcode, kdf: .insecureFastForTesting)
    }

    /// Removes the directory and everything in it.
    func remove() { try? FileManager.default.removeItem(at: base) }
}
