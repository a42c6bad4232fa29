import DataProtectionKeybag
import DataProtectionSystem
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
    var header: ProtectedFileHeader
    let keys: FileKeys
    let cipher: SegmentCipher
    let layout: SegmentLayout
    /// Plaintext length.
    var size: Int64
    /// Whether the last segment is sealed final. Only a format-2 file left being written (its
    /// writer killed during a write that extended it) ends otherwise, until it is settled.
    var lastSealedFinal = true
    /// Whether the file on disk runs past its last segment (a truncation cut short): the excess
    /// is cut off before the next change.
    var diskRunsPastEnd = false
    /// A change failed part-way and left the file unreadable: it is never settled.
    var damagedByFailure = false
    var cache: (index: Int, plaintext: Data)?
    /// Sealed bytes read from the file, reused by every read (grown to the largest one).
    private var scratch = UnsafeMutableRawBufferPointer(start: nil, count: 0)
    /// Threads that seal and open a run of segments: every core, unless the caller already
    /// runs many requests at once (a file system server sets 1).
    var threads = processorCount
    /// Reused by every write, so its buffers are allocated once per open file.
    lazy var writer: WindowWriter = {
        let writer = WindowWriter(fd: fd, path: path)
        writer.synchronous = threads == 1
        return writer
    }()

    private init(fd: FileDescriptor, path: String, header: ProtectedFileHeader, keys: FileKeys, size: Int64) {
        self.fd = fd
        self.path = path
        self.header = header
        self.keys = keys
        self.cipher = SegmentCipher(key: keys.contentKey, fileID: header.fileID)
        self.layout = header.layout
        self.size = size
    }

    /// Writes a header and one empty final segment to a new, empty file (one page: in format 2
    /// it is marked as being written only when a change first reaches past that page).
    static func create(
        fd: FileDescriptor, path: String, header: ProtectedFileHeader, keys: FileKeys
    ) throws -> SegmentedFile {
        var header = header
        header.beingWritten = false
        var bytes = header.encoded(keys: keys)
        let cipher = SegmentCipher(key: keys.contentKey, fileID: header.fileID)
        try [UInt8]().withUnsafeBytes { try cipher.seal($0, index: 0, final: true, into: &bytes) }
        try POSIXFile.write(fd, bytes, at: 0, path: path)
        return SegmentedFile(fd: fd, path: path, header: header, keys: keys, size: 0)
    }

    /// Opens an existing file: checks the header MAC and authenticates the last segment as
    /// final, which fixes the plaintext length (truncation and extension show up here).
    ///
    /// A format-2 file marked as being written may also end in a full segment sealed non-final
    /// (a write that extended it, cut short when its writer was killed), or — while a truncation
    /// was under way — hold its new final segment with the old bytes still after it.
    static func open(
        fd: FileDescriptor, path: String, headerBytes: [UInt8], header: ProtectedFileHeader, keys: FileKeys
    ) throws -> SegmentedFile {
        guard ProtectedFileHeader.verify(headerBytes, keys: keys) else {
            throw ProtectedFileError.damaged(path: path, reason: "header authentication failed")
        }
        let file = SegmentedFile(fd: fd, path: path, header: header, keys: keys, size: 0)
        try file.loadEnd()
        return file
    }

    /// Reads where the file ends from the disk and its header (see ``open(fd:path:headerBytes:header:keys:)``).
    private func loadEnd() throws {
        cache = nil
        diskRunsPastEnd = false
        lastSealedFinal = true
        let fileSize = try POSIXFile.size(fd, path: path)
        // A truncation under way comes first: its new final segment may already be written, over
        // a file whose old end still authenticates.
        if let target = header.truncatingTo, layout.fileSize(plaintextSize: target) <= fileSize {
            let last = layout.lastIndex(size: target)
            let length = layout.plaintextLength(ofSegment: last, size: target)
            let raw = try POSIXFile.read(
                fd, count: length + SegmentCipher.overhead, at: layout.offset(ofSegment: last), path: path)
            if let plaintext = cipher.open(raw[...], index: last, final: true) {
                size = target
                cache = (last, plaintext)
                diskRunsPastEnd = layout.fileSize(plaintextSize: target) < fileSize
                return
            }
        }
        guard fileSize - Int64(ProtectedFileHeader.size) >= Int64(SegmentCipher.overhead) else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated: no complete segment after the header")
        }
        guard let (plainSize, count) = layout.plaintextSize(fileSize: fileSize) else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside its last segment")
        }
        let last = count - 1
        let lastLength = layout.plaintextLength(ofSegment: last, size: plainSize)
        let raw = try POSIXFile.read(
            fd, count: lastLength + SegmentCipher.overhead, at: layout.offset(ofSegment: last), path: path)
        if let plaintext = cipher.open(raw[...], index: last, final: true) {
            size = plainSize
            cache = (last, plaintext)
            return
        }
        if let plaintext = cipher.open(raw[...], index: last, final: false) {
            // A write that extended the file, cut short: what it wrote is there, in whole segments
            // (a segment sealed non-final is always full).
            guard header.beingWritten, lastLength == layout.capacity(ofSegment: last) else {
                throw ProtectedFileError.damaged(
                    path: path, reason: "truncated: segment \(last) is not the final segment")
            }
            size = plainSize
            lastSealedFinal = false
            cache = (last, plaintext)
            return
        }
        throw ProtectedFileError.damaged(
            path: path, reason: "segment \(last) failed authentication (modified, extended or reordered)")
    }

    /// After a change that failed part-way (a full disk, an I/O error): what the file now is,
    /// read again from the disk, so that nothing later — a settle above all — acts on what the
    /// change meant to do. A file that no longer opens stays marked as being written.
    func recover() {
        cache = nil
        guard let bytes = try? POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path),
            let onDisk = try? ProtectedFileHeader.parse(bytes, path: path), onDisk.fileID == header.fileID,
            ProtectedFileHeader.verify(bytes, keys: keys)
        else {
            damagedByFailure = true
            return
        }
        header = onDisk
        do { try loadEnd() } catch { damagedByFailure = true }
    }

    deinit { scratch.deallocate() }

    /// Reads `count` sealed bytes at `offset` into the scratch buffer (fewer at the end of file).
    func readSealed(count: Int, at offset: Int64) throws -> UnsafeRawBufferPointer {
        if scratch.count < count {
            scratch.deallocate()
            scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 64)
        }
        let done = try POSIXFile.read(
            fd, into: UnsafeMutableRawBufferPointer(rebasing: scratch[0..<count]), at: offset, path: path)
        return UnsafeRawBufferPointer(rebasing: scratch[0..<done])
    }

    var lastIndex: Int { layout.lastIndex(size: size) }
    /// The segment to open as final: the last one, unless it was left non-final.
    var finalIndex: Int { lastSealedFinal ? lastIndex : -1 }

    /// Decrypts one existing segment (through the one-segment cache).
    func segment(_ index: Int) throws -> Data {
        if let cache, cache.index == index { return cache.plaintext }
        let length = layout.plaintextLength(ofSegment: index, size: size)
        let raw = try readSealed(count: length + SegmentCipher.overhead, at: layout.offset(ofSegment: index))
        guard raw.count == length + SegmentCipher.overhead else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(index)")
        }
        guard let plaintext = cipher.open(raw, index: index, final: index == finalIndex) else {
            throw ProtectedFileError.damaged(
                path: path, reason: "segment \(index) failed authentication (modified, swapped or reordered)")
        }
        cache = (index, plaintext)
        return plaintext
    }
}
