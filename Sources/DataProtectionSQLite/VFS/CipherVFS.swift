import Foundation
import GRDBSQLite
import Logging

/// The SQLite VFS that encrypts, registered once per process as `"dataprotection-cipher"`.
///
/// It wraps the platform's default VFS (`unix`) and, per file SQLite opens:
/// - **main database**: every page is sealed with ``PageCipher`` on write and authenticated and
///   opened on read; the page number is the offset divided by the page size;
/// - **rollback journal**: page images (recognised by the 4-byte page number written or read just
///   before them) are sealed likewise; the plaintext checksum after each image is masked;
/// - **WAL**: frame payloads are sealed with the page number from the frame header; the frame
///   checksums, which SQLite computes over plaintext, are masked (docs/FORMAT.md §7);
/// - **temporary files** (temp databases, statement journals, sorter spill, VACUUM's copy) never
///   touch the disk: they live in memory and are zeroed when closed;
/// - the super-journal (a list of file names) passes through.
///
/// The io-methods are version 2: SQLite's memory-mapped reads (`xFetch`, version 3) are not
/// offered, so SQLite never reads the file's bytes without going through the cipher.
///
/// A database opened through this VFS must name its ``CipherContext`` with the URI parameter
/// `dp-context`; without one the open fails (`SQLITE_CANTOPEN`), so nothing is ever written
/// unencrypted by mistake.
enum CipherVFS {
    static let name = "dataprotection-cipher"
    static let logger = Logger(label: "dataprotection.sqlite")

    nonisolated(unsafe) private static var base: UnsafeMutablePointer<sqlite3_vfs>!
    nonisolated(unsafe) static var diskMethods: UnsafeMutablePointer<sqlite3_io_methods>!
    nonisolated(unsafe) static var memoryMethods: UnsafeMutablePointer<sqlite3_io_methods>!

    /// Registers the VFS (once); returns whether it is available.
    static func install() throws {
        // GRDB opens databases by name only; the cipher VFS is chosen through a `file:` URI. An
        // SQLite built without URI filenames would create a plain file *named* like the URI.
        guard sqlite3_compileoption_used("USE_URI") == 1 else {
            throw DatabaseCipherError.unsupportedFormat(
                "this SQLite (\(String(cString: sqlite3_libversion()))) was built without SQLITE_USE_URI, which the cipher VFS needs"
            )
        }
        guard installed else {
            throw DatabaseCipherError.unsupportedFormat("this SQLite has no default VFS to build the cipher VFS on")
        }
    }

    private static let installed: Bool = {
        guard let defaultVFS = sqlite3_vfs_find(nil) else { return false }
        base = defaultVFS
        diskMethods = makeMethods(version: 2)
        memoryMethods = makeMethods(version: 1)
        let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
        vfs.initialize(to: defaultVFS.pointee)
        vfs.pointee.iVersion = min(defaultVFS.pointee.iVersion, 3)
        vfs.pointee.pNext = nil
        vfs.pointee.zName = UnsafePointer(strdup(name))
        vfs.pointee.szOsFile = Int32(slotOffset + MemoryLayout<UnsafeMutableRawPointer>.stride)
        vfs.pointee.pAppData = nil
        vfs.pointee.xOpen = { _, zName, file, flags, outFlags in
            CipherVFS.open(zName, file!, flags, outFlags)
        }
        vfs.pointee.xDelete = { _, zName, syncDir in
            CipherVFS.base.pointee.xDelete(CipherVFS.base, zName, syncDir)
        }
        vfs.pointee.xAccess = { _, zName, flags, out in
            CipherVFS.base.pointee.xAccess(CipherVFS.base, zName, flags, out)
        }
        vfs.pointee.xFullPathname = { _, zName, count, out in
            CipherVFS.base.pointee.xFullPathname(CipherVFS.base, zName, count, out)
        }
        return sqlite3_vfs_register(vfs, 0) == SQLITE_OK
    }()

    /// Where the Swift object's pointer sits in SQLite's `sqlite3_file` allocation.
    static let slotOffset = MemoryLayout<sqlite3_file>.stride

    private static let temporaryKinds =
        SQLITE_OPEN_TEMP_DB | SQLITE_OPEN_TEMP_JOURNAL | SQLITE_OPEN_SUBJOURNAL | SQLITE_OPEN_TRANSIENT_DB

