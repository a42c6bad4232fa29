import GRDBSQLite
import Logging

/// The write-ahead log, in SQLCipher's layout: a 32-byte header, then frames of a 24-byte
/// header and one sealed page.
///
/// SQLite chains each frame's checksum pair over the frame header's first 8 bytes and the page
/// *it* sees — plaintext; SQLCipher, which encrypts before checksumming, chains over the sealed
/// page. On disk we keep SQLCipher's chain (so a hot WAL left by either is recovered by the
/// other, and checksums say nothing about plaintext) and translate at this boundary:
/// - a frame header SQLite writes is held back until its page arrives, then written with the
///   chain over the sealed page (a header rewritten alone is chained over the page on disk);
/// - frames SQLite reads whole (recovery, checksum rewrites) are verified against the on-disk
///   chain, and handed over with the chain SQLite expects over the plaintext. A frame whose
///   chain fails is the torn end of the log (SQLite is given inverted salts, as if its own check
///   had failed) — unless the frame after it continues the log, which a crash cannot leave
///   behind: then it was changed in place, and that is an error, as is a frame whose chain holds
///   but whose page fails authentication or whose salts differ from the header's.
final class WALFile: DiskFile {
    static let headerSize: Int64 = 32
    static let frameHeaderSize = 24

    typealias Chain = (UInt32, UInt32)

    let context: CipherContext
    private var cipherCache = CachedCipher()
    private var cipher: PageCipher.Session? { cipherCache.current(context) }
    private let pageSize: Int
    private let frameSize: Int
    private let raw: PageBuffer
    private let plain: PageBuffer
    /// A frame header SQLite wrote, waiting for its page.
    private var pendingHeader: (frameStart: Int64, bytes: [UInt8])?
    /// The plaintext chain of the last frame handed to SQLite whole.
    private var plainChainCache: (frameStart: Int64, chain: Chain)?

    init(real: UnsafeMutablePointer<sqlite3_file>, context: CipherContext) {
        self.context = context
        self.pageSize = context.format.pageSize
        self.frameSize = context.format.pageSize + Self.frameHeaderSize
        self.raw = PageBuffer(context.format.pageSize + Self.frameHeaderSize)
        self.plain = PageBuffer(context.format.pageSize)
        super.init(real: real)
    }

    // MARK: - Checksums (SQLite's walChecksumBytes)

    static func checksum(_ bytes: UnsafeRawBufferPointer, bigEndianWords: Bool, _ start: Chain) -> Chain {
        var s1 = start.0, s2 = start.1
        var i = 0
        while i + 8 <= bytes.count {
            let x0 = bigEndianWords ? bytes.bigEndianUInt32(at: i) : bytes.littleEndianUInt32(at: i)
            let x1 = bigEndianWords ? bytes.bigEndianUInt32(at: i + 4) : bytes.littleEndianUInt32(at: i + 4)
            s1 = s1 &+ x0 &+ s2
            s2 = s2 &+ x1 &+ s1
            i += 8
        }
        return (s1, s2)
    }

    private func frameChain(
        header: UnsafeRawBufferPointer, page: UnsafeRawBufferPointer, bigEndianWords: Bool, previous: Chain
    ) -> Chain {
        Self.checksum(
            page, bigEndianWords: bigEndianWords,
            Self.checksum(UnsafeRawBufferPointer(rebasing: header[0..<8]), bigEndianWords: bigEndianWords, previous))
    }

    /// The WAL header's word order and checksum, from disk.
    private func walHeader() -> (bigEndianWords: Bool, chain: Chain)? {
        var bytes = [UInt8](repeating: 0, count: 32)
        guard bytes.withUnsafeMutableBytes({ rawRead($0.baseAddress!, count: 32, at: 0) }) == SQLITE_OK else {
            return nil
        }
        return bytes.withUnsafeBytes { b in ((b[3] & 1) == 1, (b.bigEndianUInt32(at: 24), b.bigEndianUInt32(at: 28))) }
    }

    /// The chain stored on disk for the frame before `frameStart` (or the WAL header's).
    private func storedChain(before frameStart: Int64) -> Chain? {
        if frameStart == Self.headerSize { return walHeader()?.chain }
        var bytes = [UInt8](repeating: 0, count: 8)
        guard
            bytes.withUnsafeMutableBytes({ rawRead($0.baseAddress!, count: 8, at: frameStart - Int64(frameSize) + 16) })
                == SQLITE_OK
        else { return nil }
        return bytes.withUnsafeBytes { ($0.bigEndianUInt32(at: 0), $0.bigEndianUInt32(at: 4)) }
    }

