import Crypto
import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

extension ProtectedDatabase {
    /// Encrypts the plain SQLite database at `url` in place as a class-managed database: a new
    /// random key, wrapped by `keybag` under `protection` (or the directory's default class) in
    /// `DB-dpkey`, and the pages rewritten in SQLCipher 4's format. The audit's fix for a plain
    /// database (DP201).
    ///
    /// ```swift
    /// try await ProtectedDatabase.importPlaintext(at: url, keybag: keybag, protection: .complete)
    /// let db = try await ProtectedDatabase.open(at: url, keybag: keybag)
    /// ```
    ///
    /// The encrypted copy is built beside the database and renamed over it; the key file is
    /// written first, so a crash leaves either the plain database (with a key file a new import
    /// replaces) or the encrypted one with its key — never an encrypted database without a key.
    /// Nothing else may have the database open. The old pages may remain in free blocks, journals
    /// and snapshots of the file system, as with any conversion in place.
    ///
    /// - Throws: ``DatabaseCipherError/damaged(path:detail:)`` when `url` is not a plain SQLite
    ///   database; ``ProtectedFileError/unavailable(path:protectionClass:lockState:writing:)``
    ///   when the class is unavailable now.
    public static func importPlaintext(
        at url: URL, keybag: Keybag, protection: ProtectionClass? = nil,
        format: SQLCipherFormat = .sqlcipher4
    ) async throws {
        guard let fd = try? POSIXFile.openRegularFile(url.path) else {
            throw DatabaseCipherError.damaged(path: url.path, detail: "not a regular file")
        }
        let head = (try? POSIXFile.read(fd, count: PageCipher.sqliteMagic.count, at: 0, path: url.path)) ?? []
        try? fd.close()
        guard Data(head).starts(with: PageCipher.sqliteMagic) else {
            throw DatabaseCipherError.damaged(
                path: url.path, detail: "not a plain SQLite database (already encrypted?)")
        }
        let files = ProtectedFileManager(keybag: keybag)
        let protectionClass = protection ?? files.defaultProtection(forNewItemAt: url)
        let key = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        try await files.write(
            Data(DatabaseKeyFile(format: format, key: key).encoded()), to: DatabaseKeyFile.url(for: url),
            protection: protectionClass)
        try SQLCipherMaintenance.replace(url.path) { temporary in
            try SQLCipherMaintenance.copy(
                from: .init(path: url.path, key: nil, format: format),
                to: .init(path: temporary, key: .rawKey(SymmetricKey(data: key), salt: nil), format: format))
        }
    }
}
