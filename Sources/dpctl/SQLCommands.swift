import ArgumentParser
import DataProtection
import DataProtectionSQLite
import Foundation
import GRDB

struct SQL: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql",
        abstract: "Run SQL on a database — plain, class-managed, or SQLCipher with a passphrase or key.",
        discussion: """
        Result rows are printed as tab-separated lines (NULL as an empty field), like
        `sqlite3 -separator $'\\t'`. Statements run in autocommit mode; BEGIN/COMMIT work.

        Which database:
          class-managed  DB has a key file (DB-dpkey) next to it, or --class creates one: its key
                         is wrapped by the device keybag under the class (unlock with --passcode-file).
          SQLCipher      --passphrase-file or --raw-key-hex: a database SQLCipher's tools can open.
          plain SQLite   otherwise.

        Examples:
          dpctl sql notes.db --class A --passcode-file pc "CREATE TABLE note(text); INSERT INTO note VALUES ('hi')"
          dpctl sql legacy.db --passphrase-file pw --cipher-compat 3 "SELECT count(*) FROM t"
        """)

    @OptionGroup var device: DeviceOptions

    @Argument(help: "The database file.")
    var database: String

    @Argument(help: "The SQL to run (one or more statements).")
    var sql: String

    @Option(name: .customLong("class"), help: ArgumentHelp("Create a class-managed database in this class (A, B, C or D).", valueName: "class"))
    var protectionClass: ProtectionClass?

    @OptionGroup var unlock: UnlockOptions

    @Option(name: .long, help: ArgumentHelp("SQLCipher: the passphrase is the content of this file.", valueName: "file"))
    var passphraseFile: String?

    @Option(name: .long, help: ArgumentHelp("SQLCipher: a raw key, 64 hex digits (96 with the salt).", valueName: "hex"))
    var rawKeyHex: String?

    @Option(name: .long, help: ArgumentHelp("SQLCipher format version: 3 or 4.", valueName: "n"))
    var cipherCompat: Int = 4

    @Option(name: .long, help: ArgumentHelp("Page size of the encrypted database (default: the format's).", valueName: "bytes"))
    var pageSize: Int?

    func validate() throws {
        let modes = [protectionClass != nil, passphraseFile != nil, rawKeyHex != nil].filter { $0 }.count
        if modes > 1 { throw ValidationError("give at most one of --class, --passphrase-file and --raw-key-hex") }
    }

    func run() async throws {
        var format = try SQLCipherFormat(compatibility: cipherCompat)
        if let pageSize { format = try format.withPageSize(pageSize) }
        let url = URL(fileURLWithPath: database)
        let keyFileExists = FileManager.default.fileExists(atPath: database + "-dpkey")
        if protectionClass != nil || (keyFileExists && passphraseFile == nil && rawKeyHex == nil) {
            let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
            let db = try await ProtectedDatabase.open(at: url, keybag: keybag, protection: protectionClass, mode: .queue, format: format)
            let sql = self.sql
            let lines = try await db.writeWithoutTransaction { db in try Self.execute(sql, in: db) }
            try await db.close()
            for line in lines { printOut(line) }
            return
        }
        device.bootstrapLogging()
        let queue: DatabaseQueue
        if let passphraseFile {
            queue = try DatabaseQueue(path: database, key: .passphrase(Data(try readPasscode(passphraseFile).utf8)), format: format)
        } else if let rawKeyHex {
            queue = try DatabaseQueue(path: database, key: try SQLCipherKey(rawKeyHex: rawKeyHex), format: format)
        } else {
            queue = try DatabaseQueue(path: database)
        }
        do {
            let sql = self.sql
            let lines = try await queue.writeWithoutTransaction { db in try Self.execute(sql, in: db) }
            try queue.close()
            for line in lines { printOut(line) }
        } catch {
            throw DatabaseCipherError.explain(error, in: queue)
        }
    }

    /// Runs every statement and formats result rows as the sqlite3 shell does.
    static func execute(_ sql: String, in db: Database) throws -> [String] {
        var lines: [String] = []
        let statements = try db.allStatements(sql: sql)
        while let statement = try statements.next() {
            for row in try Row.fetchAll(statement) {
                lines.append(row.databaseValues.map(format).joined(separator: "\t"))
            }
        }
        return lines
    }

    static func format(_ value: DatabaseValue) -> String {
        switch value.storage {
        case .null: return ""
        case .int64(let n): return String(n)
        case .double(let d):
            // sqlite3's "%!.15g": 15 significant digits, always a decimal point.
            var text = String(format: "%.15g", d)
            if !text.contains(where: { ".ni".contains($0) }) {
                if let e = text.firstIndex(of: "e") { text.insert(contentsOf: ".0", at: e) } else { text += ".0" }
            }
            return text
        case .string(let s): return s
        case .blob(let data): return String(decoding: data, as: UTF8.self)
        }
    }
}

struct SQLKey: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql-key",
        abstract: "Print the raw key of a class-managed database, for SQLCipher's own tools.",
        discussion: """
        Prints 64 hex digits. Open the database elsewhere with PRAGMA key = "x'<hex>'".
        Refused while the database's class is unavailable (unlock with --passcode-file).

        Example:
          sqlcipher notes.db "PRAGMA key = \\"x'$(dpctl sql-key notes.db --passcode-file pc)'\\"; SELECT * FROM note"
        """)

    @OptionGroup var device: DeviceOptions

    @Argument(help: "The class-managed database.")
    var database: String

    @OptionGroup var unlock: UnlockOptions

    func run() async throws {
        guard FileManager.default.fileExists(atPath: database + "-dpkey") else {
            throw CLIError("\(database) has no key file (\(database)-dpkey): it is not a class-managed database")
        }
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        let db = try await ProtectedDatabase.open(at: URL(fileURLWithPath: database), keybag: keybag, mode: .queue)
        let hex = try await db.rawKeyHex()
        try await db.close()
        printOut(hex)
    }
}
