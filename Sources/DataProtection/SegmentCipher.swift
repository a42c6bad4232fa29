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
///
/// The AES-GCM itself runs in the system's libcrypto with contexts keyed once per file key
/// (``GCMContexts``); everything else of the package's cryptography is swift-crypto's.
struct SegmentCipher: Sendable {
    static let overhead = 28   // nonce + tag

    let key: SymmetricKey
    let fileID: [UInt8]
    private let contexts: GCMContexts

    init(key: SymmetricKey, fileID: [UInt8]) {
        self.key = key
        self.fileID = fileID
        self.contexts = GCMContexts(key: key)
    }

    func associatedData(index: Int, final: Bool) -> [UInt8] {
        withAssociatedData(index: index, final: final) { Array($0) }
    }

    /// Runs `body` with the associated data of segment `index` in a buffer on the stack (no
    /// allocation per segment).
    func withAssociatedData<R>(index: Int, final: Bool, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(byteCount: 25, alignment: 8) { buffer in
            fileID.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: 16) }
            withUnsafeBytes(of: UInt64(index).bigEndian) {
                (buffer.baseAddress! + 16).copyMemory(from: $0.baseAddress!, byteCount: 8)
            }
            buffer[24] = final ? 1 : 0
            return try body(UnsafeRawBufferPointer(buffer))
        }
    }

    /// Appends the sealed segment to `output`.
    func seal(
        _ plaintext: UnsafeRawBufferPointer, index: Int, final: Bool, nonce: AES.GCM.Nonce = AES.GCM.Nonce(),
        into output: inout [UInt8]
    ) throws {
        let start = output.count
        output.append(contentsOf: repeatElement(0, count: plaintext.count + Self.overhead))
        try output.withUnsafeMutableBytes { buffer in
            try nonce.withUnsafeBytes { nonce in
                try withAssociatedData(index: index, final: final) { aad in
                    try contexts.seal(
                        plaintext, nonce: nonce, aad: aad,
                        into: UnsafeMutableRawBufferPointer(rebasing: buffer[start...]))
                }
            }
        }
    }

    /// Opens one sealed segment; `nil` when it does not authenticate as segment `index` with
    /// that `final` flag.
    func open(_ sealed: ArraySlice<UInt8>, index: Int, final: Bool) -> Data? {
        sealed.withUnsafeBytes { open($0, index: index, final: final) }
    }

    /// Opens one sealed segment from memory.
    func open(_ sealed: UnsafeRawBufferPointer, index: Int, final: Bool) -> Data? {
        guard sealed.count >= Self.overhead else { return nil }
        var plaintext = Data(count: sealed.count - Self.overhead)
        let opened = plaintext.withUnsafeMutableBytes { out in
            withAssociatedData(index: index, final: final) { contexts.open(sealed, aad: $0, into: out) }
        }
        return opened ? plaintext : nil
    }
}

/// Fresh random nonces for a run of segments, drawn in one call from swift-crypto's CSPRNG
/// (`AES.GCM.Nonce()` asks the kernel once per nonce, which costs more than sealing 4 KiB).
struct NonceBatch {
    private let bytes: [UInt8]
    init(count: Int) {
        bytes = SymmetricKey(size: SymmetricKeySize(bitCount: max(count, 1) * 96)).withUnsafeBytes { Array($0) }
    }
    func nonce(_ i: Int) throws -> AES.GCM.Nonce { try AES.GCM.Nonce(data: bytes[(i * 12)..<(i * 12 + 12)]) }
    /// Nonce `i`'s 12 bytes.
    func withNonce<R>(_ i: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try bytes.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[(i * 12)..<(i * 12 + 12)])) }
    }
}

