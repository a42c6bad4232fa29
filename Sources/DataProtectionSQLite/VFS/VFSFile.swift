import GRDBSQLite
import Synchronization

/// One file the cipher VFS opened: the Swift side of an `sqlite3_file`. SQLite calls a file
/// from one connection at a time, so a file needs no lock of its own.
class VFSFile {
    func close() -> Int32 { SQLITE_OK }
    func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 { SQLITE_IOERR_READ }
    func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 { SQLITE_IOERR_WRITE }
    func truncate(_ size: Int64) -> Int32 { SQLITE_IOERR_TRUNCATE }
    func sync(_ flags: Int32) -> Int32 { SQLITE_OK }
    func fileSize(_ out: UnsafeMutablePointer<sqlite3_int64>) -> Int32 { SQLITE_IOERR_FSTAT }
    func lock(_ level: Int32) -> Int32 { SQLITE_OK }
    func unlock(_ level: Int32) -> Int32 { SQLITE_OK }
    func checkReservedLock(_ out: UnsafeMutablePointer<Int32>) -> Int32 { out.pointee = 0; return SQLITE_OK }
    func fileControl(_ op: Int32, _ argument: UnsafeMutableRawPointer?) -> Int32 { SQLITE_NOTFOUND }
    func sectorSize() -> Int32 { 4096 }
    func deviceCharacteristics() -> Int32 { 0 }
    func shmMap(
        _ region: Int32, _ size: Int32, _ extend: Int32, _ out: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
    ) -> Int32 { SQLITE_IOERR_SHMMAP }
    func shmLock(_ offset: Int32, _ count: Int32, _ flags: Int32) -> Int32 { SQLITE_IOERR_SHMLOCK }
    func shmBarrier() {}
    func shmUnmap(_ delete: Int32) -> Int32 { SQLITE_OK }
}

/// A file of the default VFS, every call passed through. The encrypting files subclass it and
/// replace `read` and `write`.
class DiskFile: VFSFile {
    let real: UnsafeMutablePointer<sqlite3_file>
    private var methods: sqlite3_io_methods { real.pointee.pMethods.pointee }

    init(real: UnsafeMutablePointer<sqlite3_file>) {
        self.real = real
    }

    override func close() -> Int32 {
        let rc = methods.xClose(real)
        real.deallocate()
        return rc
    }

    /// Reads raw (sealed) bytes.
    final func rawRead(_ buffer: UnsafeMutableRawPointer, count: Int, at offset: Int64) -> Int32 {
        methods.xRead(real, buffer, Int32(count), offset)
    }

    /// Writes raw (sealed) bytes.
    final func rawWrite(_ buffer: UnsafeRawPointer, count: Int, at offset: Int64) -> Int32 {
        methods.xWrite(real, buffer, Int32(count), offset)
    }

    override func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int32 {
        rawRead(buffer.baseAddress!, count: buffer.count, at: offset)
    }
    override func write(_ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        rawWrite(buffer.baseAddress!, count: buffer.count, at: offset)
    }
    override func truncate(_ size: Int64) -> Int32 { methods.xTruncate(real, size) }
    override func sync(_ flags: Int32) -> Int32 { methods.xSync(real, flags) }
    override func fileSize(_ out: UnsafeMutablePointer<sqlite3_int64>) -> Int32 { methods.xFileSize(real, out) }
    override func lock(_ level: Int32) -> Int32 { methods.xLock(real, level) }
    override func unlock(_ level: Int32) -> Int32 { methods.xUnlock(real, level) }
    override func checkReservedLock(_ out: UnsafeMutablePointer<Int32>) -> Int32 {
        methods.xCheckReservedLock(real, out)
    }
    override func fileControl(_ op: Int32, _ argument: UnsafeMutableRawPointer?) -> Int32 {
        methods.xFileControl(real, op, argument)
    }
    override func sectorSize() -> Int32 { methods.xSectorSize(real) }
    override func deviceCharacteristics() -> Int32 { methods.xDeviceCharacteristics(real) }
    override func shmMap(
        _ region: Int32, _ size: Int32, _ extend: Int32, _ out: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
    ) -> Int32 {
        guard methods.iVersion >= 2, let map = methods.xShmMap else { return SQLITE_IOERR_SHMMAP }
        return map(real, region, size, extend, out)
    }
    override func shmLock(_ offset: Int32, _ count: Int32, _ flags: Int32) -> Int32 {
        guard methods.iVersion >= 2, let lock = methods.xShmLock else { return SQLITE_IOERR_SHMLOCK }
        return lock(real, offset, count, flags)
    }
    override func shmBarrier() {
        if methods.iVersion >= 2 { methods.xShmBarrier?(real) }
    }
    override func shmUnmap(_ delete: Int32) -> Int32 {
        guard methods.iVersion >= 2, let unmap = methods.xShmUnmap else { return SQLITE_OK }
        return unmap(real, delete)
    }
}

/// A file's copy of its database's cipher, refreshed only when the context's generation moves
/// (a seal or an unseal): the hot path reads one atomic integer.
struct CachedCipher {
    private var generation = -1
    private var cached: PageCipher.Session?

    /// The file's own session of the context's cipher, `nil` while the keys are withdrawn (or
    /// when libcrypto cannot copy its contexts: the file then fails like a sealed one).
    mutating func current(_ context: CipherContext) -> PageCipher.Session? {
        if context.generation.load(ordering: .sequentiallyConsistent) != generation {
            let snapshot = context.snapshot()
            generation = snapshot.generation
            cached = try? snapshot.cipher?.makeSession()
        }
        return cached
    }
}

/// Page-sized scratch memory owned by one file, zeroed when released.
final class PageBuffer {
    let bytes: UnsafeMutableRawBufferPointer
    init(_ size: Int) {
        bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 16)
        bytes.initializeMemory(as: UInt8.self, repeating: 0)
    }
    deinit {
        bytes.initializeMemory(as: UInt8.self, repeating: 0)
        bytes.deallocate()
    }
    var readOnly: UnsafeRawBufferPointer { UnsafeRawBufferPointer(bytes) }
}

extension UnsafeRawBufferPointer {
    var isAllZero: Bool { allSatisfy { $0 == 0 } }
    func bigEndianUInt32(at offset: Int) -> UInt32 {
        UInt32(self[offset]) << 24 | UInt32(self[offset + 1]) << 16 | UInt32(self[offset + 2]) << 8
            | UInt32(self[offset + 3])
    }
}

extension UnsafeRawBufferPointer {
    func littleEndianUInt32(at offset: Int) -> UInt32 {
        UInt32(self[offset]) | UInt32(self[offset + 1]) << 8 | UInt32(self[offset + 2]) << 16 | UInt32(self[offset + 3])
            << 24
    }
}
