import Crypto
import Foundation
import Logging
import Synchronization

/// Lock-state events: `protectedDataWillBecomeUnavailable` and `DidBecomeAvailable`, as UIKit
/// posts them, and what a class key's discard and a keybagd's return tell observers.
extension Keybag {
    /// Lock-state events as an async sequence, like UIKit's notifications.
    ///
    /// ```swift
    /// for await event in await keybag.events() where event == .willBecomeUnavailable { saveDrafts() }
    /// ```
    public func events() async -> AsyncStream<ProtectedDataEvent> {
        await backend.events()
    }

    /// Calls `callback` on every event, like an app delegate's
    /// `applicationProtectedDataWillBecomeUnavailable(_:)`. Returns a token for ``removeObserver(_:)``.
    @discardableResult
    public func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) async -> UUID {
        await backend.addObserver(callback)
    }

    /// Stops calling an observer.
    public func removeObserver(_ token: UUID) async {
        await backend.removeObserver(token)
    }

    /// Calls `callback` each time a class key is discarded (the end of a grace period, an erase),
    /// before the keybag goes on. Layers that cache keys derived from a class drop them here.
    @discardableResult
    package func addDiscardObserver(_ callback: @escaping @Sendable (ProtectionClass) -> Void) async -> UUID {
        await backend.addDiscardObserver(callback)
    }

    /// Stops calling a discard observer.
    package func removeDiscardObserver(_ token: UUID) async {
        await backend.removeDiscardObserver(token)
    }

    /// Calls `callback` with the classes whose keys a keybagd has when it answers again after it
    /// went away (a restart); never for a keybag of this process. Layers that closed classes at
    /// the loss reopen those. Stop with ``removeDiscardObserver(_:)``.
    @discardableResult
    package func addReturnObserver(_ callback: @escaping @Sendable (Set<ProtectionClass>) -> Void) async -> UUID? {
        (backend as? KeybagdClient)?.remoteEvents.addReturnObserver(callback)
    }
}
