import DataProtectionKeybag
import Foundation
import SystemPackage

/// The random-access engine under ``ProtectedFileHandle``: reads and writes plaintext ranges
/// of one protected file by decrypting and re-sealing only the segments they touch.
///
/// Memory stays bounded: writes go in windows of ``batchBytes`` (two sealed windows in flight,
/// see ``WindowWriter``), and one decrypted segment is cached for sequential reads.
final class SegmentedFile {
    static let batchBytes = 1 << 20

    let fd: FileDescriptor
    let path: String
    private(set) var header: ProtectedFileHeader
    private let cipher: SegmentCipher
    private let segmentSize: Int
    private var sealedSize: Int { segmentSize + SegmentCipher.overhead }
    /// Plaintext length.
    private(set) var size: Int64
    private var cache: (index: Int, plaintext: Data)?
    /// Sealed bytes read from the file, reused by every read (grown to the largest one).
    private var scratch = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    /// Threads that seal and open a run of segments: every core, unless the caller already
    /// runs many requests at once (a file system server sets 1).
    var threads = ProcessInfo.processInfo.activeProcessorCount
    /// Reused by every write, so its buffers are allocated once per open file.
    private lazy var writer: WindowWriter = {
        let writer = WindowWriter(fd: fd, path: path)
        writer.synchronous = threads == 1
        return writer
    }()

    private init(fd: FileDescriptor, path: String, header: ProtectedFileHeader, keys: FileKeys, size: Int64) {
        self.fd = fd
        self.path = path
        self.header = header
        self.cipher = SegmentCipher(key: keys.contentKey, fileID: header.fileID)
        self.segmentSize = header.segmentSize
        self.size = size
    }

    /// Writes a header and one empty final segment to a new, empty file.
    static func create(fd: FileDescriptor, path: String, header: ProtectedFileHeader, keys: FileKeys) throws -> SegmentedFile {
        var bytes = header.encoded(keys: keys)
        let cipher = SegmentCipher(key: keys.contentKey, fileID: header.fileID)
        try [UInt8]().withUnsafeBytes { try cipher.seal($0, index: 0, final: true, into: &bytes) }
        try POSIXFile.write(fd, bytes, at: 0, path: path)
        return SegmentedFile(fd: fd, path: path, header: header, keys: keys, size: 0)
    }

