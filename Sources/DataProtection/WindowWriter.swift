import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

/// Writes windows of sealed segments while the next window is being sealed.
///
/// Sealing runs on every core (``SegmentCipher/sealSegments(_:segmentSize:firstIndex:lastIsFinal:into:)``);
/// the `pwrite` of the previous window runs meanwhile on a serial queue. Two buffers alternate,
/// so memory stays at two windows. ``finish()`` waits for every write and reports the first
/// failure; no write is left running after it returns.
/// `@unchecked Sendable`: one caller fills the buffers in turn; a buffer goes to the serial `queue` only after the
/// caller waited for its previous write (`inFlight`), and `failure` is a `Mutex`.
final class WindowWriter: @unchecked Sendable {
    /// Threads left for sealing while one core writes.
    static let sealingThreads = processorCount
    /// Windows up to this size are written on the caller's thread.
    static let writtenInline = 64 << 10

    private let fd: FileDescriptor
    private let path: String
    private let queue = DispatchQueue(label: "dataprotection.window-writer")
    private var buffers: [UnsafeMutableRawBufferPointer] = [.init(start: nil, count: 0), .init(start: nil, count: 0)]
    private let inFlight = [DispatchGroup(), DispatchGroup()]
    private let failure = Mutex<(any Error)?>(nil)
    private var turn = 0
    /// Writes each window on the caller's thread (a file system server, whose requests already
    /// overlap): no hand-over to the writing queue.
    var synchronous = false

    init(fd: FileDescriptor, path: String) {
        self.fd = fd
        self.path = path
    }

    deinit {
        for group in inFlight { group.wait() }
        for buffer in buffers { buffer.deallocate() }
    }

    /// Lets `fill` write `length` bytes into a free buffer, then queues their write at `offset`.
    func submit(length: Int, at offset: Int64, _ fill: (UnsafeMutableRawBufferPointer) throws -> Void) throws {
        let slot = turn
        turn ^= 1
        inFlight[slot].wait()
        try rethrowFailure()
        if buffers[slot].count < length {
            buffers[slot].deallocate()
            buffers[slot] = .allocate(byteCount: length, alignment: 64)
        }
        let buffer = UnsafeMutableRawBufferPointer(rebasing: buffers[slot][0..<length])
        try fill(buffer)
        // A small window (a small file, a file's last bytes) is written here: handing it to the
        // queue and waiting for it costs more than the write.
        if synchronous || length <= Self.writtenInline {
            // After the other window's write, and not after a failed one (no hole in the middle).
            if !synchronous {
                inFlight[slot ^ 1].wait()
                try rethrowFailure()
            }
            try POSIXFile.write(fd, UnsafeRawBufferPointer(buffer), at: offset, path: path)
            return
        }
        let bytes = SendableRawBuffer(UnsafeRawBufferPointer(buffer))
        inFlight[slot].enter()
        queue.async { [self, group = inFlight[slot]] in
            // After a failed window, none that follows is written (no hole in the middle).
            if failure.withLock({ $0 != nil }) { group.leave(); return }
            do {
                try POSIXFile.write(fd, bytes.buffer, at: offset, path: path)
            } catch {
                failure.withLock { $0 = $0 ?? error }
            }
            group.leave()
        }
    }

    /// Waits for every queued write; throws the first failure.
    func finish() throws {
        for group in inFlight { group.wait() }
        try rethrowFailure()
    }

    /// Throws (and forgets) the first failure, so the next write starts clean — after a full
    /// disk is freed, say.
    private func rethrowFailure() throws {
        if let error = failure.withLock({ state -> (any Error)? in
            defer { state = nil }; return state
        }) {
            throw error
        }
    }
}