    private static func store(_ chain: Chain, into header: UnsafeMutableRawBufferPointer) {
        withUnsafeBytes(of: chain.0.bigEndian) {
            UnsafeMutableRawBufferPointer(rebasing: header[16..<20]).copyMemory(from: $0)
        }
        withUnsafeBytes(of: chain.1.bigEndian) {
            UnsafeMutableRawBufferPointer(rebasing: header[20..<24]).copyMemory(from: $0)
        }
    }

    // MARK: - Writing

    private func position(_ offset: Int64) -> (frameStart: Int64, within: Int) {
        let within = Int((offset - Self.headerSize) % Int64(frameSize))
        return (offset - Int64(within), within)
    }

    /// Writes `header` for the frame at `frameStart` whose sealed page is `raw[24...]`, with the
    /// chain over the sealed page; `withPage` writes the page too.
    private func writeFrame(header: UnsafeRawBufferPointer, frameStart: Int64, withPage: Bool) -> Int32 {
        guard let wal = walHeader(), let previous = storedChain(before: frameStart) else { return SQLITE_IOERR_WRITE }
        let out = UnsafeMutableRawBufferPointer(rebasing: raw.bytes[0..<Self.frameHeaderSize])
        out.copyMemory(from: header)
        let sealed = UnsafeRawBufferPointer(rebasing: raw.readOnly[Self.frameHeaderSize...])
        Self.store(
            frameChain(
                header: UnsafeRawBufferPointer(out), page: sealed, bigEndianWords: wal.bigEndianWords,
                previous: previous), into: out)
        return rawWrite(raw.bytes.baseAddress!, count: withPage ? frameSize : Self.frameHeaderSize, at: frameStart)
    }

    /// Writes a held-back header whose page is already on disk (SQLite rewriting checksums).
    private func flushPendingHeader() -> Int32 {
        guard let pending = pendingHeader else { return SQLITE_OK }
        pendingHeader = nil
        let rc = rawRead(
            raw.bytes.baseAddress! + Self.frameHeaderSize, count: pageSize,
            at: pending.frameStart + Int64(Self.frameHeaderSize))
        guard rc == SQLITE_OK else {
            CipherVFS.logger.error("WAL frame header at \(pending.frameStart) has no page to chain over")
            return SQLITE_IOERR_WRITE
        }
        plainChainCache = nil
        return pending.bytes.withUnsafeBytes { writeFrame(header: $0, frameStart: pending.frameStart, withPage: false) }
    }

