/// Where each segment of a protected file lies, in its plaintext and on disk (FORMAT.md §3).
///
/// - Format 1: segments of `2^log2` plaintext bytes, sealed back to back after the 160-byte header.
/// - Format 2 (files written in place): every sealed segment fits in one page of `2^log2` bytes
///   and none crosses a page boundary — segment 0 fills the rest of page 0 after the header,
///   segment *i* ≥ 1 is page *i* — so a write the kernel cuts short (at a page boundary, when the
///   writer is killed) leaves each segment whole, old or new.
///
/// Segment 0 may hold fewer plaintext bytes than the others (`firstCapacity`); every other
/// segment holds `capacity`. Every segment but the last is full.
struct SegmentLayout: Sendable, Equatable {
    static let headerSize = ProtectedFileHeader.size
    static let overhead = SegmentCipher.overhead   // nonce + tag

    /// Plaintext bytes of segment 0.
    let firstCapacity: Int
    /// Plaintext bytes of every other segment.
    let capacity: Int

    init(version: UInt16, log2: UInt8) {
        let unit = 1 << Int(log2)
        if version >= 2 {
            firstCapacity = unit - Self.headerSize - Self.overhead
            capacity = unit - Self.overhead
        } else {
            firstCapacity = unit
            capacity = unit
        }
    }

    /// Where segment `index`'s plaintext starts.
    func plaintextStart(ofSegment index: Int) -> Int64 {
        index == 0 ? 0 : Int64(firstCapacity) + Int64(index - 1) * Int64(capacity)
    }

    /// The plaintext bytes segment `index` holds when full.
    func capacity(ofSegment index: Int) -> Int { index == 0 ? firstCapacity : capacity }

    /// The segment holding plaintext byte `offset`.
    func segment(containing offset: Int64) -> Int {
        offset < Int64(firstCapacity) ? 0 : 1 + Int((offset - Int64(firstCapacity)) / Int64(capacity))
    }

    /// Where segment `index` starts in the file.
    func offset(ofSegment index: Int) -> Int64 {
        Int64(Self.headerSize) + plaintextStart(ofSegment: index) + Int64(index) * Int64(Self.overhead)
    }

    /// The last segment of a file of `size` plaintext bytes (an empty file has one, empty).
    func lastIndex(size: Int64) -> Int { size == 0 ? 0 : segment(containing: size - 1) }

    /// The plaintext bytes segment `index` holds in a file of `size` bytes.
    func plaintextLength(ofSegment index: Int, size: Int64) -> Int {
        Int(min(Int64(capacity(ofSegment: index)), size - plaintextStart(ofSegment: index)))
    }

    /// The length on disk of a file of `size` plaintext bytes.
    func fileSize(plaintextSize size: Int64) -> Int64 {
        let last = lastIndex(size: size)
        return offset(ofSegment: last) + Int64(plaintextLength(ofSegment: last, size: size) + Self.overhead)
    }

    /// The plaintext length of a file of `fileSize` bytes on disk, and its number of segments;
    /// `nil` when no whole number of segments fits (a segment cut inside its nonce or tag).
    func plaintextSize(fileSize: Int64) -> (size: Int64, segments: Int)? {
        let body = fileSize - Int64(Self.headerSize)
        let firstSealed = Int64(firstCapacity + Self.overhead)
        guard body >= Int64(Self.overhead) else { return nil }
        if body <= firstSealed { return (body - Int64(Self.overhead), 1) }
        let sealed = Int64(capacity + Self.overhead)
        let count = 1 + Int((body - firstSealed + sealed - 1) / sealed)
        let lastSealed = body - firstSealed - Int64(count - 2) * sealed
        guard lastSealed >= Int64(Self.overhead) else { return nil }
        return (body - Int64(count) * Int64(Self.overhead), count)
    }
}
