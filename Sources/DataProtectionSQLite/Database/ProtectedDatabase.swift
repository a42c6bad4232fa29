import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import GRDB
import Synchronization
import SystemPackage

/// An encrypted database under a protection class, like a CoreData store in an iOS app's
/// container: its random 256-bit key is wrapped by the device keybag, and it follows the lock.
///
/// ```swift
/// let db = try await ProtectedDatabase.open(at: url, keybag: keybag, protection: .complete)
/// try await db.write { db in try db.execute(sql: "CREATE TABLE note(id INTEGER PRIMARY KEY, text TEXT)") }
/// let notes = try await db.read { db in try String.fetchAll(db, sql: "SELECT text FROM note") }
/// ```
///
/// - **A** (`complete`): when the grace period after a lock ends, the keys are withdrawn from
///   every connection, the page cache is dropped and reader connections are closed; calls fail
///   with ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` — the error
///   protected files give. After the next unlock the same object works again.
/// - **B** (`completeUnlessOpen`): a database opened while unlocked stays usable while locked;
///   opening one while locked fails.
/// - **C**, **D**: usable from the first unlock on (C) or always (D).
///
/// The file is a standard SQLCipher 4 database in raw-key mode: ``rawKeyHex()`` gives the key
/// for SQLCipher's own tools. ``writer`` is the plain GRDB `DatabaseQueue` or `DatabasePool`.
public final class ProtectedDatabase: Sendable {
    /// How connections are organised: one serial connection, or WAL with concurrent readers.
    public enum Mode: Sendable { case queue, pool }

    /// The database file.
    public let url: URL
    /// The keybag that wraps the database key.
    public let keybag: Keybag
    /// The database's page format.
    public let format: SQLCipherFormat

    private struct State {
        var writer: (any DatabaseWriter)?
        /// The page cipher's state; `nil` for a database the protected file system serves.
        var context: CipherContext?
        var protectionClass: ProtectionClass
        var observers: (event: UUID, discard: UUID)?
    }
    private let state: Mutex<State>
    private let mode: Mode
    private let configuration: Configuration
    private var context: CipherContext? { state.withLock { $0.context } }
    private var files: ProtectedFileManager {
        var files = ProtectedFileManager(keybag: keybag)
        files.servedByFileSystem = isServedByFileSystem
        return files
    }
    /// Whether the protected file system serves the database (inside an app): SQLite then reads
    /// and writes plaintext pages through it, which seals them; the database has no key of its own.
    public var isServedByFileSystem: Bool { context == nil }

    private init(
        url: URL, keybag: Keybag, format: SQLCipherFormat, protectionClass: ProtectionClass, context: CipherContext?,
        mode: Mode, configuration: Configuration
    ) {
        self.url = url
        self.keybag = keybag
        self.format = format
        self.mode = mode
        self.configuration = configuration
        self.state = Mutex(State(context: context, protectionClass: protectionClass))
    }