    /// Opens an existing file: checks the header MAC and authenticates the last segment as
    /// final, which fixes the plaintext length (truncation and extension show up here).
    static func open(fd: FileDescriptor, path: String, headerBytes: [UInt8], header: ProtectedFileHeader, keys: FileKeys) throws -> SegmentedFile {
        guard ProtectedFileHeader.verify(headerBytes, keys: keys) else {
            throw ProtectedFileError.damaged(path: path, reason: "header authentication failed")
        }
        let file = SegmentedFile(fd: fd, path: path, header: header, keys: keys, size: 0)
        let fileSize = try POSIXFile.size(fd, path: path)
        let body = fileSize - Int64(ProtectedFileHeader.size)
        guard body >= Int64(SegmentCipher.overhead) else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated: no complete segment after the header")
        }
        let sealed = Int64(file.sealedSize)
        let count = Int((body + sealed - 1) / sealed)
        let lastSealed = Int(body - Int64(count - 1) * sealed)
        guard lastSealed >= SegmentCipher.overhead else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(count - 1)")
        }
        let last = count - 1
        let raw = try POSIXFile.read(fd, count: lastSealed, at: file.offset(ofSegment: last), path: path)
        guard let plaintext = file.cipher.open(raw[...], index: last, final: true) else {
            if file.cipher.open(raw[...], index: last, final: false) != nil {
                throw ProtectedFileError.damaged(path: path, reason: "truncated: segment \(last) is not the final segment")
            }
            throw ProtectedFileError.damaged(path: path, reason: "segment \(last) failed authentication (modified, extended or reordered)")
        }
        file.size = Int64(last) * Int64(file.segmentSize) + Int64(plaintext.count)
        file.cache = (last, plaintext)
        return file
    }

    deinit { scratch.deallocate() }

    /// Reads `count` sealed bytes at `offset` into the scratch buffer (fewer at the end of file).
    private func readSealed(count: Int, at offset: Int64) throws -> UnsafeRawBufferPointer {
        if scratch.count < count {
            scratch.deallocate()
            scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 64)
        }
        let done = try POSIXFile.read(fd, into: UnsafeMutableRawBufferPointer(rebasing: scratch[0..<count]), at: offset, path: path)
        return UnsafeRawBufferPointer(rebasing: scratch[0..<done])
    }

    private func offset(ofSegment index: Int) -> Int64 {
        Int64(ProtectedFileHeader.size) + Int64(index) * Int64(sealedSize)
    }

    private var lastIndex: Int { Self.lastIndex(size: size, segmentSize: segmentSize) }
    private static func lastIndex(size: Int64, segmentSize: Int) -> Int { size == 0 ? 0 : Int((size - 1) / Int64(segmentSize)) }

    private func plaintextLength(ofSegment index: Int, size: Int64) -> Int {
        Int(min(Int64(segmentSize), size - Int64(index) * Int64(segmentSize)))
    }

    /// Decrypts one existing segment (through the one-segment cache).
    private func segment(_ index: Int) throws -> Data {
        if let cache, cache.index == index { return cache.plaintext }
        let length = plaintextLength(ofSegment: index, size: size)
        let raw = try readSealed(count: length + SegmentCipher.overhead, at: offset(ofSegment: index))
        guard raw.count == length + SegmentCipher.overhead else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(index)")
        }
        guard let plaintext = cipher.open(raw, index: index, final: index == lastIndex) else {
            throw ProtectedFileError.damaged(path: path, reason: "segment \(index) failed authentication (modified, swapped or reordered)")
        }
        cache = (index, plaintext)
        return plaintext
    }

    /// Reads up to `count` bytes at `offset` (fewer at the end of the file).
    func read(at offset: Int64, count: Int) throws -> Data {
        guard offset >= 0, count >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative offset or count") }
        let end = min(size, offset + Int64(count))
        guard offset < end else { return Data() }
        let first = Int(offset / Int64(segmentSize))
        let last = Int((end - 1) / Int64(segmentSize))
        if last > first { return try readSegments(first...last, from: offset, to: end) }
        let plaintext = try segment(first)
        let start = plaintext.startIndex + Int(offset - Int64(first) * Int64(segmentSize))
        let length = Int(end - offset)
        return start == plaintext.startIndex && length == plaintext.count ? plaintext : Data(plaintext[start..<(start + length)])
    }

    /// Reads several segments with one `pread` and opens them on every core.
    private func readSegments(_ indices: ClosedRange<Int>, from offset: Int64, to end: Int64) throws -> Data {
        let firstStart = Int64(indices.lowerBound) * Int64(segmentSize)
        let plainLength = Int(min(size, Int64(indices.upperBound + 1) * Int64(segmentSize)) - firstStart)
        let sealedLength = plainLength + indices.count * SegmentCipher.overhead
        let raw = try readSealed(count: sealedLength, at: self.offset(ofSegment: indices.lowerBound))
        guard raw.count == sealedLength else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(indices.upperBound)")
        }
        var plain = Data(count: plainLength)
        let failed = plain.withUnsafeMutableBytes { output in
            cipher.openSegments(raw, segmentSize: segmentSize, firstIndex: indices.lowerBound, finalIndex: lastIndex, into: output, threads: threads)
        }
        if let failed {
            throw ProtectedFileError.damaged(path: path, reason: "segment \(failed) failed authentication (modified, swapped or reordered)")
        }
        let start = Int(offset - firstStart)
        let length = Int(end - offset)
        return start == 0 && length == plain.count ? plain : Data(plain[start..<(start + length)])
    }

    /// Writes `bytes` at `offset`, extending the file (with zeros over any gap) as needed.
    ///
    /// Touched segments are handled in windows of ``batchBytes``: the partly overwritten ones
    /// are decrypted, the new bytes laid over them, and the window is sealed on every core and
    /// written with one `pwrite`.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        guard offset >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative offset") }
        if offset > size { try fillZeros(upTo: offset) }
        guard bytes.count > 0 else { return }
        let oldLast = lastIndex
        let newSize = max(size, offset + Int64(bytes.count))
        let newLast = Self.lastIndex(size: newSize, segmentSize: segmentSize)
        let end = offset + Int64(bytes.count)
        let first = Int(offset / Int64(segmentSize))
        let lastTouched = Int((end - 1) / Int64(segmentSize))
        let perWindow = max(Self.batchBytes / segmentSize, 1)
        var plain = [UInt8]()
        defer { try? writer.finish() }

        var windowStart = first
        while windowStart <= lastTouched {
            let windowEnd = min(lastTouched, windowStart + perWindow - 1)
            let plainStart = Int64(windowStart) * Int64(segmentSize)
            let plainEnd = min(Int64(windowEnd + 1) * Int64(segmentSize), newSize)
            let plainLength = Int(plainEnd - plainStart)
            let segments = windowEnd - windowStart + 1
            let sealedLength = plainLength + segments * SegmentCipher.overhead
            func sealAndWrite(_ source: UnsafeRawBufferPointer) throws {
                try writer.submit(length: sealedLength, at: self.offset(ofSegment: windowStart)) { output in
                    try cipher.sealSegments(source, segmentSize: segmentSize, firstIndex: windowStart, lastIsFinal: windowEnd == newLast,
                                            into: output, threads: min(threads, WindowWriter.sealingThreads))
                }
            }
            if offset <= plainStart, end >= plainEnd {
                // The new bytes cover the whole window: seal them where they are.
                try sealAndWrite(UnsafeRawBufferPointer(rebasing: bytes[Int(plainStart - offset)..<Int(plainEnd - offset)]))
            } else {
                if plain.count < plainLength { plain = [UInt8](repeating: 0, count: plainLength) }
                // Existing bytes of the segments the new data covers only partly (the window's ends).
                for index in Set([windowStart, windowEnd]) where index <= oldLast {
                    let segmentStart = Int64(index) * Int64(segmentSize)
                    let segmentEnd = min(segmentStart + Int64(segmentSize), newSize)
                    guard offset > segmentStart || end < segmentEnd else { continue }
                    let existing = try segment(index)
                    let at = Int(segmentStart - plainStart)
                    plain.withUnsafeMutableBytes { dest in
                        _ = existing.copyBytes(to: UnsafeMutableRawBufferPointer(rebasing: dest[at..<(at + existing.count)]))
                        // Bytes past the segment's old end (up to the new data) are zeros.
                        let newEnd = at + Int(segmentEnd - segmentStart)
                        if at + existing.count < newEnd {
                            UnsafeMutableRawBufferPointer(rebasing: dest[(at + existing.count)..<newEnd]).initializeMemory(as: UInt8.self, repeating: 0)
                        }
                    }
                }
                // The new bytes over them.
                let copyStart = max(offset, plainStart), copyEnd = min(end, plainEnd)
                plain.withUnsafeMutableBytes { dest in
                    UnsafeMutableRawBufferPointer(rebasing: dest[Int(copyStart - plainStart)..<Int(copyEnd - plainStart)])
                        .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[Int(copyStart - offset)..<Int(copyEnd - offset)]))
                }
                try plain.withUnsafeBytes { try sealAndWrite(UnsafeRawBufferPointer(rebasing: $0[0..<plainLength])) }
            }
            if let cached = cache?.index, (windowStart...windowEnd).contains(cached) { cache = nil }
            windowStart = windowEnd + 1
        }
        try writer.finish()
        // The old final segment is no longer the last one: reseal it as non-final.
        if oldLast < first, newLast != oldLast {
            let old = [UInt8](try segment(oldLast))
            var resealed = [UInt8]()
            try old.withUnsafeBytes { try cipher.seal($0, index: oldLast, final: false, into: &resealed) }
            try POSIXFile.write(fd, resealed, at: self.offset(ofSegment: oldLast), path: path)
            cache = nil
        }
        size = newSize
    }

    /// Fills a new, empty file from `source` in one pass: every segment is sealed once, with
    /// only the last one final. (``write(_:at:)`` would reseal the previous final segment on
    /// every append.) `source` fills the buffer it is given and returns the byte count, 0 at the end.
    func writeStream(from source: (UnsafeMutableRawBufferPointer) throws -> Int) throws {
        precondition(size == 0, "streaming into a non-empty file")
        let window = max(Self.batchBytes / segmentSize, 1) * segmentSize
        // Start small (small files are common) and grow while the source keeps filling it.
        var pending = [UInt8](repeating: 0, count: 2 * segmentSize)
        var filled = 0
        var index = 0
        var total: Int64 = 0
        var atEnd = false
        defer { try? writer.finish() }
        repeat {
            while !atEnd, filled < pending.count {
                let n = try pending.withUnsafeMutableBytes { try source(UnsafeMutableRawBufferPointer(rebasing: $0[filled...])) }
                if n == 0 { atEnd = true } else { filled += n }
                if filled == pending.count, pending.count < window + segmentSize {
                    pending += [UInt8](repeating: 0, count: min(pending.count, window + segmentSize - pending.count))
                }
            }
            // Seal the segments that are certainly not the last; at the end, the rest, the last one final.
            let batchStart = index
            var consumed = filled
            var sealFinal = atEnd
            if !atEnd {
                // Keep at least one byte back: the segment holding it may turn out to be the last.
                consumed = ((filled - 1) / segmentSize) * segmentSize
                sealFinal = false
            }
            let segments = sealFinal && consumed == 0 ? 1 : (consumed + segmentSize - 1) / segmentSize
            if segments > 0 {
                let sealedBytes = consumed + segments * SegmentCipher.overhead
                try pending.withUnsafeBytes { input in
                    try writer.submit(length: sealedBytes, at: offset(ofSegment: batchStart)) { output in
                        try cipher.sealSegments(UnsafeRawBufferPointer(rebasing: input[0..<consumed]), segmentSize: segmentSize,
                                                firstIndex: index, lastIsFinal: sealFinal, into: output, threads: min(threads, WindowWriter.sealingThreads))
                    }
                }
                index += segments
            }
            let leftover = filled - consumed
            if leftover > 0, consumed > 0 {
                pending.withUnsafeMutableBytes { raw in
                    raw.baseAddress!.copyMemory(from: UnsafeRawPointer(raw.baseAddress!.advanced(by: consumed)), byteCount: leftover)
                }
            }
            filled = leftover
            total += Int64(consumed)
        } while !(atEnd && filled == 0)
        try writer.finish()
        size = total
        cache = nil
        let end = offset(ofSegment: index - 1) + Int64(plaintextLength(ofSegment: index - 1, size: size) + SegmentCipher.overhead)
        try POSIXFile.system("ftruncate", path) { try fd.resize(to: end) }
    }

    private func fillZeros(upTo target: Int64) throws {
        let chunk = [UInt8](repeating: 0, count: 1 << 20)
        while size < target {
            let n = Int(min(Int64(chunk.count), target - size))
            try chunk.withUnsafeBytes { try write(UnsafeRawBufferPointer(rebasing: $0[0..<n]), at: size) }
        }
    }

    /// Cuts the file to `newSize` bytes, or extends it with zeros.
    func truncate(to newSize: Int64) throws {
        guard newSize >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative size") }
        if newSize >= size { return try fillZeros(upTo: newSize) }
        let newLast = Self.lastIndex(size: newSize, segmentSize: segmentSize)
        let keep = plaintextLength(ofSegment: newLast, size: newSize)
        let plaintext = [UInt8](try segment(newLast))
        var sealed = [UInt8]()
        try plaintext.withUnsafeBytes { try cipher.seal(UnsafeRawBufferPointer(rebasing: $0[0..<keep]), index: newLast, final: true, into: &sealed) }
        try POSIXFile.write(fd, sealed, at: offset(ofSegment: newLast), path: path)
        try POSIXFile.system("ftruncate", path) { try fd.resize(to: offset(ofSegment: newLast) + Int64(sealed.count)) }
        cache = nil
        size = newSize
    }
}
