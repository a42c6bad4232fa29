import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import GRDB
import GRDBSQLite
import SystemPackage

/// Whole-database operations on a *closed* database — rekey, SQLCipher 3 → 4 migration,
/// export to and import from plain SQLite — each an explicit call, like SQLCipher's
/// `sqlcipher_export`.
///
/// Every one writes a complete new file next to the original with SQLite's `VACUUM INTO`
/// (through the cipher VFS, so no plaintext page touches the disk unless a plaintext export was
/// asked for), checks that it opens with its key, syncs it, and only then renames it over the
/// target. A crash leaves the old database or the new one, never a mix; the WAL is checkpointed
/// first, so WAL-mode databases are handled too.
///
/// ```swift
/// try SQLCipherMaintenance.rekey(atPath: path, from: .passphrase("old"), to: .passphrase("new"))
/// try SQLCipherMaintenance.migrate(atPath: path, key: key)               // SQLCipher 3 → 4
/// try SQLCipherMaintenance.exportPlaintext(atPath: path, key: key, to: plainPath)
/// ```
public enum SQLCipherMaintenance {
    /// One side of a copy: a path and, for an encrypted database, its key and format.
    struct Side {
        var path: String
        var key: SQLCipherKey?
        var format: SQLCipherFormat
        /// Keys already derived (class-managed databases), instead of `key`.
        var cipher: PageCipher?
    }

    /// Re-encrypts a database under a new key (also a new salt), in place. The format is kept.
    public static func rekey(
        atPath path: String, from oldKey: SQLCipherKey, to newKey: SQLCipherKey,
        format: SQLCipherFormat = .sqlcipher4
    ) throws {
        try replace(path) { temporary in
            try copy(
                from: Side(path: path, key: oldKey, format: format),
                to: Side(path: temporary, key: newKey, format: format))
        }
    }

    /// Rewrites an SQLCipher 3 database in the SQLCipher 4 format (4096-byte pages, HMAC-SHA512),
    /// like `PRAGMA cipher_migrate`. A passphrase is re-derived with SQLCipher 4's KDF.
    public static func migrate(
        atPath path: String, key: SQLCipherKey, from old: SQLCipherFormat = .sqlcipher3,
        to new: SQLCipherFormat = .sqlcipher4
    ) throws {
        try replace(path) { temporary in
            try copy(from: Side(path: path, key: key, format: old), to: Side(path: temporary, key: key, format: new))
        }
    }

    /// Writes a plain (unencrypted) SQLite copy of an encrypted database to `plainPath`.
    public static func exportPlaintext(
        atPath path: String, key: SQLCipherKey, format: SQLCipherFormat = .sqlcipher4,
        to plainPath: String
    ) throws {
        try replace(plainPath) { temporary in
            try copy(
                from: Side(path: path, key: key, format: format), to: Side(path: temporary, key: nil, format: format))
        }
    }

    /// Writes an encrypted copy of the plain SQLite database at `plainPath` to `path`.
    public static func importPlaintext(
        from plainPath: String, toPath path: String, key: SQLCipherKey,
        format: SQLCipherFormat = .sqlcipher4
    ) throws {
        try replace(path) { temporary in
            try copy(
                from: Side(path: plainPath, key: nil, format: format),
                to: Side(path: temporary, key: key, format: format))
        }
    }

    // MARK: - Implementation

