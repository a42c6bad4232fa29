import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
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

    enum CodingKeys: String, CodingKey {
        case version = "Version", kind = "Kind", name = "Name", sender = "Sender", date = "Date"
    }
}

/// The queue of one app's deliveries: one property-list file each, written atomically under a
/// name that sorts in queue order; removed once delivered.
struct DeliveryQueue: Sendable {
    let directory: String

    init(layout: DataRootLayout, app: UUID) {
        directory = layout.deliveries(for: app)
    }

    /// Items one app may have waiting for another at once: a sender that floods an app's queue
    /// is refused, and other apps' deliveries to it still go.
    static let limitPerSender = 100

    /// Refuses a new delivery from `sender` when ``limitPerSender`` of its deliveries are waiting.
    func requireRoom(from sender: AppIdentifier, to recipient: AppIdentifier) throws {
        let waiting = pending().filter { $0.delivery.sender == sender.rawValue }.count
        guard waiting < Self.limitPerSender else {
            throw SharingError.refused(
                "\(recipient) has \(waiting) items from \(sender) it has not received yet (at most \(Self.limitPerSender)): nothing was sent"
            )
        }
    }

    /// Adds `delivery` to the queue.
    func enqueue(_ delivery: Delivery) throws {
        try makeSharingDirectory(directory)
        let bytes = try binaryPropertyList(delivery)
        let name =
            String(format: "%020llu", UInt64(delivery.date.timeIntervalSince1970 * 1_000_000_000)) + "-"
            + UUID().uuidString + ".plist"
        try POSIXFile.writeAtomically(directory + "/" + name, bytes, permissions: .init(rawValue: 0o600))
    }

    /// The queued deliveries, oldest first, with their record names. Records that do not parse
    /// are skipped (and left for a person to look at).
    func pending() -> [(record: String, delivery: Delivery)] {
        guard let names = try? POSIXFile.directoryEntries(directory) else { return [] }
        return names.filter { !$0.hasPrefix(".") && $0.hasSuffix(".plist") }.sorted().compactMap { name in
            guard let bytes = try? POSIXFile.readRegularFile(directory + "/" + name, maxSize: 64 << 10),
                let delivery = try? PropertyListDecoder().decode(Delivery.self, from: Data(bytes)),
                delivery.version == 1
            else { return nil }
            return (name, delivery)
        }
    }

    /// Claims a record for delivery by renaming it to `<record>.sending-<pid>-<start time>`, so
    /// that two subscribers never both deliver it and a supervisor killed mid-send leaves it
    /// claimed, not gone. `nil` when another subscriber claimed it first.
    func claim(_ record: String) -> String? {
        let claimed = record + ".sending-" + Self.processTag
        guard
            (try? POSIXFile.call("rename", directory + "/" + record, directory + "/" + claimed) { rename($0, $1) })
                != nil
        else { return nil }
        return claimed
    }

    /// Puts a claimed record back in the queue (its delivery failed).
    func release(_ claimed: String) {
        guard let range = claimed.range(of: ".sending-", options: .backwards) else { return }
        let record = String(claimed[..<range.lowerBound])
        _ = try? POSIXFile.call("rename", directory + "/" + claimed, directory + "/" + record) { rename($0, $1) }
    }

    /// Puts back the records claimed by processes that are gone (killed while delivering): the
    /// app is told at least once.
    func releaseAbandonedClaims() {
        for name in (try? POSIXFile.directoryEntries(directory)) ?? [] {
            guard let range = name.range(of: ".plist.sending-", options: .backwards) else { continue }
            let tag = String(name[range.upperBound...])
            let parts = tag.split(separator: "-")
            guard parts.count == 2, let pid = Int32(parts[0]), tag != Self.processTag, Self.tag(of: pid) != tag else {
                continue
            }
            release(name)
        }
    }

    /// This process's tag: its PID and start time (field 22 of `/proc/PID/stat`), so a reused
    /// PID is not mistaken for the process that made a claim.
    static let processTag = tag(of: getpid()) ?? "\(getpid())-0"

    private static func tag(of pid: Int32) -> String? {
        guard let bytes = try? POSIXFile.readRegularFile("/proc/\(pid)/stat", maxSize: 4096) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        // The command name (field 2) is in parentheses and may hold spaces: count after it.
        guard let close = text.range(of: ")", options: .backwards) else { return nil }
        let fields = text[close.upperBound...].split(separator: " ")
        guard fields.count > 19 else { return nil }
        return "\(pid)-\(fields[19])"
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
