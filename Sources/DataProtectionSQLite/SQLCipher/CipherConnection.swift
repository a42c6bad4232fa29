import Foundation
import GRDB
import GRDBSQLite

/// Prepares GRDB connections on an encrypted database: derives the page keys once (not per
/// connection — PBKDF2 runs once per open database), registers the cipher context, creates a
/// new database with the format's page size and reserved bytes, and checks the key on every
/// connection GRDB opens.
enum CipherConnection {
    struct Prepared {
        let uri: String
        let configuration: Configuration
        let context: CipherContext

        /// An error of opening the database, in this library's terms.
        func translate(_ error: any Error) -> any Error { DatabaseCipherError.translate(error, context: context) }
    }

    static func prepare(
        path: String, key: SQLCipherKey, format: SQLCipherFormat, configuration: Configuration
    ) throws -> Prepared {
        try CipherVFS.install()
        let absolute = absolutePath(path)
        let salt = try existingSalt(absolute) ?? randomSalt()
        let keys = try key.pageKeys(salt: salt, format: format)
        return try prepare(
            path: absolute, cipher: try PageCipher(format: format, keys: keys), configuration: configuration)
    }

    static func prepare(path absolute: String, cipher: PageCipher, configuration: Configuration) throws -> Prepared {
        try CipherVFS.install()
        let context = CipherContext(path: absolute, format: cipher.format, cipher: cipher)
        CipherContextRegistry.register(context)
        let uri = uri(for: absolute, context: context)
        if !configuration.readonly { try createIfNeeded(uri: uri, context: context) }
        var configuration = configuration
        configuration.prepareDatabase { db in
            // The closure holds the context: it lives as long as the queue or pool does.
            do {
                try db.execute(sql: "PRAGMA temp_store = MEMORY")
                _ = try Int.fetchOne(db, sql: "SELECT count(*) FROM sqlite_master")
            } catch {
                throw DatabaseCipherError.translate(error, context: context)
            }
        }
        return Prepared(uri: uri, configuration: configuration, context: context)
    }

    /// The salt of an existing database: its first 16 bytes (`nil` for a new or empty file).
    static func existingSalt(_ path: String) throws -> [UInt8]? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        let head = try handle.read(upToCount: 16) ?? Data()
        if head.isEmpty { return nil }
        if head.elementsEqual(PageCipher.sqliteMagic) { throw DatabaseCipherError.notEncrypted(path: path) }
        return head.count == 16 ? Array(head) : nil
    }

    static func randomSalt() throws -> [UInt8] {
        var salt = [UInt8](repeating: 0, count: 16)
        try salt.withUnsafeMutableBytes { try PageCipher.fillRandom($0) }
        return salt
    }

    static func absolutePath(_ path: String) -> String {
        let url = URL(fileURLWithPath: path)
        return url.standardizedFileURL.path
    }

    /// `file:` URI naming the cipher VFS and the context (SQLite must accept URIs: Debian's,
    /// Ubuntu's and Fedora's builds do, with `SQLITE_USE_URI`).
    static func uri(for path: String, context: CipherContext) -> String {
        "\(uri(path: path))?vfs=\(CipherVFS.name)&dp-context=\(context.token)"
    }

    /// `file:` URI of a path, without parameters.
    static func uri(path: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~/")
        return "file:" + (path.addingPercentEncoding(withAllowedCharacters: allowed) ?? path)
    }

    /// The context of a database GRDB opened through ``uri(for:context:)``.
    static func context(ofURI uri: String) -> CipherContext? {
        guard let range = uri.range(of: "dp-context=") else { return nil }
        return CipherContextRegistry.lookup(String(uri[range.upperBound...].prefix { $0 != "&" }))
    }

    /// A new (absent or empty) database is created here, before GRDB sees it, with the page
    /// size and the reserved bytes the cipher needs; SQLite then keeps both from the header.
    private static func createIfNeeded(uri: String, context: CipherContext) throws {
        let size = (try? FileManager.default.attributesOfItem(atPath: context.path)[.size] as? Int) ?? 0
        guard size == 0 else { return }
        var connection: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI
        defer { sqlite3_close(connection) }
        guard sqlite3_open_v2(uri, &connection, flags, nil) == SQLITE_OK, let connection else {
            throw DatabaseError(resultCode: .SQLITE_CANTOPEN, message: "cannot create \(context.path)")
        }
        var reserve = Int32(context.format.reserve)
        _ = sqlite3_file_control(connection, "main", SQLITE_FCNTL_RESERVE_BYTES, &reserve)
        let sql = "PRAGMA page_size = \(context.format.pageSize); PRAGMA user_version = 0;"
        guard sqlite3_exec(connection, sql, nil, nil, nil) == SQLITE_OK else {
            let message = String(cString: sqlite3_errmsg(connection))
            throw DatabaseCipherError.translate(
                DatabaseError(resultCode: ResultCode(rawValue: sqlite3_extended_errcode(connection)), message: message),
                context: context)
        }
    }
}

extension DatabaseQueue {
    /// Opens (or creates) an SQLCipher database, like SQLCipher's `PRAGMA key` right after open.
    ///
    /// ```swift
    /// let dbQueue = try DatabaseQueue(path: "/data/app.db", key: .passphrase("secret"))
    /// try dbQueue.write { db in try db.execute(sql: "CREATE TABLE t(x)") }   // plain GRDB from here
    /// ```
    ///
    /// The key is derived once here, not per connection. A wrong key or format throws
    /// ``DatabaseCipherError/wrongKeyOrFormat(path:format:)``.
    public convenience init(
        path: String, key: SQLCipherKey, format: SQLCipherFormat = .sqlcipher4,
        configuration: Configuration = Configuration()
    ) throws {
        let prepared = try CipherConnection.prepare(path: path, key: key, format: format, configuration: configuration)
        do { try self.init(path: prepared.uri, configuration: prepared.configuration) } catch {
            throw prepared.translate(error)
        }
    }
}

extension DatabasePool {
    /// Opens (or creates) an SQLCipher database in WAL mode, with concurrent readers.
    ///
    /// ```swift
    /// let dbPool = try DatabasePool(path: "/data/app.db", key: try SQLCipherKey(rawKeyHex: hex))
    /// let count = try dbPool.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM t") }
    /// ```
    public convenience init(
        path: String, key: SQLCipherKey, format: SQLCipherFormat = .sqlcipher4,
        configuration: Configuration = Configuration()
    ) throws {
        let prepared = try CipherConnection.prepare(path: path, key: key, format: format, configuration: configuration)
        do { try self.init(path: prepared.uri, configuration: prepared.configuration) } catch {
            throw prepared.translate(error)
        }
    }
}
