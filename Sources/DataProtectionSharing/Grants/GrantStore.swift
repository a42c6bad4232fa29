import DataProtectionKeybag
import Foundation
import SystemPackage

/// The broker's grant records: `ROOT/Sharing/Grants/<ID>.plist`, one binary property list each,
/// written atomically and removed on revocation (FORMAT.md §11.5). Each change is one file, so
/// no lock is needed; readers skip what does not parse.
package struct GrantStore: Sendable {
    let directory: String

    package init(layout: DataRootLayout) {
        directory = layout.grants
    }

    func save(_ grant: Grant) throws {
        try makeSharingDirectory(directory)
        try POSIXFile.writeAtomically(directory + "/" + grant.id.uuidString + ".plist", try binaryPropertyList(grant),
                                      permissions: .init(rawValue: 0o600))
    }

    /// Decoded grants, while their record is the same file.
    private static let cache = RecordCache<Grant>()

    func grant(_ id: UUID) -> Grant? {
        let path = directory + "/" + id.uuidString + ".plist"
        return Self.cache.value(at: path) {
            guard let bytes = try? POSIXFile.readRegularFile(path, maxSize: 64 << 10),
                  let grant = try? PropertyListDecoder().decode(Grant.self, from: Data(bytes)), grant.version == 1, grant.id == id else { return nil }
            return grant
        }
    }

    package func all() -> [Grant] {
        let names = (try? POSIXFile.directoryEntries(directory)) ?? []
        return names.filter { !$0.hasPrefix(".") && $0.hasSuffix(".plist") }
            .compactMap { UUID(uuidString: String($0.dropLast(6))).flatMap(grant) }
            .sorted { ($0.created, $0.id.uuidString) < ($1.created, $1.id.uuidString) }
    }

    /// Removes a grant; `false` when there was none.
    @discardableResult
    func remove(_ id: UUID) -> Bool {
        (try? POSIXFile.call("unlink", directory + "/" + id.uuidString + ".plist") { unlink($0) }) != nil
    }
}
