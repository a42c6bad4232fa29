import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
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

    /// The most grants one app may have given that have not ended: one app cannot fill the
    /// device's records, nor make every other app's exit read thousands of them.
    package static let limitPerProvider = 1_000

    /// `Grants/.by-app/<container UUID>/<grant ID>`: an empty file per grant under its provider's
    /// and its recipient's container, so an app's grants are found without reading every record.
    private var index: String { directory + "/.by-app" }

    func save(_ grant: Grant) throws {
        try makeSharingDirectory(directory)
        for container in [grant.providerContainer, grant.recipientContainer] {
            try makeSharingDirectory(index)
            try makeSharingDirectory(index + "/" + container.uuidString)
            let entry = index + "/" + container.uuidString + "/" + grant.id.uuidString
            if POSIXFile.linkStatus(entry) == nil {
                try POSIXFile.writeNew(entry, [], permissions: .init(rawValue: 0o600))
            }
        }
        try POSIXFile.writeAtomically(
            directory + "/" + grant.id.uuidString + ".plist", try binaryPropertyList(grant),
            permissions: .init(rawValue: 0o600))
    }

    /// The grants `container` gave or received (through the index; entries whose record is gone
    /// are dropped).
    package func grants(involving container: UUID) -> [Grant] {
        ensureIndex()
        let folder = index + "/" + container.uuidString
        return ((try? POSIXFile.directoryEntries(folder)) ?? []).compactMap { name -> Grant? in
            guard let id = UUID(uuidString: name) else { return nil }
            guard let grant = grant(id) else {
                _ = try? POSIXFile.call("unlink", folder + "/" + name) { unlink($0) }
                return nil
            }
            return grant
        }
    }

    /// Refuses a new grant or share from `provider` when it has ``limitPerProvider`` that have not ended.
    func requireRoom(forGrantsOf provider: AppContainer, at now: Date) throws {
        let given = grants(involving: provider.uuid).filter {
            $0.providerContainer == provider.uuid && !$0.isExpired(at: now)
        }.count
        guard given < Self.limitPerProvider else {
            throw SharingError.refused(
                "\(provider.identifier) has given \(given) grants and shares that have not ended (at most \(Self.limitPerProvider)): end some first"
            )
        }
    }

    /// Grants recorded before the index existed are indexed once, the first time it is needed.
    private func ensureIndex() {
        guard POSIXFile.linkStatus(index) == nil, POSIXFile.linkStatus(directory) != nil else { return }
        for grant in all() {
            for container in [grant.providerContainer, grant.recipientContainer] {
                try? makeSharingDirectory(index)
                try? makeSharingDirectory(index + "/" + container.uuidString)
                try? POSIXFile.writeNew(
                    index + "/" + container.uuidString + "/" + grant.id.uuidString, [],
                    permissions: .init(rawValue: 0o600))
            }
        }
        try? makeSharingDirectory(index)
    }

    /// Decoded grants, while their record is the same file.
    private static let cache = RecordCache<Grant>()

    func grant(_ id: UUID) -> Grant? {
        let path = directory + "/" + id.uuidString + ".plist"
        return Self.cache.value(at: path) {
            guard let bytes = try? POSIXFile.readRegularFile(path, maxSize: 64 << 10),
                let grant = try? PropertyListDecoder().decode(Grant.self, from: Data(bytes)), grant.version == 1,
                grant.id == id
            else { return nil }
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
        let known = grant(id)
        let removed = (try? POSIXFile.call("unlink", directory + "/" + id.uuidString + ".plist") { unlink($0) }) != nil
        for container in [known?.providerContainer, known?.recipientContainer].compactMap({ $0 }) {
            _ = try? POSIXFile.call("unlink", index + "/" + container.uuidString + "/" + id.uuidString) { unlink($0) }
        }
        return removed
    }

    /// Removes an app's index folder (it is uninstalled, its grants removed).
    func removeIndex(of container: UUID) {
        try? POSIXFile.removeTree(index + "/" + container.uuidString)
    }
}
