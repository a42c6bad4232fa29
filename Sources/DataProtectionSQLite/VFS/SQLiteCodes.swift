import GRDBSQLite

// Extended result codes that sqlite3.h defines as expressions, which Swift does not import.
let SQLITE_IOERR_READ: Int32 = SQLITE_IOERR | (1 << 8)
let SQLITE_IOERR_SHORT_READ: Int32 = SQLITE_IOERR | (2 << 8)
let SQLITE_IOERR_WRITE: Int32 = SQLITE_IOERR | (3 << 8)
let SQLITE_IOERR_FSTAT: Int32 = SQLITE_IOERR | (7 << 8)
let SQLITE_IOERR_TRUNCATE: Int32 = SQLITE_IOERR | (6 << 8)
let SQLITE_IOERR_SHMLOCK: Int32 = SQLITE_IOERR | (20 << 8)
let SQLITE_IOERR_SHMMAP: Int32 = SQLITE_IOERR | (21 << 8)
/// "used by VFSes to report an authorization failure": the database's keys were withdrawn.
let SQLITE_IOERR_AUTH: Int32 = SQLITE_IOERR | (28 << 8)
/// "used by VFSes that do checksums to report a mismatch": a page failed authentication.
let SQLITE_IOERR_DATA: Int32 = SQLITE_IOERR | (32 << 8)
