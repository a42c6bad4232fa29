import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// Writing in place (format 2, FORMAT.md §3): a segment is never torn — each write goes to a
/// fresh slot and the header's marks say which is current.
extension SegmentedFile {
    /// Before a change in place: a format-2 file is marked as being written (one header write,
    /// the first time), so that a change cut short leaves a file that still opens; and bytes
    /// left past the end by a truncation cut short are cut off.
    ///
    /// `withinFirstPage`: the change rewrites segment 0 only, in a file that ends in it before and
    /// after — one write inside the header's page, which a kill never cuts (FORMAT.md §3): no
    /// mark is needed, and a small file is never marked, nor settled.
    func beginChange(withinFirstPage: Bool = false) throws {
        guard header.version >= ProtectedFileHeader.pageAlignedVersion else { return }
        if !header.beingWritten, !withinFirstPage {
            var next = header
            next.beingWritten = true
            header = try writeHeader(next)
        }
        try cutOffExcess()
    }

    /// Cuts off what a truncation cut short left past the file's end, if anything.
    func cutOffExcess() throws {
        guard diskRunsPastEnd else { return }
        try POSIXFile.system("ftruncate", path) { try fd.resize(to: layout.fileSize(plaintextSize: size)) }
        diskRunsPastEnd = false
    }

    /// Writes `next` (its marks, and its key's wrapping as the disk has it now: a class change
    /// made by another writer is kept) and returns what was written.
    func writeHeader(_ next: ProtectedFileHeader) throws -> ProtectedFileHeader {
        var next = next
        let current = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
        if let onDisk = try? ProtectedFileHeader.parse(current, path: path), onDisk.fileID == header.fileID,
            ProtectedFileHeader.verify(current, keys: keys)
        {
            next.wrappedKey = onDisk.wrappedKey
        }
        try POSIXFile.write(fd, next.encoded(keys: keys), at: 0, path: path)
        return next
    }

    /// Gives the file's key a new wrapping (a class change) with one header write, keeping its
    /// marks, then flushes it.
    func replaceWrapping(_ wrapped: WrappedFileKey) throws {
        var next = header
        next.wrappedKey = wrapped
        try POSIXFile.write(fd, next.encoded(keys: keys), at: 0, path: path)
        header = next
        try POSIXFile.sync(fd, path: path)
    }

    /// Whether ``settle()`` has anything to write.
    var needsSettling: Bool { header.beingWritten || header.truncatingTo != nil || !lastSealedFinal || diskRunsPastEnd }

    /// Ends a run of changes in place: bytes a truncation cut short left are cut off, the last
    /// segment is sealed final again if a write cut short left it otherwise, and — once the end
    /// on disk authenticates as final — the header's marks are cleared, so that the file's end is
    /// authenticated again. Called when the writer is done (a close, an fsync); cheap when
    /// nothing changed.
    func settle() throws {
        guard needsSettling else { return }
        guard !damagedByFailure else {
            throw ProtectedFileError.damaged(
                path: path, reason: "a write failed part-way; the file is left marked as being written")
        }
        do {
            try cutOffExcess()
            if !lastSealedFinal {
                let last = lastIndex
                let plaintext = [UInt8](try segment(last))
                var sealed = [UInt8]()
                try plaintext.withUnsafeBytes { try cipher.seal($0, index: last, final: true, into: &sealed) }
                try POSIXFile.write(fd, sealed, at: layout.offset(ofSegment: last), path: path)
                lastSealedFinal = true
                cache = nil
                // On the disk before the mark goes (a power cut could otherwise keep the header only).
                try POSIXFile.system("fdatasync", path) {
                    guard fdatasync(fd.rawValue) == 0 else { throw Errno(rawValue: errno) }
                }
            }
            guard header.beingWritten || header.truncatingTo != nil else { return }
            // The end, as a reader will find it, must authenticate as final before the mark goes.
            let last = lastIndex
            let length = layout.plaintextLength(ofSegment: last, size: size)
            guard try POSIXFile.size(fd, path: path) == layout.fileSize(plaintextSize: size),
                cipher.open(
                    try POSIXFile.read(
                        fd, count: length + SegmentCipher.overhead, at: layout.offset(ofSegment: last), path: path)[
                            ...],
                    index: last, final: true) != nil
            else {
                throw ProtectedFileError.damaged(
                    path: path, reason: "its end does not authenticate; it stays marked as being written")
            }
            var next = header
            next.beingWritten = false
            next.truncatingTo = nil
            header = try writeHeader(next)
        } catch {
            recover()
            throw error
        }
    }

