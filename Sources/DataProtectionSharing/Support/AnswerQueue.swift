import DataProtectionIPC
#if canImport(Glibc)
import Glibc
#endif

/// The answers a channel owes its app, held back while the app has more requests waiting, so
/// that requests the app pipelined (start access, then open) are answered in one write: the
/// app wakes once, not once per answer. Nothing waits for the app: answers go out as soon as
/// no request is left to read, before a descriptor, and past 64 KiB.
struct AnswerQueue {
    let fd: Int32
    private var pending: [UInt8] = []

    init(fd: Int32) { self.fd = fd }

    /// Queues one answer frame, and sends what is queued unless another request is waiting.
    mutating func send(_ payload: [UInt8]) throws {
        guard !payload.isEmpty, payload.count <= IPCFrame.maxLength else { throw IPCError("frame of \(payload.count) bytes") }
        pending += IPCFrame.header(payload.count)
        pending += payload
        if pending.count >= IPCFrame.maxLength || !requestWaiting { try flush() }
    }

    /// Sends what is queued, then one byte `00` carrying `descriptor` (`SCM_RIGHTS`).
    mutating func send(descriptor: Int32) throws {
        try flush()
        try UnixSocket.send(descriptor: descriptor, over: fd, message: [0])
    }

    /// Sends every answer queued.
    mutating func flush() throws {
        guard !pending.isEmpty else { return }
        defer { pending.removeAll(keepingCapacity: true) }
        try IPCFrame.sendBytes(fd, pending)
    }

    /// Whether the app has already sent more (a peek that never blocks).
    private var requestWaiting: Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }
}