    /// Opens the database at `url`, creating it (and its key, wrapped under `protection` or the
    /// directory's default class) when absent.
    ///
    /// - Throws: ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` when
    ///   the class is unavailable now; ``DatabaseCipherError`` for a missing key file or damage.
    public static func open(
        at url: URL, keybag: Keybag, protection: ProtectionClass? = nil, mode: Mode = .pool,
        format: SQLCipherFormat = .sqlcipher4, configuration: Configuration = Configuration()
    ) async throws -> ProtectedDatabase {
        if ProtectedFileManager.isServedByProtectedFileSystem(url.deletingLastPathComponent().path) {
            return try await openServed(
                at: url, keybag: keybag, protection: protection, mode: mode, format: format,
                configuration: configuration)
        }
        let files = ProtectedFileManager(keybag: keybag)
        let keyURL = DatabaseKeyFile.url(for: url)
        let databaseExists = ((try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int) ?? 0) > 0
        let keyExists = FileManager.default.fileExists(atPath: keyURL.path)
        let record: DatabaseKeyFile
        let protectionClass: ProtectionClass
        if keyExists {
            let data: Data
            do {
                data = try await files.contents(of: keyURL)
            } catch ProtectedFileError.unavailable(_, let cls, let lockState, let writing) {
                throw ProtectedFileError.unavailable(
                    path: url.path, protectionClass: cls, lockState: lockState, writing: writing)
            }
            record = try DatabaseKeyFile.parse(data, path: keyURL.path)
            guard case .protected(let cls) = try files.protection(ofItemAt: keyURL) else {
                throw DatabaseCipherError.damaged(path: keyURL.path, detail: "the key file is not protected")
            }
            protectionClass = cls
        } else {
            guard !databaseExists else { throw DatabaseCipherError.missingKeyFile(path: url.path) }
            protectionClass = protection ?? files.defaultProtection(forNewItemAt: url)
            record = DatabaseKeyFile(format: format, key: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
            try await files.write(Data(record.encoded()), to: keyURL, protection: protectionClass)
        }
        let (cipher, settled) = try Self.cipher(for: record, databasePath: url.path)
        if settled != record { try await files.write(Data(settled.encoded()), to: keyURL, protection: protectionClass) }
        let (writer, context) = try connect(path: url.path, cipher: cipher, mode: mode, configuration: configuration)
        let database = ProtectedDatabase(
            url: url, keybag: keybag, format: record.format, protectionClass: protectionClass,
            context: context, mode: mode, configuration: configuration)
        database.state.withLock { $0.writer = writer }
        await database.observeKeybag()
        return database
    }

    private static func connect(
        path: String, cipher: PageCipher, mode: Mode, configuration: Configuration
    ) throws -> (any DatabaseWriter, CipherContext) {
        let prepared = try CipherConnection.prepare(path: path, cipher: cipher, configuration: configuration)
        do {
            let writer: any DatabaseWriter =
                switch mode {
                case .queue: try DatabaseQueue(path: prepared.uri, configuration: prepared.configuration)
                case .pool: try DatabasePool(path: prepared.uri, configuration: prepared.configuration)
                }
            return (writer, prepared.context)
        } catch {
            throw ownKeyFailed(prepared.translate(error))
        }
    }

    /// The key and format come from the database's own authenticated key file, so page 1 that
    /// does not open is damage (exit 4 in dpctl), not a wrong key the user could correct.
    private static func ownKeyFailed(_ error: any Error) -> any Error {
        guard case DatabaseCipherError.wrongKeyOrFormat(let path, _) = error else { return error }
        return DatabaseCipherError.damaged(
            path: path, detail: "page 1 does not authenticate under the key in the database's key file")
    }

    /// The page cipher for a key record, and the record to keep: when a rekey was interrupted
    /// (a previous key is recorded), page 1 tells which key the file is under.
    private static func cipher(
        for record: DatabaseKeyFile, databasePath: String
    ) throws -> (PageCipher, DatabaseKeyFile) {
        let salt = try CipherConnection.existingSalt(databasePath)
        func make(_ key: [UInt8]) throws -> PageCipher {
            let keys = try SQLCipherKey.rawKey(SymmetricKey(data: key), salt: nil)
                .pageKeys(salt: salt ?? CipherConnection.randomSalt(), format: record.format)
            return try PageCipher(format: record.format, keys: keys)
        }
        let current = try make(record.key)
        guard let previous = record.previousKey, salt != nil else { return (current, record) }
        if try pageOneOpens(databasePath, with: current) {
            return (current, DatabaseKeyFile(format: record.format, key: record.key))
        }
        return (try make(previous), DatabaseKeyFile(format: record.format, key: previous))
    }

    private static func pageOneOpens(_ path: String, with cipher: PageCipher) throws -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        let page = try handle.read(upToCount: cipher.pageSize) ?? Data()
        let out = UnsafeMutableRawBufferPointer.allocate(byteCount: cipher.pageSize, alignment: 16)
        defer { out.deallocate() }
        let session = try cipher.makeSession()
        return page.withUnsafeBytes { session.open($0, pgno: 1, into: out) }
    }

    // MARK: - Lock state

    private func observeKeybag() async {
        let events = await keybag.addObserver { [weak self] event in
            guard event == .didBecomeAvailable, let self else { return }
            Task { try? await self.restoreKeys() }
        }
        let discards = await keybag.addDiscardObserver { [weak self] discarded in
            guard let self, discarded == self.protectionClass, discarded != .completeUnlessOpen else { return }
            self.withdrawKeys()
        }
        state.withLock { $0.observers = (events, discards) }
    }

