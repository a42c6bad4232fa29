import DataProtectionIPC
import DataProtectionSystem
import Foundation

/// Serving keybag requests on behalf of someone else — an app's supervisor answering its app
/// (FORMAT.md §10.3) — with whichever keys this process uses: its embedded keybag, or the keybagd
/// it is a client of.
extension Keybag {
    /// The operations an app may ask for: its own files' keys and the lock state. Never unlock,
    /// lock, erase, passcode or policy changes, nor the backup-authentication key.
    package static let appOperations: Set<KeybagWire.Op> = [
        .hello, .status, .isAvailable, .canCreate, .generation, .wrapNewFileKey, .unwrapFileKey,
        .rewrapFileKey, .wrap, .lockState, .isProtectedDataAvailable, .gracePeriod,
    ]

    /// The operations an app whose files the protected file system serves may ask for: the lock
    /// state only. It never needs a key: the file system seals its files.
    package static let servedAppOperations: Set<KeybagWire.Op> = [
        .hello, .status, .isAvailable, .canCreate, .generation, .lockState, .isProtectedDataAvailable, .gracePeriod,
    ]

    /// Answers one request (its body after the opcode) and returns the answer's body: performed on
    /// the embedded keybag, or passed on to keybagd. Errors are the keybag's own
    /// (``KeybagError``), ready to be sent back as the daemon would.
    package func answer(_ op: KeybagWire.Op, body: [UInt8]) async throws -> [UInt8] {
        guard let request = KeybagRequests.byOpcode[op] else {
            throw KeybagWire.ProtocolError("operation \(op) is not served")
        }
        if let embedded = backend as? EmbeddedKeybag {
            var reader = ByteReader(body)
            var writer = ByteWriter(capacity: 1024)
            try await request.answer(&reader, &writer, keybag: embedded)
            return writer.bytes
        }
        guard let daemon = backend as? KeybagdClient else { throw KeybagError.daemon("no keys to answer with") }
        var reader = try daemon.connection.call(op) { $0.raw(body) }
        return try reader.raw(reader.remaining, "answer")
    }

    /// A keybag whose keys someone else serves on connections that `connector` opens — inside an
    /// app's sandbox, its supervisor (`DataProtectionContainers` uses this). `description`
    /// names that other end in errors.
    package static func open(description: String, connector: @escaping @Sendable () -> Int32?) throws -> Keybag {
        let client = try KeybagdConnection.connect(description: description, connector: connector)
        let hello = try client.send(KeybagRequests.Hello())
        return Keybag(daemon: client, root: hello.root, id: hello.id)
    }
}
