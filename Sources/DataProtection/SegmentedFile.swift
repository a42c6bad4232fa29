import DataProtectionKeybag
import Foundation
import SystemPackage

/// The random-access engine under ``ProtectedFileHandle``: reads and writes plaintext ranges
/// of one protected file by decrypting and re-sealing only the segments they touch.
///
/// Memory stays bounded: at most one batch (``batchBytes``) of sealed segments is held at a
/// time, and one decrypted segment is cached for sequential reads.
final class SegmentedFile {
    static let batchBytes = 4 << 20

    let fd: FileDescriptor
    let path: String
    private(set) var header: ProtectedFileHeader
    private let cipher: SegmentCipher
    private let segmentSize: Int
    private var sealedSize: Int { segmentSize + SegmentCipher.overhead }
    /// Plaintext length.
    private(set) var size: Int64
    private var cache: (index: Int, plaintext: Data)?

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
        let raw = try POSIXFile.read(fd, count: length + SegmentCipher.overhead, at: offset(ofSegment: index), path: path)
        guard raw.count == length + SegmentCipher.overhead else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(index)")
        }
        guard let plaintext = cipher.open(raw[...], index: index, final: index == lastIndex) else {
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
        var result = Data()
        result.reserveCapacity(Int(end - offset))
        var position = offset
        while position < end {
            let index = Int(position / Int64(segmentSize))
            let plaintext = try segment(index)
            let start = Int(position - Int64(index) * Int64(segmentSize))
            let stop = min(plaintext.count, start + Int(end - position))
            let base = plaintext.startIndex
            result.append(plaintext[(base + start)..<(base + stop)])
            position += Int64(stop - start)
        }
        return result
    }

    /// Writes `bytes` at `offset`, extending the file (with zeros over any gap) as needed.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        guard offset >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative offset") }
        if offset > size { try fillZeros(upTo: offset) }
        guard bytes.count > 0 else { return }
        let oldLast = lastIndex
        let newSize = max(size, offset + Int64(bytes.count))
        let newLast = Self.lastIndex(size: newSize, segmentSize: segmentSize)
        let first = Int(offset / Int64(segmentSize))
        let lastTouched = Int((offset + Int64(bytes.count) - 1) / Int64(segmentSize))

        var batch = [UInt8]()
        batch.reserveCapacity(min(Self.batchBytes, (lastTouched - first + 1) * sealedSize) + sealedSize)
        var batchStart = first
        var plaintext = [UInt8](repeating: 0, count: segmentSize)
        for index in first...lastTouched {
            let segmentStart = Int64(index) * Int64(segmentSize)
            let length = plaintextLength(ofSegment: index, size: newSize)
            let writeStart = max(offset, segmentStart)
            let writeEnd = min(offset + Int64(bytes.count), segmentStart + Int64(length))
            let coversAll = writeStart == segmentStart && writeEnd == segmentStart + Int64(length)
            if !coversAll, index <= oldLast {
                let existing = try segment(index)
                plaintext.withUnsafeMutableBytes { dest in _ = existing.copyBytes(to: dest) }
                if existing.count < length { plaintext.replaceSubrange(existing.count..<length, with: repeatElement(0, count: length - existing.count)) }
            }
            let source = UnsafeRawBufferPointer(rebasing: bytes[Int(writeStart - offset)..<Int(writeEnd - offset)])
            plaintext.withUnsafeMutableBytes { dest in
                dest.baseAddress!.advanced(by: Int(writeStart - segmentStart)).copyMemory(from: source.baseAddress!, byteCount: source.count)
            }
            try plaintext.withUnsafeBytes { try cipher.seal(UnsafeRawBufferPointer(rebasing: $0[0..<length]), index: index, final: index == newLast, into: &batch) }
            if cache?.index == index { cache = nil }
            if batch.count >= Self.batchBytes {
                try POSIXFile.write(fd, batch, at: self.offset(ofSegment: batchStart), path: path)
                batch.removeAll(keepingCapacity: true)
                batchStart = index + 1
            }
        }
        if !batch.isEmpty { try POSIXFile.write(fd, batch, at: self.offset(ofSegment: batchStart), path: path) }
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
        var batch = [UInt8]()
        batch.reserveCapacity((window / segmentSize + 1) * sealedSize)
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
            var consumed = 0
            while true {
                let remaining = filled - consumed
                let isFinal: Bool
                if remaining > segmentSize {
                    isFinal = false
                } else if atEnd, remaining > 0 || index == 0 {
                    isFinal = true
                } else {
                    break
                }
                let length = min(segmentSize, remaining)
                try pending.withUnsafeBytes {
                    try cipher.seal(UnsafeRawBufferPointer(rebasing: $0[consumed..<(consumed + length)]), index: index, final: isFinal, into: &batch)
                }
                consumed += length
                index += 1
                if isFinal { break }
            }
            if !batch.isEmpty {
                try POSIXFile.write(fd, batch, at: offset(ofSegment: batchStart), path: path)
                batch.removeAll(keepingCapacity: true)
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

    /// Rewrites the header (after a class change: same file key, new wrapping).
    func replaceHeader(_ newHeader: ProtectedFileHeader, keys: FileKeys) throws {
        try POSIXFile.write(fd, newHeader.encoded(keys: keys), at: 0, path: path)
        header = newHeader
    }
}