    /// Builds the new file at a temporary sibling, syncs it, renames it over `path`, and removes
    /// the old file's WAL and shared-memory files.
    static func replace(_ path: String, _ build: (String) throws -> Void) throws {
        let absolute = CipherConnection.absolutePath(path)
        let temporary = absolute + ".dp-new-\(UUID().uuidString.prefix(8))"
        do {
            try build(temporary)
            let fd = try POSIXFile.open(temporary, .readOnly)
            defer { try? fd.close() }
            try POSIXFile.sync(fd, path: temporary)
            guard rename(temporary, absolute) == 0 else {
                throw DatabaseError(
                    resultCode: .SQLITE_CANTOPEN,
                    message: "rename over \(absolute): \(String(cString: strerror(errno)))")
            }
            for suffix in ["-wal", "-shm", "-journal"] { unlink(absolute + suffix) }
            try? POSIXFile.syncDirectory((absolute as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(temporary + suffix) }
            throw error
        }
    }

    /// Copies `source` into the new file `target` with `VACUUM INTO`.
    static func copy(from source: Side, to target: Side) throws {
        let sourceConnection = try Connection(side: source, creating: false)
        let targetURI: String
        var targetContext: CipherContext?
        if target.key != nil || target.cipher != nil {
            let prepared = try prepareContext(target)
            targetContext = prepared
            targetURI = CipherConnection.uri(for: target.path, context: prepared)
        } else {
            targetURI = plainURI(target.path)
        }
        // The copy gets the target's page size and (at least) its reserved bytes.
        try sourceConnection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try sourceConnection.execute("PRAGMA page_size = \(target.format.pageSize)")
        var reserve = Int32(targetContext == nil ? 0 : target.format.reserve)
        _ = sqlite3_file_control(sourceConnection.handle, "main", SQLITE_FCNTL_RESERVE_BYTES, &reserve)
        try sourceConnection.execute("VACUUM INTO '\(targetURI.replacingOccurrences(of: "'", with: "''"))'")
        sourceConnection.close()
        // The new file must open with its key before it replaces anything.
        let check = try Connection(
            side: Side(
                path: target.path, key: target.key, format: target.format,
                cipher: targetContext?.cipher), creating: false)
        let verdict = try check.scalar("PRAGMA quick_check")
        check.close()
        guard verdict == "ok" else {
            throw DatabaseCipherError.damaged(
                path: target.path, detail: "the new copy failed its check: \(verdict ?? "?")")
        }
        withExtendedLifetime(targetContext) {}
    }

    /// A URI naming the platform's own VFS, so an attached plain file never goes through ours.
    static func plainURI(_ path: String) -> String {
        let vfs = sqlite3_vfs_find(nil).map { String(cString: $0.pointee.zName) } ?? "unix"
        return CipherConnection.uri(path: path) + "?vfs=\(vfs)"
    }

    private static func prepareContext(_ side: Side) throws -> CipherContext {
        try CipherVFS.install()
        let cipher: PageCipher
        if let given = side.cipher {
            cipher = given
        } else {
            let salt = try CipherConnection.existingSalt(side.path) ?? CipherConnection.randomSalt()
            cipher = try PageCipher(format: side.format, keys: try side.key!.pageKeys(salt: salt, format: side.format))
        }
        let context = CipherContext(path: side.path, format: side.format, cipher: cipher)
        CipherContextRegistry.register(context)
        return context
    }

    /// A bare SQLite connection (no GRDB) for maintenance.
    final class Connection {
        let handle: OpaquePointer
        let context: CipherContext?
        let path: String

        init(side: Side, creating: Bool) throws {
            path = side.path
            var uri = plainURI(side.path)
            if side.key != nil || side.cipher != nil {
                let context = try prepareContext(side)
                self.context = context
                uri = CipherConnection.uri(for: side.path, context: context)
            } else {
                context = nil
            }
            var connection: OpaquePointer?
            let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI | (creating ? SQLITE_OPEN_CREATE : 0)
            guard sqlite3_open_v2(uri, &connection, flags, nil) == SQLITE_OK, let connection else {
                sqlite3_close(connection)
                throw DatabaseError(resultCode: .SQLITE_CANTOPEN, message: "cannot open \(side.path)")
            }
            handle = connection
            _ = try scalar("SELECT count(*) FROM sqlite_master")
        }

        func execute(_ sql: String) throws {
            guard sqlite3_exec(handle, sql, nil, nil, nil) == SQLITE_OK else { throw currentError() }
        }

        func scalar(_ sql: String) throws -> String? {
            var statement: OpaquePointer?
            guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else { throw currentError() }
            defer { sqlite3_finalize(statement) }
            let rc = sqlite3_step(statement)
            if rc == SQLITE_ROW { return sqlite3_column_text(statement, 0).map { String(cString: $0) } }
            if rc == SQLITE_DONE { return nil }
            throw currentError()
        }

        private func currentError() -> any Error {
            let error = DatabaseError(
                resultCode: ResultCode(rawValue: sqlite3_extended_errcode(handle)),
                message: String(cString: sqlite3_errmsg(handle)))
            guard let context else { return error }
            return DatabaseCipherError.translate(error, context: context)
        }

        private var isOpen = true

        func close() {
            if isOpen { sqlite3_close_v2(handle) }
            isOpen = false
        }
        deinit { close() }
    }
}