    /// Withdraws the keys from every connection, drops the pages SQLite cached and closes the
    /// reader connections — before the keybag goes on, so no query is answered from a cache
    /// once the class is gone. (It waits for a transaction in progress to end.)
    private func withdrawKeys() {
        guard let context else { return }
        context.seal()
        guard let writer = state.withLock({ $0.writer }) else { return }
        if let pool = writer as? DatabasePool { pool.releaseMemory() }
        if let queue = writer as? DatabaseQueue { queue.releaseMemory() }
    }

    /// Unwraps the key again (after an unlock) and gives it back to the connections.
    private func restoreKeys() async throws {
        guard let context, context.isSealed else { return }
        let record = try DatabaseKeyFile.parse(
            try await files.contents(of: DatabaseKeyFile.url(for: url)),
            path: DatabaseKeyFile.url(for: url).path)
        context.unseal(try Self.cipher(for: record, databasePath: url.path).0)
    }

    /// Whether the database can be used now.
    public var isAvailable: Bool { !(context?.isSealed ?? false) }

    /// The database's protection class.
    public var protectionClass: ProtectionClass { state.withLock { $0.protectionClass } }

    // MARK: - Access

    /// The GRDB `DatabaseQueue` or `DatabasePool`, for everything GRDB offers (observation,
    /// migrations, records). While the class is unavailable its calls fail with SQLite's
    /// `SQLITE_IOERR_AUTH`; ``read(_:)`` and ``write(_:)`` give the typed error instead.
    public var writer: any DatabaseWriter {
        get throws {
            guard let writer = state.withLock({ $0.writer }) else { throw ProtectedFileError.closed(path: url.path) }
            return writer
        }
    }

    /// Reads in a snapshot, like GRDB's `read`.
    public func read<T: Sendable>(_ value: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let writer = try await available(writing: false)
        do { return try await writer.read(value) } catch { throw await explainWithLockState(error, writing: false) }
    }

    /// Writes in a transaction, like GRDB's `write`.
    public func write<T: Sendable>(_ updates: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let writer = try await available(writing: true)
        do { return try await writer.write(updates) } catch { throw await explainWithLockState(error, writing: true) }
    }

    /// Writes outside of a transaction (for `VACUUM`, pragmas …), like GRDB's `writeWithoutTransaction`.
    public func writeWithoutTransaction<T: Sendable>(
        _ updates: @escaping @Sendable (Database) throws -> T
    ) async throws -> T {
        let writer = try await available(writing: true)
        do { return try await writer.writeWithoutTransaction(updates) } catch {
            throw await explainWithLockState(error, writing: true)
        }
    }

    /// Returns once the database can be used: after an unlock, its keys come back by themselves
    /// as the unlock event is delivered; this waits for that (or throws the typed
    /// ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` while the
    /// class is still unavailable). For code that uses ``writer`` synchronously.
    public func restoreAccess() async throws {
        _ = try await available(writing: false)
    }

    private func available(writing: Bool) async throws -> any DatabaseWriter {
        let writer = try self.writer
        if context?.isSealed == true {
            do {
                try await restoreKeys()
            } catch ProtectedFileError.unavailable(_, let cls, let lockState, _) {
                throw ProtectedFileError.unavailable(
                    path: url.path, protectionClass: cls, lockState: lockState, writing: writing)
            }
        }
        return writer
    }

    /// Explains an error thrown by a call on ``writer`` (for synchronous code): a page that
    /// failed authentication becomes ``DatabaseCipherError``, withdrawn keys the typed
    /// ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)`` that
    /// protected files give while locked.
    ///
    /// ```swift
    /// do { try db.writer.read { … } } catch { throw db.explain(error, writing: false) }
    /// ```
    public func explain(_ error: any Error, writing: Bool) -> any Error {
        guard let context else { return error }   // served: the file system's errors, explained with the lock state
        let translated = Self.ownKeyFailed(DatabaseCipherError.translate(error, context: context))
        if case DatabaseCipherError.keysWithdrawn = translated {
            // Keys are withdrawn only when the class's key was discarded: the device is locked.
            return ProtectedFileError.unavailable(
                path: url.path, protectionClass: protectionClass, lockState: .locked, writing: writing)
        }
        return translated
    }

