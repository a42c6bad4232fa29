import DataProtectionIPC

#if canImport(Glibc)
import Glibc
#endif

/// The answers a channel owes its app, held back while the app has more requests waiting, so
/// that requests the app pipelined (start access, then open) are answered in one write: the
/// app wakes once, not once per answer. Nothing waits for the app: answers go out as soon as
/// no request is left to read, with a descriptor, and past 64 KiB.
struct AnswerQueue {
    let fd: Int32
    private var pending: [UInt8] = []
    /// Set by the reader of the channel: a request is already read and waiting to be served.
    var requestBuffered = false

    init(fd: Int32) { self.fd = fd }

    /// Queues one answer frame, and sends what is queued unless another request is waiting.
    mutating func send(_ payload: [UInt8]) throws {
        guard !payload.isEmpty, payload.count <= IPCFrame.maxLength else {
            throw IPCError("frame of \(payload.count) bytes")
        }
        pending += IPCFrame.header(payload.count)
        pending += payload
        if pending.count >= IPCFrame.maxLength || !requestWaiting { try flush() }
    }

    /// Sends what is queued, then one byte `00` carrying `descriptor` (`SCM_RIGHTS`) — in one
    /// message when the queue is small, so the app reads its answers and the descriptor at one
    /// wake-up (it reads with ``IPCFrameReader``, which never drops a descriptor).
    mutating func send(descriptor: Int32) throws {
        if pending.count >= 16 << 10 { try flush() }
        defer { pending.removeAll(keepingCapacity: true) }
        try UnixSocket.send(descriptor: descriptor, over: fd, message: pending + [0])
    }

    /// Sends every answer queued.
    mutating func flush() throws {
        guard !pending.isEmpty else { return }
        defer { pending.removeAll(keepingCapacity: true) }
        try IPCFrame.sendBytes(fd, pending)
    }

    /// Whether the app has already sent more (a peek that never blocks).
    private var requestWaiting: Bool {
        if requestBuffered { return true }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }
}
