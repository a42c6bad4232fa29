import Crypto
import Foundation
import Logging
import SystemPackage

// EmbeddedKeybag: events.
extension EmbeddedKeybag {
    // MARK: - Events

    /// A stream of lock events for this subscriber; it ends when the subscriber stops iterating.
    ///
    /// ```swift
    /// for await event in await keybag.events() where event == .willBecomeUnavailable { saveDrafts() }
    /// ```
    package func events() -> AsyncStream<ProtectedDataEvent> {
        let (stream, continuation) = AsyncStream<ProtectedDataEvent>.makeStream(bufferingPolicy: .unbounded)
        let token = UUID()
        streams[token] = continuation
        continuation.onTermination = { [weak self] _ in
            Task { await self?.removeStream(token) }
        }
        return stream
    }

    func removeStream(_ token: UUID) { streams[token] = nil }

    /// Calls `callback` on every event, like an app delegate's
    /// `applicationProtectedDataWillBecomeUnavailable(_:)`. Returns a token for ``removeObserver(_:)``.
    @discardableResult
    package func addObserver(_ callback: @escaping @Sendable (ProtectedDataEvent) -> Void) -> UUID {
        let token = UUID()
        observers[token] = callback
        return token
    }

    /// Stops calling an observer.
    package func removeObserver(_ token: UUID) { observers[token] = nil }

    func emit(_ event: ProtectedDataEvent) {
        for continuation in streams.values { continuation.yield(event) }
        for observer in observers.values { observer(event) }
    }
}
