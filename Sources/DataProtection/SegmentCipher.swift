import Crypto
import Foundation
import Synchronization

/// Seals and opens the AES-256-GCM segments of one protected file.
///
/// On disk a segment is `nonce (12) ‖ ciphertext ‖ tag (16)`; the nonce is random and fresh
/// for every write of the segment, so rewriting a segment never reuses one. The associated
/// data binds the segment to its file and its position: `file ID (16) ‖ index (u64 BE) ‖
/// final (u8)`, where `final` is 1 only for the file's last segment. So flipping, swapping
/// between files, reordering, truncating and extending are all detected.
struct SegmentCipher: Sendable {
    static let overhead = 28   // nonce + tag

    let key: SymmetricKey
    let fileID: [UInt8]

    func associatedData(index: Int, final: Bool) -> [UInt8] {
        var w = ByteWriter()
        w.raw(fileID)
        w.u64(UInt64(index))
        w.u8(final ? 1 : 0)
        return w.bytes
    }

    /// Appends the sealed segment to `output`.
    func seal(_ plaintext: UnsafeRawBufferPointer, index: Int, final: Bool, nonce: AES.GCM.Nonce = AES.GCM.Nonce(),
              into output: inout [UInt8]) throws {
        let box = try AES.GCM.seal(plaintext, using: key, nonce: nonce, authenticating: associatedData(index: index, final: final))
        // A 12-byte nonce always gives a combined representation.
        output.append(contentsOf: box.combined!)
    }

    /// Opens one sealed segment; `nil` when it does not authenticate as segment `index` with
    /// that `final` flag.
    func open(_ sealed: ArraySlice<UInt8>, index: Int, final: Bool) -> Data? {
        guard sealed.count >= Self.overhead,
              let box = try? AES.GCM.SealedBox(combined: sealed),
              let plain = try? AES.GCM.open(box, using: key, authenticating: associatedData(index: index, final: final))
        else { return nil }
        return plain
    }
}

extension SegmentCipher {
    /// Seals consecutive segments on every core. `plaintext` holds segments of `segmentSize`
    /// bytes (the last may be shorter); `output` must hold exactly their sealed forms. The
    /// last one is sealed final when `lastIsFinal`. An empty `plaintext` gives one empty segment.
    func sealSegments(_ plaintext: UnsafeRawBufferPointer, segmentSize: Int, firstIndex: Int, lastIsFinal: Bool,
                      into output: UnsafeMutableRawBufferPointer, threads: Int = ProcessInfo.processInfo.activeProcessorCount) throws {
        let count = max(1, (plaintext.count + segmentSize - 1) / segmentSize)
        let failure = Mutex<(any Error)?>(nil)
        let sealedSize = segmentSize + Self.overhead
        let input = SendableRawBuffer(plaintext), out = SendableMutableRawBuffer(output)
        parallelForEach(count, threads: threads) { i in
            let start = i * segmentSize
            let length = min(segmentSize, input.buffer.count - start)
            do {
                let chunk = length == 0 ? UnsafeRawBufferPointer(start: nil, count: 0) : UnsafeRawBufferPointer(rebasing: input.buffer[start..<(start + length)])
                let box = try AES.GCM.seal(chunk, using: key,
                                           nonce: AES.GCM.Nonce(),
                                           authenticating: associatedData(index: firstIndex + i, final: lastIsFinal && i == count - 1))
                let slot = UnsafeMutableRawBufferPointer(rebasing: out.buffer[(i * sealedSize)..<(i * sealedSize + length + Self.overhead)])
                _ = box.combined!.copyBytes(to: slot)
            } catch {
                failure.withLock { $0 = error }
            }
        }
        if let error = failure.withLock({ $0 }) { throw error }
    }

    /// Opens consecutive sealed segments on every core into `output` (their plaintext, back to
    /// back). Returns the file index of a segment that fails authentication, or `nil`.
    func openSegments(_ sealed: UnsafeRawBufferPointer, segmentSize: Int, firstIndex: Int, finalIndex: Int,
                      into output: UnsafeMutableRawBufferPointer) -> Int? {
        let sealedSize = segmentSize + Self.overhead
        let count = (sealed.count + sealedSize - 1) / sealedSize
        let failed = Mutex<Int?>(nil)
        let input = SendableRawBuffer(sealed), out = SendableMutableRawBuffer(output)
        parallelForEach(count) { i in
            let start = i * sealedSize
            let end = min(start + sealedSize, input.buffer.count)
            let index = firstIndex + i
            guard end - start >= Self.overhead,
                  let box = try? AES.GCM.SealedBox(combined: UnsafeRawBufferPointer(rebasing: input.buffer[start..<end])),
                  let plain = try? AES.GCM.open(box, using: key, authenticating: associatedData(index: index, final: index == finalIndex))
            else {
                failed.withLock { $0 = min($0 ?? index, index) }
                return
            }
            _ = plain.copyBytes(to: UnsafeMutableRawBufferPointer(rebasing: out.buffer[(i * segmentSize)...]))
        }
        return failed.withLock { $0 }
    }
}

/// Runs `body` for 0..<count on up to `threads` threads (all cores by default).
func parallelForEach(_ count: Int, threads: Int = ProcessInfo.processInfo.activeProcessorCount, _ body: @Sendable (Int) -> Void) {
    let threads = min(threads, count)
    if threads <= 1 {
        for i in 0..<count { body(i) }
    } else {
        // One chunk of consecutive items per thread.
        DispatchQueue.concurrentPerform(iterations: threads) { t in
            for i in stride(from: t, to: count, by: threads) { body(i) }
        }
    }
}

/// Buffers handed to `parallelForEach`: each iteration touches its own disjoint slice.
struct SendableRawBuffer: @unchecked Sendable {
    let buffer: UnsafeRawBufferPointer
    init(_ buffer: UnsafeRawBufferPointer) { self.buffer = buffer }
}

struct SendableMutableRawBuffer: @unchecked Sendable {
    let buffer: UnsafeMutableRawBufferPointer
    init(_ buffer: UnsafeMutableRawBufferPointer) { self.buffer = buffer }
}