extension SegmentCipher {
    /// Seals consecutive segments on every core, from segment `firstIndex` of `layout`.
    /// `plaintext` holds their plaintext back to back (every segment full but the last);
    /// `output` must hold exactly their sealed forms. The last one is sealed final when
    /// `lastIsFinal`. An empty `plaintext` gives one empty segment.
    func sealSegments(
        _ plaintext: UnsafeRawBufferPointer, layout: SegmentLayout, firstIndex: Int, lastIsFinal: Bool,
        into output: UnsafeMutableRawBufferPointer, threads: Int = processorCount
    ) throws {
        let plainBase = layout.plaintextStart(ofSegment: firstIndex)
        let sealedBase = layout.offset(ofSegment: firstIndex)
        let count =
            plaintext.count == 0
            ? 1 : layout.segment(containing: plainBase + Int64(plaintext.count) - 1) - firstIndex + 1
        let failure = Mutex<(any Error)?>(nil)
        let input = SendableRawBuffer(plaintext), out = SendableMutableRawBuffer(output)
        let nonces = NonceBatch(count: count)
        parallelForEach(count, bytes: plaintext.count, threads: threads) { i in
            let index = firstIndex + i
            let start = Int(layout.plaintextStart(ofSegment: index) - plainBase)
            let length = min(layout.capacity(ofSegment: index), input.buffer.count - start)
            let sealedStart = Int(layout.offset(ofSegment: index) - sealedBase)
            do {
                let chunk =
                    length == 0
                    ? UnsafeRawBufferPointer(start: nil, count: 0)
                    : UnsafeRawBufferPointer(rebasing: input.buffer[start..<(start + length)])
                let target = UnsafeMutableRawBufferPointer(
                    rebasing: out.buffer[sealedStart..<(sealedStart + length + Self.overhead)])
                try nonces.withNonce(i) { nonce in
                    try withAssociatedData(index: index, final: lastIsFinal && i == count - 1) { aad in
                        try contexts.seal(chunk, nonce: nonce, aad: aad, into: target)
                    }
                }
            } catch {
                failure.withLock { $0 = error }
            }
        }
        if let error = failure.withLock({ $0 }) { throw error }
    }

    /// Opens consecutive sealed segments of `layout`, from segment `firstIndex`, on every core
    /// into `output` (their plaintext, back to back); segment `finalIndex` is opened as final.
    /// Returns the file index of a segment that fails authentication, or `nil`.
    func openSegments(
        _ sealed: UnsafeRawBufferPointer, layout: SegmentLayout, firstIndex: Int, finalIndex: Int,
        into output: UnsafeMutableRawBufferPointer, threads: Int = processorCount
    ) -> Int? {
        let plainBase = layout.plaintextStart(ofSegment: firstIndex)
        let sealedBase = layout.offset(ofSegment: firstIndex)
        var count = 0
        while layout.offset(ofSegment: firstIndex + count) - sealedBase < Int64(sealed.count) { count += 1 }
        let failed = Mutex<Int?>(nil)
        let input = SendableRawBuffer(sealed), out = SendableMutableRawBuffer(output)
        parallelForEach(count, bytes: sealed.count, threads: threads) { i in
            let index = firstIndex + i
            let start = Int(layout.offset(ofSegment: index) - sealedBase)
            let end = min(start + layout.capacity(ofSegment: index) + Self.overhead, input.buffer.count)
            let plainStart = Int(layout.plaintextStart(ofSegment: index) - plainBase)
            let plainLength = end - start - Self.overhead
            // Straight into the output: no buffer per segment.
            let opened =
                plainLength >= 0 && plainStart + plainLength <= out.buffer.count
                && withAssociatedData(index: index, final: index == finalIndex) { aad in
                    contexts.open(
                        UnsafeRawBufferPointer(rebasing: input.buffer[start..<end]), aad: aad,
                        into: UnsafeMutableRawBufferPointer(
                            rebasing: out.buffer[plainStart..<(plainStart + plainLength)]))
                }
            if !opened { failed.withLock { $0 = min($0 ?? index, index) } }
        }
        return failed.withLock { $0 }
    }
}

/// The cores this process may use, read once: `ProcessInfo.activeProcessorCount` reads the
/// cgroup's files on every call (six system calls), too much for each file a server opens.
let processorCount = ProcessInfo.processInfo.activeProcessorCount

/// Below this many bytes of work, segments are sealed or opened on the calling thread: waking
/// another costs more than it saves (a random 4 KiB read spans two 4 KiB segments, and sent to
/// two threads took 5 µs instead of 2).
let parallelWorkThreshold = 128 * 1024

/// Runs `body` for 0..<count on up to `threads` threads (all cores by default) — on this one
/// when the work is under ``parallelWorkThreshold`` bytes.
func parallelForEach(_ count: Int, bytes: Int, threads: Int = processorCount, _ body: @Sendable (Int) -> Void) {
    let threads = bytes < parallelWorkThreshold ? 1 : min(threads, count)
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
/// `@unchecked Sendable`: each iteration of `parallelForEach` reads its own slice, and the buffer outlives the loop.
struct SendableRawBuffer: @unchecked Sendable {
    let buffer: UnsafeRawBufferPointer
    init(_ buffer: UnsafeRawBufferPointer) { self.buffer = buffer }
}

/// `@unchecked Sendable`: each iteration of `parallelForEach` writes its own disjoint slice, and the buffer
/// outlives the loop.
struct SendableMutableRawBuffer: @unchecked Sendable {
    let buffer: UnsafeMutableRawBufferPointer
    init(_ buffer: UnsafeMutableRawBufferPointer) { self.buffer = buffer }
}