    private static func open(
        _ zName: UnsafePointer<CChar>?, _ file: UnsafeMutablePointer<sqlite3_file>, _ flags: Int32,
        _ outFlags: UnsafeMutablePointer<Int32>?
    ) -> Int32 {
        file.pointee.pMethods = nil
        let object: VFSFile
        let methods: UnsafeMutablePointer<sqlite3_io_methods>
        if zName == nil || flags & temporaryKinds != 0 {
            object = MemoryFile()
            methods = memoryMethods
            outFlags?.pointee = flags
        } else {
            var context: CipherContext?
            if flags & SQLITE_OPEN_SUPER_JOURNAL == 0 {
                guard let token = sqlite3_uri_parameter(zName, "dp-context").map({ String(cString: $0) }),
                    let found = CipherContextRegistry.lookup(token)
                else {
                    logger.error("refusing to open \(String(cString: zName!)) without its cipher context")
                    return SQLITE_CANTOPEN
                }
                context = found
            }
            let real = UnsafeMutableRawPointer.allocate(byteCount: Int(base.pointee.szOsFile), alignment: 16)
                .bindMemory(to: sqlite3_file.self, capacity: 1)
            real.pointee.pMethods = nil
            let rc = base.pointee.xOpen(base, zName, real, flags, outFlags)
            guard rc == SQLITE_OK else {
                if real.pointee.pMethods != nil { _ = real.pointee.pMethods.pointee.xClose(real) }
                real.deallocate()
                return rc
            }
            if let context {
                if flags & SQLITE_OPEN_WAL != 0 {
                    object = WALFile(real: real, context: context)
                } else if flags & SQLITE_OPEN_MAIN_JOURNAL != 0 {
                    object = JournalFile(real: real, context: context)
                } else {
                    object = MainDatabaseFile(real: real, context: context)
                }
            } else {
                object = DiskFile(real: real)
            }
            methods = diskMethods
        }
        UnsafeMutableRawPointer(file).advanced(by: slotOffset)
            .storeBytes(of: Unmanaged.passRetained(object).toOpaque(), as: UnsafeMutableRawPointer.self)
        file.pointee.pMethods = UnsafePointer(methods)
        return SQLITE_OK
    }

    @inline(__always)
    static func object(_ file: UnsafeMutablePointer<sqlite3_file>?) -> VFSFile {
        let slot = UnsafeMutableRawPointer(file!).advanced(by: slotOffset).load(as: UnsafeMutableRawPointer.self)
        return Unmanaged<VFSFile>.fromOpaque(slot).takeUnretainedValue()
    }

    private static func makeMethods(version: Int32) -> UnsafeMutablePointer<sqlite3_io_methods> {
        let m = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
        m.initialize(to: sqlite3_io_methods())
        m.pointee.iVersion = version
        m.pointee.xClose = { file in
            let slot = UnsafeMutableRawPointer(file!).advanced(by: CipherVFS.slotOffset).load(
                as: UnsafeMutableRawPointer.self)
            let rc = Unmanaged<VFSFile>.fromOpaque(slot).takeUnretainedValue().close()
            Unmanaged<VFSFile>.fromOpaque(slot).release()
            return rc
        }
        m.pointee.xRead = { file, buffer, amount, offset in
            CipherVFS.object(file).read(UnsafeMutableRawBufferPointer(start: buffer, count: Int(amount)), at: offset)
        }
        m.pointee.xWrite = { file, buffer, amount, offset in
            CipherVFS.object(file).write(UnsafeRawBufferPointer(start: buffer, count: Int(amount)), at: offset)
        }
        m.pointee.xTruncate = { file, size in CipherVFS.object(file).truncate(size) }
        m.pointee.xSync = { file, flags in CipherVFS.object(file).sync(flags) }
        m.pointee.xFileSize = { file, out in CipherVFS.object(file).fileSize(out!) }
        m.pointee.xLock = { file, level in CipherVFS.object(file).lock(level) }
        m.pointee.xUnlock = { file, level in CipherVFS.object(file).unlock(level) }
        m.pointee.xCheckReservedLock = { file, out in CipherVFS.object(file).checkReservedLock(out!) }
        m.pointee.xFileControl = { file, op, arg in CipherVFS.object(file).fileControl(op, arg) }
        m.pointee.xSectorSize = { file in CipherVFS.object(file).sectorSize() }
        m.pointee.xDeviceCharacteristics = { file in CipherVFS.object(file).deviceCharacteristics() }
        if version >= 2 {
            m.pointee.xShmMap = { file, region, size, extend, out in
                CipherVFS.object(file).shmMap(region, size, extend, out)
            }
            m.pointee.xShmLock = { file, offset, n, flags in CipherVFS.object(file).shmLock(offset, n, flags) }
            m.pointee.xShmBarrier = { file in CipherVFS.object(file).shmBarrier() }
            m.pointee.xShmUnmap = { file, delete in CipherVFS.object(file).shmUnmap(delete) }
        }
        return m
    }
}