    /// ``explain(_:writing:)`` with the lock state asked of the keybag.
    private func explainWithLockState(_ error: any Error, writing: Bool) async -> any Error {
        // Served: the file system refuses a locked class (EACCES); SQLite says "I/O error".
        if isServedByFileSystem, protectionClass != .noProtection,
            (try? await keybag.generation(of: protectionClass)) == nil
        {
            return ProtectedFileError.unavailable(
                path: url.path, protectionClass: protectionClass, lockState: await keybag.lockState, writing: writing)
        }
        let explained = explain(error, writing: writing)
        if case ProtectedFileError.unavailable(let path, let cls, _, let writing) = explained {
            return ProtectedFileError.unavailable(
                path: path, protectionClass: cls, lockState: await keybag.lockState, writing: writing)
        }
        return explained
    }

    // MARK: - Keys and class

    /// The raw key as 64 hex digits, for SQLCipher's tools (`PRAGMA key = "x'…'"`). Refused
    /// (``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``) while the
    /// class is unavailable.
    public func rawKeyHex() async throws -> String {
        try refuseServed("its raw key")
        let record = try DatabaseKeyFile.parse(
            try await files.contents(of: DatabaseKeyFile.url(for: url)),
            path: DatabaseKeyFile.url(for: url).path)
        return SQLCipherKey.hex(record.key)
    }