    override func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        let flushed = flushPendingHeaderUnlessContinued(offset: offset, count: buffer.count)
        if flushed != SQLITE_OK { return flushed }
        if offset < Self.headerSize {
            plainChainCache = nil
            return rawWrite(buffer.baseAddress!, count: buffer.count, at: offset)
        }
        guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
        let (frameStart, within) = position(offset)
        let headerSize = Self.frameHeaderSize
        let sealedPage = UnsafeMutableRawBufferPointer(rebasing: raw.bytes[headerSize...])
        do {
            switch (within, buffer.count) {
            case (0, headerSize):
                pendingHeader = (frameStart, [UInt8](buffer))
                return SQLITE_OK
            case (headerSize, pageSize):
                plainChainCache = nil
                if let pending = pendingHeader, pending.frameStart == frameStart {
                    pendingHeader = nil
                    try cipher.seal(
                        buffer, pgno: pending.bytes.withUnsafeBytes { $0.bigEndianUInt32(at: 0) }, into: sealedPage)
                    return pending.bytes.withUnsafeBytes {
                        writeFrame(header: $0, frameStart: frameStart, withPage: true)
                    }
                }
                // A page rewritten in place; SQLite rewrites the checksums after it.
                guard let pgno = storedPageNumber(frameStart: frameStart) else { return SQLITE_IOERR_WRITE }
                try cipher.seal(buffer, pgno: pgno, into: sealedPage)
                return rawWrite(sealedPage.baseAddress!, count: pageSize, at: offset)
            case (0, frameSize):
                plainChainCache = nil
                try cipher.seal(
                    UnsafeRawBufferPointer(rebasing: buffer[headerSize...]), pgno: buffer.bigEndianUInt32(at: 0),
                    into: sealedPage)
                return writeFrame(
                    header: UnsafeRawBufferPointer(rebasing: buffer[0..<headerSize]), frameStart: frameStart,
                    withPage: true)
            default:
                CipherVFS.logger.error("WAL write of \(buffer.count) bytes at \(offset) is not a frame, header or page")
                return SQLITE_IOERR_WRITE
            }
        } catch {
            return SQLITE_IOERR_WRITE
        }
    }

    /// Flushes a held-back header unless this write is its page.
    private func flushPendingHeaderUnlessContinued(offset: Int64, count: Int) -> Int32 {
        guard let pending = pendingHeader else { return SQLITE_OK }
        if offset == pending.frameStart + Int64(Self.frameHeaderSize) && count == pageSize { return SQLITE_OK }
        return flushPendingHeader()
    }

    // MARK: - Reading

    override func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 {
        let flushed = flushPendingHeader()
        if flushed != SQLITE_OK { return flushed }
        if offset < Self.headerSize {
            let rc = rawRead(buffer.baseAddress!, count: buffer.count, at: offset)
            if rc == SQLITE_OK, offset == 0, buffer.count == Int(Self.headerSize),
                let evidence = headerTamperEvidence(UnsafeRawBufferPointer(buffer))
            {
                context.recordFailure("WAL header: \(evidence)")
                return SQLITE_IOERR_DATA
            }
            return rc
        }
        guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
        let (frameStart, within) = position(offset)
        let headerSize = Self.frameHeaderSize
        switch (within, buffer.count) {
        case (headerSize, pageSize):
            guard let pgno = storedPageNumber(frameStart: frameStart) else {
                buffer.initializeMemory(as: UInt8.self, repeating: 0)
                return SQLITE_IOERR_SHORT_READ
            }
            let rc = rawRead(raw.bytes.baseAddress!, count: pageSize, at: offset)
            guard rc == SQLITE_OK else { buffer.initializeMemory(as: UInt8.self, repeating: 0); return rc }
            guard cipher.open(UnsafeRawBufferPointer(rebasing: raw.readOnly[0..<pageSize]), pgno: pgno, into: buffer)
            else {
                context.recordFailure("WAL frame at offset \(frameStart) (page \(pgno)) failed authentication")
                return SQLITE_IOERR_DATA
            }
            return SQLITE_OK
        case (0, frameSize):
            return readWholeFrame(buffer, frameStart: frameStart, cipher)
        case (0, headerSize), (16, 8):
            let frame = UnsafeMutableRawBufferPointer.allocate(byteCount: frameSize, alignment: 16)
            defer { frame.deallocate() }
            let rc = readWholeFrame(frame, frameStart: frameStart, cipher)
            guard rc == SQLITE_OK else { buffer.initializeMemory(as: UInt8.self, repeating: 0); return rc }
            buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: frame[within..<within + buffer.count]))
            return SQLITE_OK
        default:
            CipherVFS.logger.error("WAL read of \(buffer.count) bytes at \(offset) is not a frame, header or page")
            return SQLITE_IOERR_READ
        }
    }

    /// Reads the frame at `frameStart` into `out` (frameSize bytes) as SQLite expects it:
    /// plaintext page, checksum chained over plaintext.
    private func readWholeFrame(
        _ out: UnsafeMutableRawBufferPointer, frameStart: Int64, _ cipher: PageCipher.Session
    ) -> Int32 {
        let headerSize = Self.frameHeaderSize
        let rc = rawRead(raw.bytes.baseAddress!, count: frameSize, at: frameStart)
        guard rc == SQLITE_OK else { out.initializeMemory(as: UInt8.self, repeating: 0); return rc }
        guard let wal = walHeader(), let previous = storedChain(before: frameStart) else { return SQLITE_IOERR_READ }
        let header = UnsafeMutableRawBufferPointer(rebasing: out[0..<headerSize])
        header.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw.readOnly[0..<headerSize]))
        let sealed = UnsafeRawBufferPointer(rebasing: raw.readOnly[headerSize...])
        let stored = (
            UnsafeRawBufferPointer(header).bigEndianUInt32(at: 16),
            UnsafeRawBufferPointer(header).bigEndianUInt32(at: 20)
        )
        let onDisk = frameChain(
            header: UnsafeRawBufferPointer(header), page: sealed, bigEndianWords: wal.bigEndianWords, previous: previous
        )
        let page = UnsafeMutableRawBufferPointer(rebasing: out[headerSize...])
        guard onDisk == stored else {
            let pgno = UnsafeRawBufferPointer(header).bigEndianUInt32(at: 0)
            let macHolds = cipher.open(sealed, pgno: pgno, into: page)
            // Page 1's first 16 bytes are the database's salt, which the MAC does not cover.
            let saltChanged =
                pgno == 1
                && !cipher.keys.salt.withUnsafeBytes {
                    UnsafeRawBufferPointer(rebasing: sealed[0..<16]).elementsEqual($0)
                }
            if let evidence = tamperEvidence(
                after: frameStart, storedChain: stored, computedChain: onDisk, macHolds: macHolds && !saltChanged,
                wal: wal)
            {
                page.initializeMemory(as: UInt8.self, repeating: 0)
                context.recordFailure(
                    "WAL frame at offset \(frameStart): \(evidence); the frame after it continues the log, so this one was changed in place, not torn by a crash"
                )
                return SQLITE_IOERR_DATA
            }
            // The torn end of the log: make SQLite's own check fail here too.
            page.initializeMemory(as: UInt8.self, repeating: 0)
            for i in 8..<16 { header[i] ^= 0xFF }
            return SQLITE_OK
        }
        let pgno = UnsafeRawBufferPointer(header).bigEndianUInt32(at: 0)
        guard cipher.open(sealed, pgno: pgno, into: page) else {
            context.recordFailure("WAL frame at offset \(frameStart) (page \(pgno)) failed authentication")
            return SQLITE_IOERR_DATA
        }
        // A frame that continues the chain was written in this log's generation, so its salts
        // are the header's; different salts were edited (the chain and MAC do not cover them).
        if let salts = walSalts(),
            !UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(header)[8..<16]).elementsEqual(salts)
        {
            context.recordFailure("WAL frame at offset \(frameStart): its salts were changed")
            return SQLITE_IOERR_DATA
        }
        guard let plainPrevious = plainChain(before: frameStart, cipher: cipher, wal: wal) else {
            return SQLITE_IOERR_READ
        }
        let chain = frameChain(
            header: UnsafeRawBufferPointer(header), page: UnsafeRawBufferPointer(page),
            bigEndianWords: wal.bigEndianWords, previous: plainPrevious)
        Self.store(chain, into: header)
        plainChainCache = (frameStart, chain)
        return SQLITE_OK
    }

    /// Why a WAL header whose own checksum fails was changed rather than never written — or
    /// `nil`. SQLite ignores a log whose header does not check, silently dropping every commit in
    /// it; but the header is written (and synced) before any frame, so when the first frame
    /// continues the chain from the header's stored checksum (or from the checksum the header
    /// should have), the header was changed after the fact.
    private func headerTamperEvidence(_ header: UnsafeRawBufferPointer) -> String? {
        let stored = (header.bigEndianUInt32(at: 24), header.bigEndianUInt32(at: 28))
        let frame = UnsafeMutableRawBufferPointer.allocate(byteCount: frameSize, alignment: 16)
        defer { frame.deallocate() }
        for bigEndianWords in [(header[3] & 1) == 1, (header[3] & 1) == 0] {
            let computed = Self.checksum(
                UnsafeRawBufferPointer(rebasing: header[0..<24]), bigEndianWords: bigEndianWords, (0, 0))
            if bigEndianWords == ((header[3] & 1) == 1), computed == stored { return nil }   // the header checks
            guard rawRead(frame.baseAddress!, count: frameSize, at: Self.headerSize) == SQLITE_OK else { return nil }
            let frameHeader = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(frame)[0..<Self.frameHeaderSize])
            let page = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(frame)[Self.frameHeaderSize...])
            let frameStored = (frameHeader.bigEndianUInt32(at: 16), frameHeader.bigEndianUInt32(at: 20))
            for start in [stored, computed]
            where frameChain(header: frameHeader, page: page, bigEndianWords: bigEndianWords, previous: start)
                == frameStored
            {
                return "its checksum does not match its fields, yet the first frame continues the log: it was changed"
            }
        }
        return nil
    }

    /// The WAL header's salts (bytes 16..<24).
    private func walSalts() -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: 8)
        guard bytes.withUnsafeMutableBytes({ rawRead($0.baseAddress!, count: 8, at: 16) }) == SQLITE_OK else {
            return nil
        }
        return bytes
    }

    /// Why the frame at `frameStart`, whose chain failed, was damaged in place rather than torn —
    /// or `nil` when nothing tells (then it is the end of the log, as after a crash).
    ///
    /// A crash leaves frames written in order: nothing valid follows a torn frame. So when the
    /// *next* frame carries this log's salts and continues the chain from this frame's stored
    /// checksum while this frame's page fails authentication, the page or its page number was
    /// changed; when the next frame continues the chain computed over this frame as it is, this
    /// frame's stored checksum was changed. (A frame left over from a rolled-back transaction
    /// continues the chain too, but its predecessor's page still authenticates, so no false alarm.)
    private func tamperEvidence(
        after frameStart: Int64, storedChain: Chain, computedChain: Chain, macHolds: Bool,
        wal: (bigEndianWords: Bool, chain: Chain)
    ) -> String? {
        guard let salts = walSalts() else { return nil }
        let next = UnsafeMutableRawBufferPointer.allocate(byteCount: frameSize, alignment: 16)
        defer { next.deallocate() }
        guard rawRead(next.baseAddress!, count: frameSize, at: frameStart + Int64(frameSize)) == SQLITE_OK else {
            return nil
        }
        let nextHeader = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(next)[0..<Self.frameHeaderSize])
        let nextPage = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(next)[Self.frameHeaderSize...])
        guard UnsafeRawBufferPointer(rebasing: nextHeader[8..<16]).elementsEqual(salts) else { return nil }
        let nextStored = (nextHeader.bigEndianUInt32(at: 16), nextHeader.bigEndianUInt32(at: 20))
        if !macHolds,
            frameChain(header: nextHeader, page: nextPage, bigEndianWords: wal.bigEndianWords, previous: storedChain)
                == nextStored
        {
            return "its page or page number was changed"
        }
        if frameChain(header: nextHeader, page: nextPage, bigEndianWords: wal.bigEndianWords, previous: computedChain)
            == nextStored
        {
            return "its checksum was changed"
        }
        return nil
    }

    /// SQLite's (plaintext) chain up to the frame before `frameStart`: from the cache when SQLite
    /// reads frames in order, else recomputed from the start of the log.
    private func plainChain(
        before frameStart: Int64, cipher: PageCipher.Session, wal: (bigEndianWords: Bool, chain: Chain)
    ) -> Chain? {
        if frameStart == Self.headerSize { return wal.chain }
        if let cached = plainChainCache, cached.frameStart == frameStart - Int64(frameSize) { return cached.chain }
        var chain = wal.chain
        var position = Self.headerSize
        let headerSize = Self.frameHeaderSize
        while position < frameStart {
            guard rawRead(raw.bytes.baseAddress!, count: frameSize, at: position) == SQLITE_OK else { return nil }
            let pgno = raw.readOnly.bigEndianUInt32(at: 0)
            guard
                cipher.open(
                    UnsafeRawBufferPointer(rebasing: raw.readOnly[headerSize...]), pgno: pgno, into: plain.bytes)
            else { return nil }
            chain = frameChain(
                header: UnsafeRawBufferPointer(rebasing: raw.readOnly[0..<headerSize]), page: plain.readOnly,
                bigEndianWords: wal.bigEndianWords, previous: chain)
            position += Int64(frameSize)
        }
        return chain
    }

    /// The page number in the frame header at `frameStart`, read from disk.
    private func storedPageNumber(frameStart: Int64) -> UInt32? {
        var bytes: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        let rc = withUnsafeMutableBytes(of: &bytes) { rawRead($0.baseAddress!, count: 4, at: frameStart) }
        guard rc == SQLITE_OK else { return nil }
        return UInt32(bytes.0) << 24 | UInt32(bytes.1) << 16 | UInt32(bytes.2) << 8 | UInt32(bytes.3)
    }

    // Anything else SQLite does first writes a held-back header.
    override func sync(_ flags: Int32) -> Int32 {
        let rc = flushPendingHeader()
        return rc == SQLITE_OK ? super.sync(flags) : rc
    }
    override func truncate(_ size: Int64) -> Int32 {
        let rc = flushPendingHeader()
        plainChainCache = nil
        return rc == SQLITE_OK ? super.truncate(size) : rc
    }
    override func fileSize(_ out: UnsafeMutablePointer<sqlite3_int64>) -> Int32 {
        let rc = flushPendingHeader()
        return rc == SQLITE_OK ? super.fileSize(out) : rc
    }
    override func close() -> Int32 {
        _ = flushPendingHeader()
        return super.close()
    }
}
