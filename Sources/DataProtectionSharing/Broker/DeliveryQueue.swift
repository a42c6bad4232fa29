import DataProtectionContainers
import DataProtectionKeybag
import Foundation
import SystemPackage

/// Something an app is to be told, kept until it has been (FORMAT.md §11.3): the copy of an
/// "open in" waiting in its Inbox. Delivered in the order queued, at the app's next
/// subscription — now if it runs, else at its next launch.
public struct Delivery: Codable, Sendable, Equatable {
    public enum Kind: String, Codable, Sendable { case openIn = "open-in", share }
    public var version = 1
    public var kind: Kind
    /// The file's name in the recipient's Inbox (open-in), or the share's grant ID (share).
    public var name: String
    /// The app that sent it.
    public var sender: String
    public var date: Date

    enum CodingKeys: String, CodingKey { case version = "Version", kind = "Kind", name = "Name", sender = "Sender", date = "Date" }
}

/// The queue of one app's deliveries: one property-list file each, written atomically under a
/// name that sorts in queue order; removed once delivered.
struct DeliveryQueue: Sendable {
    let directory: String

    init(layout: DataRootLayout, app: UUID) {
        directory = layout.deliveries(for: app)
    }

    /// Adds `delivery` to the queue.
    func enqueue(_ delivery: Delivery) throws {
        try makeSharingDirectory(directory)
        let bytes = try binaryPropertyList(delivery)
        let name = String(format: "%020llu", UInt64(delivery.date.timeIntervalSince1970 * 1_000_000_000)) + "-" + UUID().uuidString + ".plist"
        try POSIXFile.writeAtomically(directory + "/" + name, bytes, permissions: .init(rawValue: 0o600))
    }

    /// The queued deliveries, oldest first, with their record names. Records that do not parse
    /// are skipped (and left for a person to look at).
    func pending() -> [(record: String, delivery: Delivery)] {
        guard let names = try? POSIXFile.directoryEntries(directory) else { return [] }
        return names.filter { !$0.hasPrefix(".") && $0.hasSuffix(".plist") }.sorted().compactMap { name in
            guard let bytes = try? POSIXFile.readRegularFile(directory + "/" + name, maxSize: 64 << 10),
                  let delivery = try? PropertyListDecoder().decode(Delivery.self, from: Data(bytes)), delivery.version == 1 else { return nil }
            return (name, delivery)
        }
    }

    /// Removes a delivered record.
    func remove(_ record: String) {
        _ = try? POSIXFile.call("unlink", directory + "/" + record) { unlink($0) }
    }

    /// Removes the whole queue (the app was uninstalled).
    func removeAll() {
        for name in (try? POSIXFile.directoryEntries(directory)) ?? [] { remove(name) }
        _ = try? POSIXFile.call("rmdir", directory) { rmdir($0) }
    }
}
