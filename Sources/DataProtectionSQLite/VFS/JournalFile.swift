import GRDBSQLite

/// The rollback journal, in SQLCipher's layout. SQLite writes each record as three calls — the
/// page number (4 bytes, big-endian), the page image, a 4-byte checksum — and reads them back in
/// the same order. The image is sealed as that page, so the journal holds no plaintext.
///
/// SQLite's record checksum is the journal's random initial value plus every 200th byte of the
/// image. SQLite computes it over the plaintext it sees; SQLCipher stores it over the sealed
/// image. This file converts between the two (the difference of the two samples), so a hot
/// journal left by either is played back correctly by the other, and the stored checksum says
/// nothing about the plaintext. Headers and the super-journal name pass through.
final class JournalFile: DiskFile {
    let context: CipherContext
    private var cipherCache = CachedCipher()
    private var cipher: PageCipher.Session? { cipherCache.current(context) }
    private let pageSize: Int
    private let raw: PageBuffer
    /// The record being written or read: where its image starts and its page number.
    private var pendingImage: (offset: Int64, pgno: UInt32)?
    /// The image just written or read: where its checksum sits, and what to add to the
    /// checksum on the way through.
    private var pendingChecksum: (offset: Int64, delta: UInt32)?

    init(real: UnsafeMutablePointer<sqlite3_file>, context: CipherContext) {
        self.context = context
        self.pageSize = context.format.pageSize
        self.raw = PageBuffer(context.format.pageSize)
        super.init(real: real)
    }

    /// SQLite's `pager_cksum` without the initial value: bytes at pageSize−200, −400, … (> 0).
    static func sample(_ page: UnsafeRawBufferPointer) -> UInt32 {
        var sum: UInt32 = 0
        var i = page.count - 200
        while i > 0 {
            sum &+= UInt32(page[i])
            i -= 200
        }
        return sum
    }

    override func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        guard self.cipher != nil || buffer.count != pageSize else { return SQLITE_IOERR_AUTH }
        if buffer.count == 4, let checksum = pendingChecksum, checksum.offset == offset {
            pendingChecksum = nil
            let stored = (buffer.bigEndianUInt32(at: 0) &+ checksum.delta).bigEndian
            return withUnsafeBytes(of: stored) { rawWrite($0.baseAddress!, count: 4, at: offset) }
        }
        pendingChecksum = nil
        if buffer.count == pageSize, let image = pendingImage, image.offset == offset {
            pendingImage = nil
            guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
            do { try cipher.seal(buffer, pgno: image.pgno, into: raw.bytes) } catch { return SQLITE_IOERR_WRITE }
            let rc = rawWrite(raw.bytes.baseAddress!, count: pageSize, at: offset)
            if rc == SQLITE_OK {
                pendingChecksum = (offset + Int64(pageSize), Self.sample(raw.readOnly) &- Self.sample(buffer))
            }
            return rc
        }
        pendingImage = buffer.count == 4 ? (offset + 4, buffer.bigEndianUInt32(at: 0)) : nil
        return rawWrite(buffer.baseAddress!, count: buffer.count, at: offset)
    }

    override func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 {
        if buffer.count == 4, let checksum = pendingChecksum, checksum.offset == offset {
            pendingChecksum = nil
            let rc = rawRead(buffer.baseAddress!, count: 4, at: offset)
            guard rc == SQLITE_OK else { return rc }
            let value = (UnsafeRawBufferPointer(buffer).bigEndianUInt32(at: 0) &+ checksum.delta).bigEndian
            withUnsafeBytes(of: value) { buffer.copyMemory(from: $0) }
            return rc
        }
        pendingChecksum = nil
        if buffer.count == pageSize, let image = pendingImage, image.offset == offset {
            pendingImage = nil
            guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
            let rc = rawRead(raw.bytes.baseAddress!, count: pageSize, at: offset)
            guard rc == SQLITE_OK else {
                buffer.initializeMemory(as: UInt8.self, repeating: 0)
                return rc
            }
            guard cipher.open(raw.readOnly, pgno: image.pgno, into: buffer) else {
                context.recordFailure("journal image of page \(image.pgno) failed authentication")
                return SQLITE_IOERR_DATA
            }
            pendingChecksum = (
                offset + Int64(pageSize), Self.sample(UnsafeRawBufferPointer(buffer)) &- Self.sample(raw.readOnly)
            )
            return SQLITE_OK
        }
        let rc = rawRead(buffer.baseAddress!, count: buffer.count, at: offset)
        pendingImage =
            (buffer.count == 4 && rc == SQLITE_OK)
            ? (offset + 4, UnsafeRawBufferPointer(buffer).bigEndianUInt32(at: 0)) : nil
        return rc
    }
}
