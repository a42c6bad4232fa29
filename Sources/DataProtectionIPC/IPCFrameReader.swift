import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Frames (``IPCFrame``) and passed descriptors read from one stream socket with as few
/// `recvmsg` calls as the peer's writes allow: what one call returns beyond the frame asked for
/// is kept for the next. For channels whose answers can carry a descriptor (`SCM_RIGHTS`): a
/// peer may send answers and the descriptor after them in one message, and the kernel hands the
/// descriptor over with the first bytes of that message that are read — a reader that read
/// those bytes with plain `recv` would lose it. Every read here passes a control buffer;
/// descriptors are kept in the order they came and claimed by ``descriptor()``.
///
/// ```swift
/// var reader = IPCFrameReader(fd: channel)
/// let answer = try reader.frame()          // ok
/// let passed = try reader.descriptor()     // the byte 00 and the descriptor it carried
/// ```
///
/// Descriptors received but never claimed are closed by ``close()``.
package struct IPCFrameReader: Sendable {
    package let fd: Int32
    /// `false` for a reader of requests: a descriptor a peer sends is closed at once, so a
    /// hostile peer cannot fill the reader's descriptor table.
    package let acceptsDescriptors: Bool
    private var buffer: [UInt8] = []
    private var start = 0
    private var descriptors: [Int32] = []

    package init(fd: Int32, acceptsDescriptors: Bool = true) {
        self.fd = fd
        self.acceptsDescriptors = acceptsDescriptors
    }

    /// Whether bytes the peer sent are already read and waiting here (a request pipelined
    /// behind the one being answered, for example).
    package var hasBufferedBytes: Bool { start < buffer.count }

    /// The next frame's payload; `nil` at a clean end of stream.
    package mutating func frame() throws -> [UInt8]? {
        guard try fill(4, allowEOF: true) else { return nil }
        let length =
            Int(buffer[start]) << 24 | Int(buffer[start + 1]) << 16 | Int(buffer[start + 2]) << 8
            | Int(buffer[start + 3])
        guard length >= 2, length <= IPCFrame.maxLength else { throw IPCError("frame length \(length) out of range") }
        guard try fill(4 + length, allowEOF: false) else { throw IPCError("truncated frame") }
        let payload = Array(buffer[(start + 4)..<(start + 4 + length)])
        consume(4 + length)
        return payload
    }

    /// Reads the one byte `00` that carries a passed descriptor and returns that descriptor
    /// (close-on-exec; the caller owns it).
    package mutating func descriptor() throws -> Int32 {
        guard try fill(1, allowEOF: false) else { throw IPCError("connection closed") }
        guard buffer[start] == 0 else { throw IPCError("expected a passed descriptor, got byte \(buffer[start])") }
        consume(1)
        guard !descriptors.isEmpty else { throw IPCError("no descriptor came with the message") }
        return descriptors.removeFirst()
    }

    /// Closes the descriptors received but not claimed.
    package mutating func close() {
        for descriptor in descriptors { _ = Glibc.close(descriptor) }
        descriptors.removeAll()
    }

    /// Reads until `count` bytes are buffered; `false` at an end of stream before any of them
    /// when `allowEOF`.
    private mutating func fill(_ count: Int, allowEOF: Bool) throws -> Bool {
        while buffer.count - start < count {
            if start > 0 {
                buffer.removeFirst(start)
                start = 0
            }
            let have = buffer.count
            let room = max(count - have, 4096)
            buffer += [UInt8](repeating: 0, count: room)
            let received = buffer.withUnsafeMutableBytes { whole -> Result<(count: Int, descriptor: Int32?), Errno> in
                let free = UnsafeMutableRawBufferPointer(rebasing: whole[have...])
                do throws(Errno) { return .success(try SystemCall.recvmsg(fd, free)) } catch { return .failure(error) }
            }
            switch received {
            case .failure(let failure):
                buffer.removeLast(room)
                if failure == .interrupted { continue }
                if failure == .resourceTemporarilyUnavailable || failure == .wouldBlock {
                    throw IPCError("no answer within the timeout")
                }
                throw IPCError("recvmsg: \(failure.description)")
            case .success(let (n, passed)):
                buffer.removeLast(room - n)
                if let passed {
                    if acceptsDescriptors { descriptors.append(passed) } else { _ = Glibc.close(passed) }
                }
                if n == 0 {
                    if have == 0 && allowEOF { return false }
                    throw IPCError("connection closed mid-frame")
                }
            }
        }
        return true
    }

    private mutating func consume(_ count: Int) {
        start += count
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
    }
}
