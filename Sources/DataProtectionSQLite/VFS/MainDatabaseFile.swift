import GRDBSQLite
import Logging

/// The main database file: page `n` sits at offset `(n − 1) × pageSize`, sealed.
///
/// A page that fails authentication is an error (`SQLITE_IOERR_DATA`), never wrong rows. Page 1
/// is the exception SQLCipher makes too: when it fails (a wrong key, or not an SQLCipher file)
/// SQLite is handed zeros, so it reports "file is not a database".
final class MainDatabaseFile: DiskFile {
    let context: CipherContext
    private var cipherCache = CachedCipher()
    private var cipher: PageCipher.Session? { cipherCache.current(context) }
    private let pageSize: Int
    private let raw: PageBuffer
    private let page: PageBuffer
    /// Whether the last read of page 1 failed authentication.
    private var pageOneFailed = false

    init(real: UnsafeMutablePointer<sqlite3_file>, context: CipherContext) {
        self.context = context
        self.pageSize = context.format.pageSize
        self.raw = PageBuffer(context.format.pageSize)
        self.page = PageBuffer(context.format.pageSize)
        super.init(real: real)
    }

    override func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 {
        guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
        let size = Int64(pageSize)
        if offset % size == 0 && buffer.count == pageSize {
            return readPage(UInt32(offset / size) + 1, into: buffer, cipher)
        }
        // Any other range (SQLite reads the 100-byte header, or bytes 24–39, of page 1): open
        // the pages it covers and copy the slice.
        var result = SQLITE_OK
        var done = 0
        while done < buffer.count {
            let position = offset + Int64(done)
            let inPage = Int(position % size)
            let count = min(pageSize - inPage, buffer.count - done)
            let pgno = UInt32(position / size) + 1
            let rc = readPage(pgno, into: page.bytes, cipher)
            if pgno == 1 && pageOneFailed {
                // SQLite may read more than a page before it knows the page size: all zeros,
                // so it reports "not a database" rather than a later page's error.
                buffer.initializeMemory(as: UInt8.self, repeating: 0)
                return SQLITE_OK
            }
            if rc == SQLITE_IOERR_SHORT_READ { result = rc } else if rc != SQLITE_OK { return rc }
            (buffer.baseAddress! + done).copyMemory(from: page.bytes.baseAddress! + inPage, byteCount: count)
            done += count
        }
        return result
    }

    private func readPage(
        _ pgno: UInt32, into out: UnsafeMutableRawBufferPointer, _ cipher: PageCipher.Session
    ) -> Int32 {
        let rc = rawRead(raw.bytes.baseAddress!, count: pageSize, at: Int64(pgno - 1) * Int64(pageSize))
        if rc == SQLITE_IOERR_SHORT_READ && raw.readOnly.isAllZero {
            out.initializeMemory(as: UInt8.self, repeating: 0)   // past the end: SQLite expects zeros
            return rc
        }
        if rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ { return rc }
        if cipher.open(raw.readOnly, pgno: pgno, into: out) {
            if pgno == 1 { pageOneFailed = false }
            return SQLITE_OK
        }
        out.initializeMemory(as: UInt8.self, repeating: 0)
        if pgno == 1 {
            pageOneFailed = true
            context.recordFailure("page 1 does not authenticate: wrong key or format, or not an SQLCipher database")
            return SQLITE_OK
        }
        context.recordFailure("page \(pgno) failed authentication (changed on disk, or truncated)")
        CipherVFS.logger.info("\(context.path): page \(pgno) failed authentication")
        return SQLITE_IOERR_DATA
    }

    override func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        guard let cipher = self.cipher else { return SQLITE_IOERR_AUTH }
        let size = Int64(pageSize)
        do {
            if offset % size == 0 && buffer.count % pageSize == 0 {
                var done = 0
                while done < buffer.count {
                    let pgno = UInt32((offset + Int64(done)) / size) + 1
                    try cipher.seal(
                        UnsafeRawBufferPointer(rebasing: buffer[done..<done + pageSize]), pgno: pgno, into: raw.bytes)
                    let rc = rawWrite(raw.bytes.baseAddress!, count: pageSize, at: offset + Int64(done))
                    if rc != SQLITE_OK { return rc }
                    done += pageSize
                }
                return SQLITE_OK
            }
            // A write of part of a page: open, patch, seal.
            var done = 0
            while done < buffer.count {
                let position = offset + Int64(done)
                let pgno = UInt32(position / size) + 1
                let inPage = Int(position % size)
                let count = min(pageSize - inPage, buffer.count - done)
                let rc = readPage(pgno, into: page.bytes, cipher)
                if rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ { return rc }
                (page.bytes.baseAddress! + inPage).copyMemory(from: buffer.baseAddress! + done, byteCount: count)
                try cipher.seal(page.readOnly, pgno: pgno, into: raw.bytes)
                let wrc = rawWrite(raw.bytes.baseAddress!, count: pageSize, at: Int64(pgno - 1) * size)
                if wrc != SQLITE_OK { return wrc }
                done += count
            }
            return SQLITE_OK
        } catch {
            return SQLITE_IOERR_WRITE
        }
    }
}
