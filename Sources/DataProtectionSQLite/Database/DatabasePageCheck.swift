import Crypto
import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

/// Checks that the pages of a class-managed database authenticate under the key in its key file
/// (`<database>-dpkey`), without decrypting them: for tools that copy a database's ciphertext as
/// it is, such as a backup that stores only the pages that changed. Only a page that
/// authenticates is known to be ciphertext; anything else must be treated as plaintext.
///
/// ```swift
/// if let check = await DatabasePageCheck(forDatabaseAt: url, keybag: keybag) {
///     let pageIsCiphertext = page.withUnsafeBytes { check.authenticates($0, number: 1) }
/// }
/// ```
public final class DatabasePageCheck: Sendable {
    /// The database's page size: every page of the file has this length.
    public let pageSize: Int
    private let session: Mutex<PageCipher.SessionBox>
    /// Page 1's first 16 bytes (the salt the keys were derived with), outside its MAC.
    private let salt: [UInt8]

    /// A check for the database at `url`, or `nil` when there is none to make: no key file beside
    /// it, its class unavailable now (locked), a key record that does not parse, or a page 1 that
    /// does not authenticate under the recorded key (or the previous one, after an interrupted rekey).
    public init?(forDatabaseAt url: URL, keybag: Keybag) async {
        let keyURL = URL(fileURLWithPath: url.path + DatabaseKeyFile.suffix)
        // A key file is a protected file of an 48- or 80-byte record: anything much larger is not one.
        guard let st = POSIXFile.linkStatus(keyURL.path), st.st_mode & S_IFMT == S_IFREG, st.st_size <= 4096,
            let data = try? await ProtectedFileManager(keybag: keybag).contents(of: keyURL),
            let record = try? DatabaseKeyFile.parse(data, path: keyURL.path),
            let fd = try? POSIXFile.openRegularFile(url.path)
        else { return nil }
        defer { try? fd.close() }
        // Every byte of a page but the salt is under its MAC only when the reserve is exactly IV
        // and MAC (SQLCipher 4); SQLCipher 3 pads it with bytes nothing authenticates.
        guard record.format.reserve == 16 + record.format.macSize else { return nil }
        let pageSize = record.format.pageSize
        guard let page = try? POSIXFile.read(fd, count: pageSize, at: 0, path: url.path), page.count == pageSize else {
            return nil
        }
        let salt = Array(page[0..<16])
        for key in [record.key] + (record.previousKey.map { [$0] } ?? []) {
            guard
                let keys = try? SQLCipherKey.rawKey(SymmetricKey(data: key), salt: nil).pageKeys(
                    salt: salt, format: record.format),
                let session = try? PageCipher(format: record.format, keys: keys).makeSession()
            else { continue }
            if page.withUnsafeBytes({ session.authenticates($0, pgno: 1) }) {
                self.pageSize = pageSize
                self.salt = salt
                self.session = Mutex(PageCipher.SessionBox(session))
                return
            }
        }
        return nil
    }

    /// Whether `page` (``pageSize`` bytes) authenticates as page `number` (1-based) of the database.
    public func authenticates(_ page: UnsafeRawBufferPointer, number: Int) -> Bool {
        guard (1...Int(UInt32.max)).contains(number) else { return false }
        // SQLite never writes the page holding the byte at offset 2^30 (its lock byte): in a
        // database that big it is a hole of zeros, which carries nothing. Anything else there fails.
        if number == 1 << 30 / pageSize + 1 { return page.count == pageSize && page.allSatisfy { $0 == 0 } }
        // The salt is not under page 1's MAC: it must be the one the keys were made with.
        if number == 1, !(page.count >= 16 && page.prefix(16).elementsEqual(salt)) { return false }
        return session.withLock { $0.session.authenticates(page, pgno: UInt32(number)) }
    }
}

extension PageCipher {
    /// A session moved into a lock (its OpenSSL contexts are used by one thread at a time).
    /// `@unchecked Sendable`: it lives inside a lock: its session's OpenSSL contexts are used by one thread at a time.
    struct SessionBox: @unchecked Sendable {
        let session: Session
        init(_ session: Session) { self.session = session }
    }
}
