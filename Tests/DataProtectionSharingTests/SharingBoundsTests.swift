@testable import DataProtectionSharing
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// One app flooding another through the broker: what it may queue, copy into the other's
/// Inbox and keep in snapshots outside its container has a bound, and other apps' deliveries
/// to the same recipient still go.
@Suite struct SharingBoundsTests {
    func setUp() async throws -> (TestDevice, ContainerManager, SharingBroker) {
        let device = try await TestDevice.make()
        try await device.keybag.unlock(passcode: "123456")
        let manager = ContainerManager(files: device.files)
        for id in ["com.example.flood", "com.example.friend", "com.example.target"] { try await manager.install(AppIdentifier(id)) }
        return (device, manager, SharingBroker(manager: manager))
    }

    @Test func aSenderFloodingAnAppsQueueIsRefusedAndOthersStillDeliver() async throws {
        let (device, manager, broker) = try await setUp()
        let flood = try manager.app(AppIdentifier("com.example.flood")), friend = try manager.app(AppIdentifier("com.example.friend"))
        try await device.files.write(Data("x".utf8), to: flood.documents.appendingPathComponent("x.txt"))
        try await device.files.write(Data("hello".utf8), to: friend.documents.appendingPathComponent("hello.txt"))
        var sent = 0, refusal: String?
        for _ in 0..<(DeliveryQueue.limitPerSender + 20) {
            do {
                _ = try await broker.openIn("Documents/x.txt", from: flood.identifier, to: AppIdentifier("com.example.target"))
                sent += 1
            } catch let error as SharingError {
                refusal = error.description
                break
            }
        }
        #expect(sent == DeliveryQueue.limitPerSender)
        #expect(refusal?.contains("has 100 items from com.example.flood it has not received yet") == true, "\(refusal ?? "no refusal")")
        // Shares count against the same bound.
        #expect(throws: SharingError.self) { try broker.share("Documents/x.txt", from: flood.identifier, with: AppIdentifier("com.example.target")) }
        // Another sender is not held up by the flood.
        let copy = try await broker.openIn("Documents/hello.txt", from: friend.identifier, to: AppIdentifier("com.example.target"))
        #expect(copy.url.lastPathComponent == "hello.txt")
    }

    @Test func anInboxLeftFullRefusesMoreUntilItsAppRemovesSome() async throws {
        let (device, manager, broker) = try await setUp()
        let friend = try manager.app(AppIdentifier("com.example.friend")), target = try manager.app(AppIdentifier("com.example.target"))
        try await device.files.write(Data("hello".utf8), to: friend.documents.appendingPathComponent("hello.txt"))
        // Files the target was delivered and kept (what a sender's earlier open-ins left).
        for n in 0..<SharingBroker.inboxLimit { try Data().write(to: target.inboxStorage.appendingPathComponent("kept-\(n)")) }
        await #expect(throws: SharingError.self) {
            _ = try await broker.openIn("Documents/hello.txt", from: friend.identifier, to: target.identifier)
        }
        try FileManager.default.removeItem(at: target.inboxStorage.appendingPathComponent("kept-0"))
        _ = try await broker.openIn("Documents/hello.txt", from: friend.identifier, to: target.identifier)
    }

    @Test func snapshotsOutsideTheContainerHaveABudgetPerApp() async throws {
        var (device, manager, broker) = try await setUp()
        broker.snapshotBytesPerApp = 3 << 20
        let flood = try manager.app(AppIdentifier("com.example.flood")), friend = try manager.app(AppIdentifier("com.example.friend"))
        try await device.files.write(Data(repeating: 1, count: 1 << 20), to: flood.documents.appendingPathComponent("big.bin"))
        try await device.files.write(Data(repeating: 2, count: 1 << 20), to: friend.documents.appendingPathComponent("big.bin"))
        var shares: [Grant] = []
        for _ in 0..<2 { shares.append(try broker.share("Documents/big.bin", from: flood.identifier, with: AppIdentifier("com.example.target"))) }
        #expect(throws: SharingError.self) { try broker.share("Documents/big.bin", from: flood.identifier, with: AppIdentifier("com.example.target")) }
        let snapshots = try FileManager.default.contentsOfDirectory(atPath: manager.layout.snapshots)
        #expect(snapshots.count == 2, "the refused share left no snapshot: \(snapshots)")
        // Another app's shares have their own budget; a live share (no snapshot) is not counted.
        _ = try broker.share("Documents/big.bin", from: friend.identifier, with: AppIdentifier("com.example.target"))
        _ = try broker.share("Documents/big.bin", from: flood.identifier, with: AppIdentifier("com.example.friend"), live: true)
        // Ending a share gives its room back.
        try broker.endShare(shares[0].id, for: try manager.app(AppIdentifier("com.example.target")))
        _ = try broker.share("Documents/big.bin", from: flood.identifier, with: AppIdentifier("com.example.friend"))
    }
}
