import DataProtectionSystem
import Foundation
import SystemPackage

/// Where things live in a data root (FORMAT.md §1), in one place: the keybag layer's own files,
/// and the entries other layers register.
///
/// A layer that keeps something in the root asks for it by name with ``register(_:)``; the
/// name is recorded in `ROOT/layout` (one name per line), so that an erase — in whichever
/// process it happens, keybagd included — removes every registered entry without the keybag
/// knowing which layer owns what.
///
/// ```swift
/// let layout = DataRootLayout(root: keybag.root)
/// let index = try layout.register("backup-index")     // ROOT/backup-index, erased with the device
/// ```
public struct DataRootLayout: Sendable, Equatable {
    /// The data root.
    public let root: String

    public init(root: String) { self.root = root }

    /// The device secret (§1).
    public var deviceSecret: String { path(DeviceSecret.fileName) }
    /// Where the TPM keeps the device secret, in place of ``deviceSecret`` (§2c).
    public var tpmBinding: String { path(TPMBindingRecord.fileName) }
    /// The keybag (§2).
    public var keybag: String { path(KeybagFile.fileName) }
    /// The lock file that serializes keybag updates across processes (§1).
    public var keybagLock: String { path("keybag.lock") }
    /// A keybag-sized file whose blocks are allocated, through which the keybag is written on a
    /// full disk (§1).
    public var keybagSpare: String { path("keybag.spare") }
    /// The backup keybag (§2b).
    public var backupKeybag: String { path(BackupKeybag.fileName) }
    /// The list of registered entries.
    public var registry: String { path("layout") }

    /// `ROOT/name`.
    public func path(_ name: String) -> String { root + "/" + name }

    /// The device's own files: its secret (or the TPM's record of it), the keybag, the backup
    /// keybag, their locks and the list of registered entries. None is ever backed up or copied
    /// elsewhere: with them and a backup password, a passcode could be attacked offline, or the
    /// device cloned with its failure count rolled back (iOS never backs up the device key or
    /// the system keybag).
    public static let deviceFileNames: Set<String> = [
        DeviceSecret.fileName, TPMBindingRecord.fileName, KeybagFile.fileName, "keybag.lock",
        "keybag.spare", BackupKeybag.fileName, "layout", KeybagDaemonLock.fileName,
    ]

    /// Whether `directory` is a data root: it holds a keybag and a device secret (in a file, or
    /// sealed by a TPM).
    public static func isDataRoot(_ directory: String) -> Bool {
        POSIXFile.linkStatus(directory + "/" + KeybagFile.fileName).map { $0.st_mode & S_IFMT == S_IFREG } == true
            && (POSIXFile.linkStatus(directory + "/" + DeviceSecret.fileName) != nil
                || POSIXFile.linkStatus(directory + "/" + TPMBindingRecord.fileName) != nil)
    }

    /// Registers `name` — one plain name, no `/`, not one of the keybag's own — as an entry of the
    /// root that an erase removes, and returns its path. Registering twice is harmless.
    @discardableResult
    public func register(_ name: String) throws -> String {
        guard !name.isEmpty, name != ".", name != "..", !name.contains("/"), !name.contains("\n"),
            !Self.deviceFileNames.contains(name)
        else {
            throw KeybagError.invalidArgument("\(name) cannot be registered in a data root")
        }
        guard !registeredEntries().contains(name) else { return path(name) }
        let fd = try POSIXFile.open(registry, .writeOnly, options: [.create, .append], permissions: [.ownerReadWrite])
        defer { try? fd.close() }
        let line = Array((name + "\n").utf8)
        try POSIXFile.check("flock", registry) { flock(fd.rawValue, LOCK_EX) }
        try POSIXFile.system("write", registry) { _ = try fd.writeAll(line) }
        return path(name)
    }

    /// The names registered so far (unreadable or malformed lines are ignored).
    public func registeredEntries() -> [String] {
        guard let bytes = try? POSIXFile.readAll(registry) else { return [] }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
            .filter { !$0.isEmpty && $0 != "." && $0 != ".." && !$0.contains("/") }
    }

    /// Removes every registered entry and the registry (part of a crypto-erase).
    func removeRegisteredEntries() {
        for name in registeredEntries() { try? FileManager.default.removeItem(atPath: path(name)) }
        _ = try? POSIXFile.call("unlink", registry) { unlink($0) }
    }
}
