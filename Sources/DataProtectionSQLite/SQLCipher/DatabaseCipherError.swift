import Foundation
import GRDB
import GRDBSQLite

/// Errors of encrypted databases. Each names the database and says what to do.
public enum DatabaseCipherError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// Page 1 does not authenticate: the key is wrong, the format (SQLCipher 3 or 4, page size)
    /// is not the file's, the file is not an SQLCipher database, or page 1 was changed.
    case wrongKeyOrFormat(path: String, format: SQLCipherFormat)
    /// A page (of the database, its journal or its WAL) failed authentication: the file was
    /// changed or truncated outside SQLite. No rows from it are returned.
    case damaged(path: String, detail: String)
    /// The file is a plain SQLite database where an encrypted one was expected.
    case notEncrypted(path: String)
    /// The format asked for is not supported.
    case unsupportedFormat(String)
    /// The key given is not a valid SQLCipher key.
    case invalidKey(String)
    /// The key of a class-managed database (its `-dpkey` file) is missing.
    case missingKeyFile(path: String)
    /// The database's keys were withdrawn (its class became unavailable).
    case keysWithdrawn(path: String)
    /// The operation needs exclusive access, but another connection has the database open.
    case busy(path: String, operation: String)
    /// The kernel's random generator failed.
    case randomUnavailable
    /// The system's libcrypto could not set up or run the page cipher (out of memory, or an
    /// OpenSSL without its default provider).
    case cipherFailed(String)

    public var description: String {
        switch self {
        case .wrongKeyOrFormat(let path, let format):
            "\(path): wrong key, or not an encrypted database in \(format) format (check the key, --cipher-compat and --page-size)"
        case .damaged(let path, let detail):
            "\(path): encrypted database damaged: \(detail)"
        case .notEncrypted(let path):
            "\(path): this is a plain SQLite database; open it without a key, or import it"
        case .unsupportedFormat(let what):
            "unsupported cipher setting: \(what)"
        case .invalidKey(let what):
            "invalid key: \(what)"
        case .missingKeyFile(let path):
            "\(path): the database's key file is missing; without it the database cannot be opened"
        case .keysWithdrawn(let path):
            "\(path): the database's keys were withdrawn (its protection class is unavailable); retry after unlocking"
        case .busy(let path, let operation):
            "\(path): cannot \(operation) while another connection uses the database; close it and retry"
        case .randomUnavailable:
            "the system random generator failed"
        case .cipherFailed(let step):
            "the page cipher failed (OpenSSL libcrypto): \(step)"
        }
    }

    public var errorDescription: String? { description }

    /// Explains an error GRDB threw on an encrypted database: a page that failed authentication
    /// becomes ``damaged(path:detail:)`` naming the database and the page, a wrong key
    /// ``wrongKeyOrFormat(path:format:)``, withdrawn keys ``keysWithdrawn(path:)``. Other
    /// errors are returned as they are.
    ///
    /// ```swift
    /// do { try dbQueue.read { … } } catch { throw DatabaseCipherError.explain(error, in: dbQueue) }
    /// ```
    public static func explain(_ error: any Error, in database: any DatabaseReader) -> any Error {
        guard let context = CipherConnection.context(ofURI: database.path) else { return error }
        return translate(error, context: context)
    }

    /// Turns an SQLite error met on the database of `context` into the error that explains it.
    static func translate(_ error: any Error, context: CipherContext) -> any Error {
        guard let error = error as? DatabaseError else { return error }
        let detail = context.takeFailure()
        switch error.extendedResultCode.rawValue {
        case SQLITE_NOTADB:
            return DatabaseCipherError.wrongKeyOrFormat(path: context.path, format: context.format)
        case SQLITE_IOERR_DATA:
            return DatabaseCipherError.damaged(path: context.path, detail: detail ?? "a page failed authentication")
        case SQLITE_IOERR_AUTH:
            return DatabaseCipherError.keysWithdrawn(path: context.path)
        default:
            if error.resultCode == .SQLITE_CORRUPT {
                return DatabaseCipherError.damaged(
                    path: context.path, detail: detail ?? error.message ?? "database disk image is malformed")
            }
            return error
        }
    }
}
