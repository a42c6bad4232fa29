import DataProtectionKeybag
import Foundation
import Testing

@Suite struct LockStateTests {
    @Test func startsBeforeFirstUnlockAfterEveryOpen() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        #expect(await keybag.lockState == .beforeFirstUnlock)
        #expect(await keybag.isProtectedDataAvailable == false)
        #expect(await keybag.isAvailable(.noProtection))
        #expect(await !keybag.isAvailable(.completeUntilFirstUserAuthentication))
        #expect(await !keybag.isAvailable(.completeUnlessOpen))
        #expect(await !keybag.isAvailable(.complete))
        #expect(await keybag.canCreate(.completeUnlessOpen))
    }

    @Test func availabilityPerClassAcrossStates() async throws {
        let (_, clock, root) = try await makeDevice(grace: 10)
        let keybag = try await Keybag.open(root: root, clock: clock)
        try await keybag.unlock(passcode: "123456")
        #expect(await keybag.lockState == .unlocked)
        for cls in ProtectionClass.allCases { #expect(await keybag.isAvailable(cls)) }

        await keybag.lock()
        #expect(await keybag.lockState == .locked)
        // Within the grace period everything still works.
        clock.advance(by: 9.9)
        #expect(await keybag.isAvailable(.complete))
        #expect(await keybag.isProtectedDataAvailable)
        // After it, A and B-reopen are gone; C and D stay.
        clock.advance(by: 0.1)
        #expect(await !keybag.isAvailable(.complete))
        #expect(await !keybag.isAvailable(.completeUnlessOpen))
        #expect(await keybag.isAvailable(.completeUntilFirstUserAuthentication))
        #expect(await keybag.isAvailable(.noProtection))
        #expect(await keybag.canCreate(.completeUnlessOpen))
        #expect(await !keybag.canCreate(.complete))
        #expect(await keybag.isProtectedDataAvailable == false)

        try await keybag.unlock(passcode: "123456")
        for cls in ProtectionClass.allCases { #expect(await keybag.isAvailable(cls)) }
    }

    @Test func gracePeriodIsConfigurableAndPersisted() async throws {
        let (keybag, clock, root) = try await makeDevice(grace: 10)
        try await keybag.setGracePeriod(0)
        let reopened = try await Keybag.open(root: root, clock: clock)
        try await reopened.unlock(passcode: "123456")
        await reopened.lock()
        #expect(await !reopened.isAvailable(.complete))
    }

    @Test func eventsArriveAsStreamAndCallbacks() async throws {
        let (_, clock, root) = try await makeDevice()
        let keybag = try await Keybag.open(root: root, clock: clock)
        let stream = await keybag.events()
        let received = EventLog()
        await keybag.addObserver { received.append($0) }
        try await keybag.unlock(passcode: "123456")
        await keybag.lock()
        clock.advance(by: 10)
        try await keybag.unlock(passcode: "123456")
        var iterator = stream.makeAsyncIterator()
        #expect(await iterator.next() == .didBecomeAvailable)
        #expect(await iterator.next() == .willBecomeUnavailable)
        #expect(await iterator.next() == .didBecomeAvailable)
        #expect(received.events == [.didBecomeAvailable, .willBecomeUnavailable, .didBecomeAvailable])
    }

    @Test func statusAfterTheGracePeriodShowsOnlyCAndD() async throws {
        let (_, clock, root) = try await makeDevice(grace: 10)
        let keybag = try await Keybag.open(root: root, clock: clock)
        try await keybag.unlock(passcode: "123456")
        await keybag.lock()
        clock.advance(by: 10)
        #expect(await keybag.status.graceRemaining == nil)
        #expect(await keybag.status.available == [.completeUntilFirstUserAuthentication, .noProtection])
    }

    @Test func noPasscodeMeansProtectionInactive() async throws {
        let (_, clock, root) = try await makeDevice(passcode: nil)
        let keybag = try await Keybag.open(root: root, clock: clock)
        #expect(await keybag.lockState == .unlocked)
        await keybag.lock()
        #expect(await keybag.lockState == .unlocked)
        for cls in ProtectionClass.allCases { #expect(await keybag.isAvailable(cls)) }
        #expect(await keybag.status.protectionActive == false)
    }
}

final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var _events: [ProtectedDataEvent] = []
    func append(_ e: ProtectedDataEvent) { lock.lock(); _events.append(e); lock.unlock() }
    var events: [ProtectedDataEvent] { lock.lock(); defer { lock.unlock() }; return _events }
}
