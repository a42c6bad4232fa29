import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The sharing channel between an app and its supervisor (FORMAT.md §11.4), opened as the
/// supervisor's service 1. Every frame is an IPC frame (§8) whose payload starts with the
/// version; the app sends requests, the supervisor answers each in order; after `subscribe`
/// the channel carries only events.
enum SharingProtocol {
    static let version: UInt8 = 1
    /// The service's identifier on the supervisor socket (§10.3, op 3).
    static let serviceIdentifier: UInt8 = 1

    enum Op: UInt8 {
        /// Copy one of the app's files into another app's Inbox: target, path, display name
        /// (strings; an empty name: the file's own).
        case openIn = 1
        /// From now on, tell the app what it receives (events); answered `ok` first.
        case subscribe = 2
        /// Start access to a grant on this channel: its 16-byte ID.
        case startAccess = 3
        /// Stop access to a grant on this channel: its 16-byte ID.
        case stopAccess = 4
        /// A descriptor of a granted item: ID, mode (u8: 0 read, 1 read-write), subpath (string).
        /// An `ok` answer is followed by one byte `00` carrying the descriptor (`SCM_RIGHTS`).
        case open = 5
        /// The grants made to this app: answered `ok` followed by a binary property list.
        case list = 6
        /// End a share (or any grant) made to this app: its 16-byte ID.
        case endShare = 7
        /// Share one of the app's files with another app: target, path (strings), live (u8 0/1).
        case share = 8
        /// Grant another app an item of this app's container (a file provider): target, path
        /// (strings), capabilities (u8), lifetime in seconds (u32, 0: none), persistent (u8).
        /// Answered `ok` followed by the grant's 16-byte ID.
        case grant = 9
        /// List a granted directory (needs enumerate): ID, subpath. `ok` + a binary property list.
        case enumerate = 10
        /// Add an empty file below a granted directory (needs add): ID, subpath. `ok` + the class
        /// (u8) to protect it with, followed by one byte `00` carrying a read-write descriptor.
        case create = 11
        /// Rename an item (needs rename): ID, subpath, new name (strings).
        case rename = 12
        /// Delete an item (needs delete): ID, subpath.
        case delete = 13
        /// Resolve a bookmark: the grant's 16-byte ID. `ok`, stale (u8 0/1), then the grant as
        /// `list` describes one (a binary property list).
        case resolve = 14
    }

    /// What a subscription asks for (the optional byte after `subscribe`; absent: open-in only).
    static let openedMask: UInt8 = 1
    static let sharedMask: UInt8 = 2

    enum Status: UInt8 { case ok = 0, error = 1, event = 2 }
    /// What an error is, so the app can throw the matching ``SharingError``.
    enum ErrorKind: UInt8 { case unavailable = 1, refused = 2 }
    enum EventKind: UInt8 {
        /// A file to open: its path in the app's Inbox (string), the sender (string).
        case opened = 1
        /// An item shared with the app: the grant ID (16 bytes), the sender, the item's location
        /// (strings).
        case shared = 2
    }

    /// A string: u16 length, then UTF-8 (paths: their bytes, see `LosslessPath`).
    static func string(_ w: inout ByteWriter, _ text: String) { w.text(text) }
    static func string(_ r: inout ByteReader, _ field: String) throws -> String { try r.text(field) }

    static func request(_ op: Op, _ body: (inout ByteWriter) -> Void = { _ in }) -> [UInt8] {
        var w = ByteWriter()
        w.u8(version)
        w.u8(op.rawValue)
        body(&w)
        return w.bytes
    }

    static let ok: [UInt8] = [version, Status.ok.rawValue]

    static func uuid(_ w: inout ByteWriter, _ id: UUID) {
        withUnsafeBytes(of: id.uuid) { w.raw(Array($0)) }
    }

    static func uuid(_ r: inout ByteReader) throws -> UUID {
        UUID(bytes: try r.raw(16, "grant"))
    }

    static func failure(_ kind: ErrorKind, _ message: String) -> [UInt8] {
        var w = ByteWriter()
        w.u8(version)
        w.u8(Status.error.rawValue)
        w.u8(kind.rawValue)
        string(&w, message)
        return w.bytes
    }

    /// The error a failure frame carries, or `nil` for `ok`. Anything else is a protocol error.
    static func outcome(_ frame: [UInt8]) throws -> SharingError? {
        var r = ByteReader(frame)
        guard try r.u8("version") == version else {
            throw SharingError.refused("the supervisor speaks another sharing version")
        }
        switch Status(rawValue: try r.u8("status")) {
        case .ok: return nil
        case .error:
            let kind = ErrorKind(rawValue: try r.u8("kind"))
            let message = try string(&r, "message")
            return kind == .unavailable ? .protectedDataUnavailable(message) : .refused(message)
        default: throw SharingError.refused("unexpected answer from the supervisor")
        }
    }
}
