import DataProtection
import DataProtectionAudit
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionFileSystem
import DataProtectionLifecycle
import DataProtectionObjects
import DataProtectionSharing
import DataProtectionSQLite
import Foundation

// Builds and starts without the TPM Software Stack; protects a file under a virtual device.
let root = FileManager.default.temporaryDirectory.appendingPathComponent("consumer-\(UUID().uuidString)")
try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: root) }
let keybag = try await Keybag.create(root: root.appendingPathComponent("device").path, passcode: "123456")
try await keybag.unlock(passcode: "123456")
let files = ProtectedFileManager(keybag: keybag)
// The file system opens its directory without /dev/fuse (mounting would need it).
_ = try ProtectedFileSystem(directory: root.path, files: files)
let note = root.appendingPathComponent("note")
try await Data("a protected note".utf8).write(to: note, options: .completeFileProtection, using: files)
print(String(decoding: try await Data(contentsOfProtectedFile: note, using: files), as: UTF8.self))