    /// Re-encrypts the database under a new random key (and salt), also in WAL mode.
    ///
    /// The new file is written beside the old one and renamed over it; the key file records the
    /// old key until the rename is done, so a crash at any point leaves a database that opens.
    /// Connections are closed and reopened: take ``writer`` again afterwards. Other processes
    /// must not have the database open.
    public func rekey() async throws {
        try refuseServed("rekeying")
        let keyURL = DatabaseKeyFile.url(for: url)
        let protectionClass = self.protectionClass
        let old = try DatabaseKeyFile.parse(try await files.contents(of: keyURL), path: keyURL.path)
        let newKey = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        let writer = try self.writer
        _ = try await writer.writeWithoutTransaction { db in
            try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
        try await files.write(
            Data(DatabaseKeyFile(format: old.format, key: newKey, previousKey: old.key).encoded()),
            to: keyURL, protection: protectionClass)
        try writer.close()
        let cipher = try Self.cipher(for: old, databasePath: url.path).0
        do {
            try SQLCipherMaintenance.replace(url.path) { temporary in
                try SQLCipherMaintenance.copy(
                    from: .init(path: url.path, key: nil, format: old.format, cipher: cipher),
                    to: .init(path: temporary, key: .rawKey(SymmetricKey(data: newKey), salt: nil), format: old.format))
            }
        } catch {
            // Nothing was replaced: keep the old key and reopen.
            try await files.write(Data(old.encoded()), to: keyURL, protection: protectionClass)
            let (reopened, context) = try Self.connect(
                path: url.path, cipher: cipher, mode: mode, configuration: configuration)
            state.withLock {
                $0.writer = reopened; $0.context = context
            }
            throw error
        }
        let record = DatabaseKeyFile(format: old.format, key: newKey)
        try await files.write(Data(record.encoded()), to: keyURL, protection: protectionClass)
        let (reopened, context) = try Self.connect(
            path: url.path, cipher: try Self.cipher(for: record, databasePath: url.path).0,
            mode: mode, configuration: configuration)
        state.withLock {
            $0.writer = reopened; $0.context = context
        }
    }

    /// Changes the class: the key is rewrapped, the database is not re-encrypted.
    public func setProtection(_ protectionClass: ProtectionClass) async throws {
        if isServedByFileSystem {
            // The file system rewraps each file's key: the database and its WAL files.
            for path in [url.path] + Self.sidecars(of: url.path) where FileManager.default.fileExists(atPath: path) {
                try await files.setProtection(
                    Self.sidecarClass(path, protectionClass), ofItemAt: URL(fileURLWithPath: path))
            }
            state.withLock { $0.protectionClass = protectionClass }
            return
        }
        try await files.setProtection(protectionClass, ofItemAt: DatabaseKeyFile.url(for: url))
        state.withLock { $0.protectionClass = protectionClass }
    }

    /// Closes every connection and stops following the lock. Closing twice does nothing.
    public func close() async throws {
        let (writer, observers) = state.withLock { state in
            defer { state.writer = nil; state.observers = nil }
            return (state.writer, state.observers)
        }
        if let observers {
            await keybag.removeObserver(observers.event)
            await keybag.removeDiscardObserver(observers.discard)
        }
        try writer?.close()
    }

    // MARK: - On the protected file system

    /// The files SQLite keeps beside a database in WAL mode.
    static func sidecars(of path: String) -> [String] { [path + "-wal", path + "-shm"] }

    /// The class of the database's file at `path` for a database of `cls`: its own, but the WAL
    /// index (`-shm`) never class A (``ProtectionClass/walIndexClass``).
    static func sidecarClass(_ path: String, _ cls: ProtectionClass) -> ProtectionClass {
        path.hasSuffix("-shm") ? cls.walIndexClass : cls
    }

    /// A database inside an app whose containers the protected file system serves: plain SQLite
    /// pages through it (it seals them in the file's segments: never encrypted twice), in WAL
    /// mode, the database and its WAL files of at least the class asked for (and of the
    /// database's own, when it exists and is stronger) before SQLite opens them — made so, or
    /// raised when they exist with a weaker one (made before by another member of a group, or
    /// another program); never lowered. A WAL file that is a link or not a regular file is refused.
    /// No key file, no key.
    private static func openServed(
        at url: URL, keybag: Keybag, protection: ProtectionClass?, mode: Mode, format: SQLCipherFormat,
        configuration: Configuration
    ) async throws -> ProtectedDatabase {
        var files = ProtectedFileManager(keybag: keybag)
        files.servedByFileSystem = true
        let existing = try? files.protection(ofItemAt: url)
        let asked = protection ?? existing?.fileClass ?? files.defaultProtection(forNewItemAt: url)
        let protectionClass = max(asked, existing?.fileClass ?? asked)
        for path in [url.path] + sidecars(of: url.path) {
            let file = URL(fileURLWithPath: path)
            var st = stat()
            if lstat(path, &st) != 0 {
                guard errno == ENOENT else {
                    throw ProtectedFileError.fileSystem(
                        FileSystemError("lstat", path: path, errno: Errno(rawValue: errno)))
                }
                let handle = try await files.createFile(at: file, protection: sidecarClass(path, protectionClass))
                try await handle.close()
                continue
            }
            // Planted by another member of a group: a link (its target would be rewrapped, and
            // SQLite's pages go wherever it leads) or something SQLite cannot use as its file.
            guard st.st_mode & S_IFMT == S_IFREG else {
                throw ProtectedFileError.notARegularFile(
                    path: path, kind: st.st_mode & S_IFMT == S_IFLNK ? "symbolic link" : "special file")
            }
            if let current = try files.protection(ofItemAt: file).fileClass,
                current < sidecarClass(path, protectionClass)
            {
                // The file system rewraps its key.
                try await files.setProtection(sidecarClass(path, protectionClass), ofItemAt: file)
            }
        }
        var configuration = configuration
        configuration.prepareDatabase { db in   // after the caller's own (GRDB runs them in order)
            // a rollback journal would be made anew, at the directory's class
            try db.execute(sql: "PRAGMA journal_mode = WAL")
        }
        let writer: any DatabaseWriter
        do {
            writer =
                switch mode {
                case .queue: try DatabaseQueue(path: url.path, configuration: configuration)
                case .pool: try DatabasePool(path: url.path, configuration: configuration)
                }
        } catch {
            if protectionClass != .noProtection, (try? await keybag.generation(of: protectionClass)) == nil {
                throw ProtectedFileError.unavailable(
                    path: url.path, protectionClass: protectionClass, lockState: await keybag.lockState, writing: false)
            }
            throw error
        }
        let database = ProtectedDatabase(
            url: url, keybag: keybag, format: format, protectionClass: protectionClass,
            context: nil, mode: mode, configuration: configuration)
        database.state.withLock { $0.writer = writer }
        return database
    }

    private func refuseServed(_ what: String) throws {
        guard isServedByFileSystem else { return }
        throw ProtectedFileError.fileSystem(FileSystemError(what, path: url.path, errno: .notSupported))
    }
}
