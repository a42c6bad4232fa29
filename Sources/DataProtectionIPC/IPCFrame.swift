import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A protocol error on a socket: a frame too long or too short, a connection closed mid-frame,
/// a peer that does not answer within its timeout. It closes that connection, nothing else.
package struct IPCError: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// Length-prefixed frames on a stream socket — the framing every DataProtection process
/// boundary uses (keybagd, and the app supervisor and sharing broker after it):
///
///     frame = length u32 big-endian (1…65,536) | payload
///
/// What the payload means is the protocol's (FORMAT.md §8 for keybagd).
package enum IPCFrame {
    package static let maxLength = 65_536

    /// Writes one frame; `EPIPE` and friends come back as errors (never SIGPIPE).
    package static func write(_ fd: Int32, _ payload: [UInt8]) throws {
        var frame = [UInt8](repeating: 0, count: 4)
        frame.reserveCapacity(payload.count + 4)
        frame += payload
        try send(fd, &frame)
    }

    /// The 4-byte header of a frame of `length` bytes.
    package static func header(_ length: Int) -> [UInt8] {
        [
            UInt8(truncatingIfNeeded: length >> 24), UInt8(truncatingIfNeeded: length >> 16),
            UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length),
        ]
    }

    /// Sends a frame built in place: `frame` holds 4 bytes for the length, then the payload.
    /// One buffer, no copy — callers wipe it afterwards when it carried a secret.
    package static func send(_ fd: Int32, _ frame: inout [UInt8]) throws {
        let length = frame.count - 4
        guard length > 0, length <= maxLength else { throw IPCError("frame of \(length) bytes") }
        for (i, byte) in header(length).enumerated() { frame[i] = byte }
        try sendAll(fd, frame)
    }

    /// Sends every byte of a frame already laid out (header included).
    package static func sendAll(_ fd: Int32, _ frame: [UInt8]) throws {
        guard frame.count > 4, frame.count - 4 <= maxLength else { throw IPCError("frame of \(frame.count - 4) bytes") }
        try sendBytes(fd, frame)
    }

    /// Sends every byte of `bytes` — whole frames, laid out by the caller — in as few `send`s as
    /// the socket allows.
    package static func sendBytes(_ fd: Int32, _ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { buffer in
            var sent = 0
            while sent < buffer.count {
                let n = Glibc.send(fd, buffer.baseAddress! + sent, buffer.count - sent, Int32(MSG_NOSIGNAL))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw IPCError("send: \(String(cString: strerror(errno)))")
                }
                sent += n
            }
        }
    }

    /// Sends one frame (`payload` with its header) to every descriptor without ever blocking: a
    /// peer whose socket buffer cannot take the whole frame (it stopped reading) is shut down and
    /// removed — a stream cannot resume mid-frame. Returns how many were removed.
    package static func broadcast(_ payload: [UInt8], to fds: inout Set<Int32>) -> Int {
        let frame = header(payload.count) + payload
        var dropped = 0
        for fd in fds {
            let sent = frame.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            }
            if sent != frame.count {
                shutdown(fd, Int32(SHUT_RDWR))
                fds.remove(fd)
                dropped += 1
            }
        }
        return dropped
    }

    /// Reads one frame; `nil` at a clean end of stream.
    package static func read(_ fd: Int32) throws -> [UInt8]? {
        guard let header = try readExactly(fd, 4, allowEOF: true) else { return nil }
        let length = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
        guard length >= 2, length <= maxLength else { throw IPCError("frame length \(length) out of range") }
        guard let payload = try readExactly(fd, length, allowEOF: false) else { throw IPCError("truncated frame") }
        return payload
    }

    private static func readExactly(_ fd: Int32, _ count: Int, allowEOF: Bool) throws -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < count {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + got, count - got, 0) }
            if n == 0 {
                if got == 0 && allowEOF { return nil }
                throw IPCError("connection closed mid-frame")
            }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { throw IPCError("no answer within the timeout") }
                throw IPCError("recv: \(String(cString: strerror(errno)))")
            }
            got += n
        }
        return buffer
    }
}
