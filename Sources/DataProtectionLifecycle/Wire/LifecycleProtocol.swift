import DataProtectionKeybag
import DataProtectionSystem
import Foundation

/// The lifecycle channel between an app and its supervisor (FORMAT.md §12.2), opened as the
/// supervisor's service 2, and the control socket `dpctl` reaches a running app's supervisor on
/// (§12.3). Frames are IPC frames (§8) whose payload starts with the version; each request is
/// answered in order; after `subscribe` the channel carries only events.
enum LifecycleProtocol {
    static let version: UInt8 = 1
    /// The service's identifier on the supervisor socket (§10.3, op 3).
    static let serviceIdentifier: UInt8 = 2

    /// App → supervisor, on the lifecycle channel.
    enum Op: UInt8 {
        /// From now on, events; answered `ok` + the state (u8) first.
        case subscribe = 1
        /// Begin a background task: name (string). `ok` + its ID (u32; 0: `.invalid`).
        case beginTask = 2
        /// End a background task: its ID (u32).
        case endTask = 3
        /// `ok` + the background time remaining, seconds (f64; −1: unlimited, the app is in front).
        case timeRemaining = 4
        /// `ok` + the supervisor clock's time, seconds since 1970 (f64).
        case now = 5
        /// Answered `ok` once the supervisor's clock reaches the time given (f64, seconds since 1970).
        case sleepUntil = 6
        /// `ok` + the state (u8).
        case state = 7
    }

    /// `dpctl` → supervisor, on the control socket.
    enum ControlOp: UInt8 {
        /// The home button: `ok` + the state after.
        case background = 1
        /// Back to the front: `ok` + the state after (an error while the device is locked).
        case foreground = 2
        /// `ok` + a binary property list describing the run (§12.3).
        case status = 3
        /// Stop the app: `willTerminate` and `SIGTERM`, then `SIGKILL` after the grace period —
        /// the request's (f64 seconds, 0…3600, optional) or the supervisor's. `ok`.
        case terminate = 4
    }

    enum Status: UInt8 { case ok = 0, error = 1, event = 2 }
    /// An event's kind: 1…5 the ``LifecycleEvent`` raw values; 6 a task's time is nearly up.
    static let taskExpiring: UInt8 = 6

    static let ok: [UInt8] = [version, Status.ok.rawValue]

    static func failure(_ message: String) -> [UInt8] {
        var w = ByteWriter()
        w.u8(version)
        w.u8(Status.error.rawValue)
        string(&w, message)
        return w.bytes
    }

    static func string(_ w: inout ByteWriter, _ text: String) { w.text(text) }
    static func string(_ r: inout ByteReader, _ field: String) throws -> String { try r.text(field) }

    static func double(_ w: inout ByteWriter, _ value: Double) { w.u64(value.bitPattern) }
    static func double(_ r: inout ByteReader, _ field: String) throws -> Double { Double(bitPattern: try r.u64(field)) }

    static func request(_ op: UInt8, _ body: (inout ByteWriter) -> Void = { _ in }) -> [UInt8] {
        var w = ByteWriter()
        w.u8(version)
        w.u8(op)
        body(&w)
        return w.bytes
    }

    /// The body of an `ok` answer, or the error's message thrown as ``LifecycleError/refused(_:)``.
    static func body(_ answer: [UInt8]) throws -> ByteReader {
        var r = ByteReader(answer)
        guard (try? r.u8("version")) == version, let raw = try? r.u8("status"), let status = Status(rawValue: raw)
        else {
            throw LifecycleError.protocolViolation("a malformed answer")
        }
        switch status {
        case .ok: return r
        case .error: throw LifecycleError.refused((try? string(&r, "message")) ?? "refused")
        case .event: throw LifecycleError.protocolViolation("an event where an answer was due")
        }
    }
}
