import DataProtectionContainers
import DataProtectionIPC
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Sharing, from inside an app: what `UIDocumentInteractionController` and
/// `scene(_:openURLContexts:)` do on iOS, through the app's supervisor (the broker).
///
/// ```swift
/// let app = CurrentApp.shared!
/// try await app.open(app.documents.appendingPathComponent("report.pdf"), in: "com.example.viewer")
///
/// // in com.example.viewer:
/// for await opened in app.openedURLs {
///     print("asked to open \(opened.url.lastPathComponent) by \(opened.sender)")   // in Documents/Inbox
/// }
/// ```
extension CurrentApp {
    /// Asks the broker to copy `url` (a file in this app's container or one of its groups') into
    /// `recipient`'s Inbox and tell it. The recipient gets its own copy: later writes here never
    /// reach it. `name` is the name to show (`UIDocumentInteractionController.name`; default:
    /// the file's); the broker makes a safe Inbox name from it either way.
    ///
    /// - Throws: ``SharingError``: `.refused` with the broker's reason (an unknown app, a
    ///   directory, a link…), `.protectedDataUnavailable` when the file's class is locked,
    ///   `.brokerUnavailable` when the supervisor offers no sharing.
    public func open(_ url: URL, in recipient: String, name: String? = nil) async throws {
        try await ask(
            SharingProtocol.request(.openIn) { w in
                SharingProtocol.string(&w, recipient)
                SharingProtocol.string(&w, url.path)
                SharingProtocol.string(&w, name ?? "")
            })
    }

    /// Shares `url` (a file of this app's container) with `recipient`, as a Share extension
    /// receives it: read-only, until the recipient ends the share or exits. By default the
    /// recipient reads a **snapshot** taken now, so later writes here stay private; `live: true`
    /// lets it see them (a known pitfall, made an explicit choice).
    public func share(_ url: URL, with recipient: String, live: Bool = false) async throws {
        try await ask(
            SharingProtocol.request(.share) { w in
                SharingProtocol.string(&w, recipient)
                SharingProtocol.string(&w, url.path)
                w.u8(live ? 1 : 0)
            })
    }

    /// Grants `recipient` `capabilities` on an item of this app's container — what a File
    /// Provider extension does, but the capabilities are enforced (a read-only grant hands out
    /// read-only descriptors). Returns the grant's ID. Not the Inbox, not the metadata.
    public func grant(
        _ url: URL, to recipient: String, capabilities: GrantCapabilities, expiresAfter: TimeInterval? = nil,
        persistent: Bool = false
    ) async throws -> UUID {
        let answer = try await ask(
            SharingProtocol.request(.grant) { w in
                SharingProtocol.string(&w, recipient)
                SharingProtocol.string(&w, url.path)
                w.u8(capabilities.rawValue)
                w.u32(UInt32(clamping: Int(expiresAfter.map { max(1, $0.rounded(.up)) } ?? 0)))
                w.u8(persistent ? 1 : 0)
            })
        guard answer.count == 16 else { throw SharingError.brokerUnavailable }
        return UUID(bytes: answer)
    }

    /// Sends one request on a new sharing channel, throws the broker's refusal if any, and
    /// returns what follows `ok` in the answer. Copies of large files take time: 10 minutes.
    @discardableResult
    func ask(_ request: [UInt8], timeout: Int = 600) async throws -> [UInt8] {
        try await Task.detached { [self] in
            guard let channel = openServiceChannel(SharingProtocol.serviceIdentifier) else {
                throw SharingError.brokerUnavailable
            }
            defer { try? channel.close() }
            UnixSocket.setTimeouts(channel.rawValue, seconds: timeout)
            guard (try? IPCFrame.write(channel.rawValue, request)) != nil,
                let answer = try? IPCFrame.read(channel.rawValue)
            else {
                throw SharingError.brokerUnavailable
            }
            if let error = try SharingProtocol.outcome(answer) { throw error }
            return Array(answer.dropFirst(2))
        }.value
    }

    /// The files other apps asked this app to open, as they come (queued ones first): each in
    /// `Documents/Inbox`, the app's to read, keep (copy out) or delete. Like
    /// `scene(_:openURLContexts:)`, but an `AsyncSequence`; iterate it from one place. Ends when
    /// the supervisor does.
    public var openedURLs: AsyncStream<OpenedURL> {
        subscription(SharingProtocol.openedMask) { OpenedURL(event: $0) }
    }

    /// The items other apps share with this one, as they come (queued ones first) — what a
    /// Share extension receives. Read them while accessing; end each with
    /// ``SecurityScopedURL/endShare()`` (or they end when this app exits).
    public var sharedItems: AsyncStream<SecurityScopedURL> {
        subscription(SharingProtocol.sharedMask) { [self] in SecurityScopedURL(sharedEvent: $0, app: self) }
    }

    /// Events of the kinds in `mask`, parsed by `parse`, until the supervisor ends.
    private func subscription<Element: Sendable>(
        _ mask: UInt8, _ parse: @escaping @Sendable ([UInt8]) -> Element?
    ) -> AsyncStream<Element> {
        AsyncStream { continuation in
            guard let channel = openServiceChannel(SharingProtocol.serviceIdentifier) else {
                continuation.finish()
                return
            }
            let thread = Thread {
                defer { try? channel.close(); continuation.finish() }
                guard
                    (try? IPCFrame.write(channel.rawValue, SharingProtocol.request(.subscribe) { $0.u8(mask) })) != nil,
                    let first = try? IPCFrame.read(channel.rawValue),
                    (try? SharingProtocol.outcome(first)) == .some(nil)
                else { return }
                while let frame = try? IPCFrame.read(channel.rawValue), let element = parse(frame) {
                    if case .terminated = continuation.yield(element) { return }
                }
            }
            thread.name = "sharing events"
            continuation.onTermination = { _ in _ = shutdown(channel.rawValue, Int32(SHUT_RDWR)) }
            thread.start()
        }
    }
}

/// A file another app asked this one to open (`UIOpenURLContext`'s analogue).
public struct OpenedURL: Sendable, Equatable {
    /// The copy, in `Documents/Inbox`.
    public let url: URL
    /// The app that sent it (`UIOpenURLContext.options.sourceApplication`).
    public let sender: String

    init?(event frame: [UInt8]) {
        var r = ByteReader(frame)
        guard (try? r.u8("version")) == SharingProtocol.version,
            (try? r.u8("status")) == SharingProtocol.Status.event.rawValue,
            (try? r.u8("kind")) == SharingProtocol.EventKind.opened.rawValue,
            let path = try? SharingProtocol.string(&r, "path"), let sender = try? SharingProtocol.string(&r, "sender")
        else { return nil }
        url = URL(fileURLWithPath: path)
        self.sender = sender
    }
}