    /// Reads up to `count` bytes at `offset` (fewer at the end of the file).
    func read(at offset: Int64, count: Int) throws -> Data {
        guard offset >= 0, count >= 0 else {
            throw ProtectedFileError.invalidRange(path: path, reason: "negative offset or count")
        }
        let end = min(size, offset + Int64(count))
        guard offset < end else { return Data() }
        let first = layout.segment(containing: offset)
        let last = layout.segment(containing: end - 1)
        if last > first { return try readSegments(first...last, from: offset, to: end) }
        let plaintext = try segment(first)
        let start = plaintext.startIndex + Int(offset - layout.plaintextStart(ofSegment: first))
        let length = Int(end - offset)
        return start == plaintext.startIndex && length == plaintext.count
            ? plaintext : Data(plaintext[start..<(start + length)])
    }

    /// Reads several segments with one `pread` and opens them on every core.
    func readSegments(_ indices: ClosedRange<Int>, from offset: Int64, to end: Int64) throws -> Data {
        let firstStart = layout.plaintextStart(ofSegment: indices.lowerBound)
        let plainLength = Int(min(size, layout.plaintextStart(ofSegment: indices.upperBound + 1)) - firstStart)
        let sealedLength = plainLength + indices.count * SegmentCipher.overhead
        let raw = try readSealed(count: sealedLength, at: layout.offset(ofSegment: indices.lowerBound))
        guard raw.count == sealedLength else {
            throw ProtectedFileError.damaged(path: path, reason: "truncated inside segment \(indices.upperBound)")
        }
        var plain = Data(count: plainLength)
        let failed = plain.withUnsafeMutableBytes { output in
            cipher.openSegments(
                raw, layout: layout, firstIndex: indices.lowerBound, finalIndex: finalIndex, into: output,
                threads: threads)
        }
        if let failed {
            throw ProtectedFileError.damaged(
                path: path, reason: "segment \(failed) failed authentication (modified, swapped or reordered)")
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
        do {
            try writeSegments(bytes, at: offset)
        } catch {
            recover()
            throw error
        }
    }

    func writeSegments(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        let oldLast = lastIndex
        let newSize = max(size, offset + Int64(bytes.count))
        let newLast = layout.lastIndex(size: newSize)
        try beginChange(withinFirstPage: newLast == 0 && lastSealedFinal)
        let end = offset + Int64(bytes.count)
        let first = layout.segment(containing: offset)
        let lastTouched = layout.segment(containing: end - 1)
        let perWindow = max(Self.batchBytes / layout.capacity, 1)
        var plain = [UInt8]()
        defer { try? writer.finish() }
        // The old final segment will not be the last one: it is resealed as non-final — in
        // format 2 first, so that a write cut short leaves a file ending in whole segments
        // (which opens: FORMAT.md §3); in format 1 last, as it always was.
        let resealsOldLast = oldLast < first && newLast != oldLast
        var oldLastPlaintext: [UInt8]?
        if resealsOldLast { oldLastPlaintext = [UInt8](try segment(oldLast)) }
        func resealOldLast() throws {
            guard let old = oldLastPlaintext else { return }
            var resealed = [UInt8]()
            try old.withUnsafeBytes { try cipher.seal($0, index: oldLast, final: false, into: &resealed) }
            try POSIXFile.write(fd, resealed, at: layout.offset(ofSegment: oldLast), path: path)
            cache = nil
        }
        let resealFirst = header.version >= ProtectedFileHeader.pageAlignedVersion
        if resealFirst, resealsOldLast {
            try resealOldLast()
            lastSealedFinal = false
        }

        var windowStart = first
        while windowStart <= lastTouched {
            let windowEnd = min(lastTouched, windowStart + perWindow - 1)
            let plainStart = layout.plaintextStart(ofSegment: windowStart)
            let plainEnd = min(layout.plaintextStart(ofSegment: windowEnd + 1), newSize)
            let plainLength = Int(plainEnd - plainStart)
            let segments = windowEnd - windowStart + 1
            let sealedLength = plainLength + segments * SegmentCipher.overhead
            func sealAndWrite(_ source: UnsafeRawBufferPointer) throws {
                try writer.submit(length: sealedLength, at: layout.offset(ofSegment: windowStart)) { output in
                    try cipher.sealSegments(
                        source, layout: layout, firstIndex: windowStart, lastIsFinal: windowEnd == newLast,
                        into: output, threads: min(threads, WindowWriter.sealingThreads))
                }
            }
            if offset <= plainStart, end >= plainEnd {
                // The new bytes cover the whole window: seal them where they are.
                try sealAndWrite(
                    UnsafeRawBufferPointer(rebasing: bytes[Int(plainStart - offset)..<Int(plainEnd - offset)]))
            } else {
                if plain.count < plainLength { plain = [UInt8](repeating: 0, count: plainLength) }
                // Existing bytes of the segments the new data covers only partly (the window's ends).
                for index in Set([windowStart, windowEnd]) where index <= oldLast {
                    let segmentStart = layout.plaintextStart(ofSegment: index)
                    let segmentEnd = min(layout.plaintextStart(ofSegment: index + 1), newSize)
                    guard offset > segmentStart || end < segmentEnd else { continue }
                    let existing = try segment(index)
                    let at = Int(segmentStart - plainStart)
                    plain.withUnsafeMutableBytes { dest in
                        _ = existing.copyBytes(
                            to: UnsafeMutableRawBufferPointer(rebasing: dest[at..<(at + existing.count)]))
                        // Bytes past the segment's old end (up to the new data) are zeros.
                        let newEnd = at + Int(segmentEnd - segmentStart)
                        if at + existing.count < newEnd {
                            UnsafeMutableRawBufferPointer(rebasing: dest[(at + existing.count)..<newEnd])
                                .initializeMemory(as: UInt8.self, repeating: 0)
                        }
                    }
                }
                // The new bytes over them.
                let copyStart = max(offset, plainStart), copyEnd = min(end, plainEnd)
                plain.withUnsafeMutableBytes { dest in
                    UnsafeMutableRawBufferPointer(
                        rebasing: dest[Int(copyStart - plainStart)..<Int(copyEnd - plainStart)]
                    )
                    .copyMemory(
                        from: UnsafeRawBufferPointer(rebasing: bytes[Int(copyStart - offset)..<Int(copyEnd - offset)]))
                }
                try plain.withUnsafeBytes { try sealAndWrite(UnsafeRawBufferPointer(rebasing: $0[0..<plainLength])) }
            }
            if let cached = cache?.index, (windowStart...windowEnd).contains(cached) { cache = nil }
            windowStart = windowEnd + 1
        }
        try writer.finish()
        if !resealFirst { try resealOldLast() }
        size = newSize
        if lastTouched == newLast { lastSealedFinal = true }
    }

    /// Fills a new, empty file from `source` in one pass: every segment is sealed once, with
    /// only the last one final. (``write(_:at:)`` would reseal the previous final segment on
    /// every append.) `source` fills the buffer it is given and returns the byte count, 0 at the end.
    func writeStream(from source: (UnsafeMutableRawBufferPointer) throws -> Int) throws {
        precondition(size == 0, "streaming into a non-empty file")
        let window = max(Self.batchBytes / layout.capacity, 1) * layout.capacity
        // Start small (small files are common: a property list is a few hundred bytes, and
        // zeroing two segments' worth was a tenth of writing one) and grow while the source
        // keeps filling it.
        var pending = [UInt8](repeating: 0, count: min(2 * layout.capacity, 4096))
        var filled = 0
        var index = 0
        var total: Int64 = 0
        var atEnd = false
        defer { try? writer.finish() }
        repeat {
            while !atEnd, filled < pending.count {
                let n = try pending.withUnsafeMutableBytes {
                    try source(UnsafeMutableRawBufferPointer(rebasing: $0[filled...]))
                }
                if n == 0 { atEnd = true } else { filled += n }
                if filled == pending.count, pending.count < window + layout.capacity {
                    pending += [UInt8](
                        repeating: 0, count: min(pending.count, window + layout.capacity - pending.count))
                }
            }
            // Seal the segments that are certainly not the last; at the end, the rest, the last one final.
            let batchStart = index
            var consumed = filled
            var sealFinal = atEnd
            if !atEnd {
                // Keep at least one byte back: the segment holding it may turn out to be the last.
                consumed =
                    filled == 0
                    ? 0
                    : Int(
                        layout.plaintextStart(ofSegment: layout.segment(containing: total + Int64(filled) - 1)) - total)
                sealFinal = false
            }
            let segments =
                consumed == 0
                ? (sealFinal ? 1 : 0) : layout.segment(containing: total + Int64(consumed) - 1) - index + 1
            if segments > 0 {
                let sealedBytes = consumed + segments * SegmentCipher.overhead
                try pending.withUnsafeBytes { input in
                    try writer.submit(length: sealedBytes, at: layout.offset(ofSegment: batchStart)) { output in
                        try cipher.sealSegments(
                            UnsafeRawBufferPointer(rebasing: input[0..<consumed]), layout: layout,
                            firstIndex: index, lastIsFinal: sealFinal, into: output,
                            threads: min(threads, WindowWriter.sealingThreads))
                    }
                }
                index += segments
            }
            let leftover = filled - consumed
            if leftover > 0, consumed > 0 {
                pending.withUnsafeMutableBytes { raw in
                    raw.baseAddress!.copyMemory(
                        from: UnsafeRawPointer(raw.baseAddress!.advanced(by: consumed)), byteCount: leftover)
                }
            }
            filled = leftover
            total += Int64(consumed)
        } while !(atEnd && filled == 0)
        try writer.finish()
        size = total
        cache = nil
        // The segments written reach the file's end already (they cover at least the empty final
        // segment ``create(fd:path:header:keys:)`` wrote): cut only what is longer, never asked
        // for nothing (`ftruncate` is not free on ext4 even when the length is the same).
        let length = layout.fileSize(plaintextSize: size)
        var st = stat()
        if fstat(fd.rawValue, &st) != 0 || Int64(st.st_size) != length {
            try POSIXFile.system("ftruncate", path) { try fd.resize(to: length) }
        }
    }

    func fillZeros(upTo target: Int64) throws {
        let chunk = [UInt8](repeating: 0, count: 1 << 20)
        while size < target {
            let n = Int(min(Int64(chunk.count), target - size))
            try chunk.withUnsafeBytes { try write(UnsafeRawBufferPointer(rebasing: $0[0..<n]), at: size) }
        }
    }

    /// Cuts the file to `newSize` bytes, or extends it with zeros.
    ///
    /// A format-2 file records the length it is being cut to in its header first, so that a
    /// truncation cut short (the new final segment written, the bytes after it not yet cut off)
    /// still opens, at its new length.
    func truncate(to newSize: Int64) throws {
        guard newSize >= 0 else { throw ProtectedFileError.invalidRange(path: path, reason: "negative size") }
        if newSize >= size { return try fillZeros(upTo: newSize) }
        do {
            try cut(to: newSize)
        } catch {
            recover()
            throw error
        }
    }

    func cut(to newSize: Int64) throws {
        try beginChange()
        let newLast = layout.lastIndex(size: newSize)
        let keep = layout.plaintextLength(ofSegment: newLast, size: newSize)
        let plaintext = [UInt8](try segment(newLast))
        let pageAligned = header.version >= ProtectedFileHeader.pageAlignedVersion
        if pageAligned {
            var next = header
            next.truncatingTo = newSize
            header = try writeHeader(next)
        }
        var sealed = [UInt8]()
        try plaintext.withUnsafeBytes {
            try cipher.seal(UnsafeRawBufferPointer(rebasing: $0[0..<keep]), index: newLast, final: true, into: &sealed)
        }
        try POSIXFile.write(fd, sealed, at: layout.offset(ofSegment: newLast), path: path)
        cache = nil
        try POSIXFile.system("ftruncate", path) {
            try fd.resize(to: layout.offset(ofSegment: newLast) + Int64(sealed.count))
        }
        size = newSize
        lastSealedFinal = true
        if pageAligned {
            // Done: the truncation mark goes (the file stays marked as being written).
            var next = header
            next.truncatingTo = nil
            header = try writeHeader(next)
        }
    }
}
