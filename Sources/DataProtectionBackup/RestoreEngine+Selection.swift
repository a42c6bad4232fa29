import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// Selecting what to restore: the entries under the paths asked for, and the directories above
/// them.
extension RestoreEngine {
    /// The entries a restore of `include` takes: every entry at or below an included path, and
    /// the directories that lead to them. Paths are compared by their bytes, component by component.
    /// - Throws: ``BackupError/nothingIncluded(path:)`` for an included path the backup does not hold.
    static func selecting(_ include: [String], from entries: [ManifestEntry]) throws -> [ManifestEntry] {
        guard !include.isEmpty else { return entries }
        var wanted: [[UInt8]] = []
        for path in include {
            var bytes = LosslessPath.bytes(of: path)[...]
            while bytes.first == UInt8(ascii: "/") { bytes = bytes.dropFirst() }
            while bytes.starts(with: [UInt8(ascii: "."), UInt8(ascii: "/")]) { bytes = bytes.dropFirst(2) }
            while bytes.last == UInt8(ascii: "/") { bytes = bytes.dropLast() }
            guard !bytes.isEmpty, entries.contains(where: { LosslessPath.key($0.path) == Array(bytes) }) else {
                throw BackupError.nothingIncluded(path: path)
            }
            wanted.append(Array(bytes))
        }
        let slash = UInt8(ascii: "/")
        return entries.filter { entry in
            let path = LosslessPath.key(entry.path)
            return wanted.contains { want in
                path == want || path.starts(with: want + [slash])
                    || (entry.kind == .directory && want.starts(with: path + [slash]))   // a directory on the way
            }
        }
    }
}
