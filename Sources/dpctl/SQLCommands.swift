import ArgumentParser
import DataProtection
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import GRDB
import SystemPackage

struct SQL: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql",
        abstract: "Run SQL (plain, class-managed or SQLCipher databases).",
        discussion: """
            Without SQL on the command line, the SQL is read from --read FILE or from standard \
            input (dpctl sql notes.db < schema.sql). Statements run in autocommit mode; \
            BEGIN and COMMIT work. sqlite3's dot-commands (.tables, .schema) are not taken.

            Output, as the sqlite3 shell's modes (one dash or two): --list (the default: fields \
            separated by a tab, with tab, newline, CR and backslash escaped as \\t \\n \\r \\\\), \
            --csv, --json, --line, --column; --header shows column names (--column always \
            does, unless --noheader). NULL prints as --nullvalue's text (empty by default; null \
            in JSON). A blob prints as its SQL literal, X'00ff'.

            Which database:
              class-managed  DB-dpkey beside DB, or --class creates one: its key is
                             wrapped by the device keybag under the class (unlock first).
              SQLCipher      --passphrase-file, --raw-key-hex or --raw-key-file: a
                             database SQLCipher's tools open with the same key.
              plain SQLite   otherwise: NOT encrypted (said on standard error).

            --import-plaintext encrypts an existing plain SQLite database in place: class-managed \
            (--class, or the directory's default class) or SQLCipher (a key option). Its old \
            pages may remain in the file system's free blocks, journal or snapshots.

            Examples:
              dpctl sql notes.db --class A "CREATE TABLE note(text)"
              dpctl sql notes.db --csv --header "SELECT * FROM note" > notes.csv
              dpctl sql legacy.db --passphrase-file pw --cipher-compat 3 < migrate.sql
              dpctl sql plain.db --import-plaintext --class A
            """)

    @OptionGroup var device: DeviceOptions

    @Argument(help: "The database file.")
    var database: String

    @Argument(help: "The SQL to run (one or more statements; default: --read's file, else standard input).")
    var sql: String?

    @Option(
        name: .customLong("read"),
        help: ArgumentHelp("Run the SQL in this file, as sqlite3's .read does.", valueName: "file"))
    var sqlFile: String?

    @Flag var mode: SQLOutputMode = .list

    @Flag(
        name: [.customLong("header"), .customLong("header", withSingleDash: true)],
        help: "Print the column names first.")
    var header = false

    @Flag(
        name: [.customLong("noheader"), .customLong("noheader", withSingleDash: true)],
        help: "No column names, not even with --column.")
    var noHeader = false

    @Option(
        name: [.customLong("nullvalue"), .customLong("nullvalue", withSingleDash: true)],
        help: ArgumentHelp("The text NULL prints as (default: nothing).", valueName: "text"))
    var nullValue = ""

    @Option(
        name: .customLong("class"),
        help: ArgumentHelp("Create a class-managed database in this class.", valueName: "class"))
    var protectionClass: ProtectionClass?

    @OptionGroup var unlock: UnlockOptions

    @Option(
        name: .long, help: ArgumentHelp("SQLCipher: the passphrase is the content of this file.", valueName: "file"))
    var passphraseFile: String?

    @Option(
        name: .long, help: ArgumentHelp("SQLCipher: a raw key, 64 hex digits (96 with the salt).", valueName: "hex"))
    var rawKeyHex: String?

    @Option(
        name: .long,
        help: ArgumentHelp("SQLCipher: the raw key's hex digits are the content of this file.", valueName: "file"))
    var rawKeyFile: String?

    @Option(name: .long, help: ArgumentHelp("SQLCipher format version: 3 or 4.", valueName: "n"))
    var cipherCompat: Int = 4

    @Option(
        name: .long,
        help: ArgumentHelp("Page size of the encrypted database (default: the format's).", valueName: "bytes"))
    var pageSize: Int?

    @Flag(
        help:
            "Encrypt this plain SQLite database in place (class-managed with --class or the directory's default; SQLCipher with a key option)."
    )
    var importPlaintext = false

    func validate() throws {
        let modes = [protectionClass != nil, passphraseFile != nil, rawKeyHex != nil, rawKeyFile != nil].filter { $0 }
            .count
        if modes > 1 {
            throw ValidationError("give at most one of --class, --passphrase-file, --raw-key-hex and --raw-key-file")
        }
        if sql != nil, sqlFile != nil {
            throw ValidationError("give the SQL on the command line or with --read, not both")
        }
        if header, noHeader { throw ValidationError("give --header or --noheader, not both") }
        if importPlaintext, sql != nil || sqlFile != nil {
            throw ValidationError("--import-plaintext runs no SQL: give the database only")
        }
        try requireText(sql, nullValue, what: "the SQL")
        try requirePaths(database)
        // Settings and keys that cannot be right are usage errors (64), found before anything runs.
        do {
            var format = try SQLCipherFormat(compatibility: cipherCompat)
            if let pageSize { format = try format.withPageSize(pageSize) }
            if let rawKeyHex { _ = try SQLCipherKey(rawKeyHex: rawKeyHex) }
        } catch let error as DatabaseCipherError {
            throw ValidationError(error.description)
        }
    }

    var formatter: SQLResultFormatter {
        SQLResultFormatter(mode: mode, header: mode == .column ? !noHeader : header, nullValue: nullValue)
    }

    func run() async throws {
        // A key on the command line is in the process list (`ps`, /proc/PID/cmdline) for every
        // user of the machine, and in shell history.
        if rawKeyHex != nil {
            note(
                "warning: --raw-key-hex puts the key where every user can read it (ps); --raw-key-file FILE keeps it in a file"
            )
        }
        var format = try SQLCipherFormat(compatibility: cipherCompat)
        if let pageSize { format = try format.withPageSize(pageSize) }
        if importPlaintext { return try await encryptInPlace(format: format) }
        let kind = DatabaseFileKind(path: database)
        let hasKey = passphraseFile != nil || rawKeyHex != nil || rawKeyFile != nil
        try kind.check(database, creatingClass: protectionClass != nil, withKey: hasKey)
        let sql = try readSQL()
        let formatter = self.formatter
        if protectionClass != nil || (kind == .classManaged && !hasKey) {
            let keybag = try await device.openDevice(
                passcodeFile: unlock.passcodeFile, standardInputCarriesData: self.sql == nil && sqlFile == nil)
            let db = try await PasscodePrompt.retrying(keybag) {
                try await ProtectedDatabase.open(
                    at: URL(fileURLWithPath: database), keybag: keybag, protection: protectionClass, mode: .queue,
                    format: format)
            }
            let output = try await db.writeWithoutTransaction { db in
                try Self.execute(sql, in: db, formatter: formatter)
            }
            try await db.close()
            FileHandle.standardOutput.write(Data(output.utf8))
            return
        }
        device.bootstrapLogging()
        let queue: DatabaseQueue
        if let passphraseFile {
            queue = try DatabaseQueue(
                path: database, key: .passphrase(Data(try readPasscode(passphraseFile).utf8)), format: format)
        } else if let rawKey = try rawKeyHex ?? rawKeyFile.map(Self.readRawKey) {
            queue = try DatabaseQueue(path: database, key: try SQLCipherKey(rawKeyHex: rawKey), format: format)
        } else {
            queue = try DatabaseQueue(path: database)
        }
        do {
            let output = try await queue.writeWithoutTransaction { db in
                try Self.execute(sql, in: db, formatter: formatter)
            }
            try queue.close()
            FileHandle.standardOutput.write(Data(output.utf8))
        } catch {
            throw DatabaseCipherError.explain(error, in: queue)
        }
        if kind == .missing, !hasKey, DatabaseFileKind.isPlainDatabase(database) {
            note(
                "created \(database): a plain database (not encrypted); `dpctl sql \(database) --import-plaintext --class C` encrypts it"
            )
        }
    }

    /// `--import-plaintext`: the plain database encrypted in place, class-managed or SQLCipher.
    func encryptInPlace(format: SQLCipherFormat) async throws {
        guard DatabaseFileKind.isPlainDatabase(database) else {
            throw CLIError(
                "\(database) is not a plain SQLite database (already encrypted, or not a database): nothing was changed"
            )
        }
        let key: SQLCipherKey?
        if let passphraseFile {
            key = .passphrase(Data(try readPasscode(passphraseFile).utf8))
        } else if let rawKey = try rawKeyHex ?? rawKeyFile.map(Self.readRawKey) {
            key = try SQLCipherKey(rawKeyHex: rawKey)
        } else {
            key = nil
        }
        if let key {
            device.bootstrapLogging()
            try SQLCipherMaintenance.importPlaintext(from: database, toPath: database, key: key, format: format)
            printOut("\(database): encrypted in place (SQLCipher \(cipherCompat), with the given key)")
            return
        }
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        let url = URL(fileURLWithPath: database)
        try await PasscodePrompt.retrying(keybag) {
            try await ProtectedDatabase.importPlaintext(
                at: url, keybag: keybag, protection: protectionClass, format: format)
        }
        let cls = try ItemInspector.protection(ofItemAt: URL(fileURLWithPath: database + DatabaseKeyFile.suffix))
            .fileClass
        printOut(
            "\(database): encrypted in place, class-managed (\(cls.map { "\($0.shortName) (\($0.letter))" } ?? "?"); key in \(database)\(DatabaseKeyFile.suffix))"
        )
    }

    /// The SQL: the argument, else --read's file, else standard input; dot-commands refused.
    func readSQL() throws -> String {
        let text: String
        if let sql {
            text = sql
        } else {
            let secretsFromStandardInput = [unlock.passcodeFile, passphraseFile, rawKeyFile].contains("-")
            if sqlFile == nil || sqlFile == "-", secretsFromStandardInput {
                throw CLIError(
                    "the SQL and a secret cannot both come from standard input: put one of them in a file (nothing was run)"
                )
            }
            let data: Data
            if let sqlFile, sqlFile != "-" {
                guard let contents = FileManager.default.contents(atPath: sqlFile) else {
                    throw CLIError("cannot read the SQL file \(sqlFile)")
                }
                data = contents
            } else {
                if isatty(STDIN_FILENO) == 1 { printError("reading SQL from the terminal; end with Ctrl-D") }
                data = FileHandle.standardInput.readDataToEndOfFile()
            }
            guard let decoded = String(data: data, encoding: .utf8) else {
                throw CLIError("the SQL is not UTF-8 text (nothing was run)")
            }
            text = decoded
        }
        let firstLine = text.drop(while: \.isWhitespace).prefix(while: { !$0.isNewline })
        if firstLine.hasPrefix(".") {
            throw CLIError(
                "\(firstLine.split(separator: " ").first ?? "") is a sqlite3 shell dot-command; dpctl sql takes SQL (the tables: SELECT name FROM sqlite_master WHERE type = 'table')"
            )
        }
        return text
    }

    static func readRawKey(_ path: String) throws -> String {
        try readPasscode(path).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Runs every statement and formats the rows of each as the sqlite3 shell does.
    /// A transaction the SQL opens (`BEGIN`) and does not end is rolled back, as when sqlite3
    /// exits, and reported: nothing of it is kept.
    static func execute(_ sql: String, in db: Database, formatter: SQLResultFormatter) throws -> String {
        var output = ""
        do {
            let statements = try db.allStatements(sql: sql)
            while let statement = try statements.next() {
                let rows = try Row.fetchAll(statement).map { Array($0.databaseValues) }
                output += formatter.format(columns: statement.columnNames, rows: rows)
            }
        } catch {
            if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
            throw error
        }
        if db.isInsideTransaction {
            try db.execute(sql: "ROLLBACK")
            throw CLIError(
                "the SQL left a transaction open (BEGIN without COMMIT or ROLLBACK): it was rolled back, nothing of it was kept"
            )
        }
        return output
    }
}

/// What a database file is, from its first bytes and its neighbours, before any key is tried.
enum DatabaseFileKind: Equatable {
    case missing
    case classManaged
    case plain
    /// Neither empty nor a plain SQLite database: encrypted (or not a database at all).
    case other
    case directory
    case unreadable(errno: Int32)

    init(path: String) {
        if FileManager.default.fileExists(atPath: path + DatabaseKeyFile.suffix) { self = .classManaged; return }
        guard let status = POSIXFile.status(path) else { self = .missing; return }
        if status.st_mode & S_IFMT == S_IFDIR { self = .directory; return }
        guard let handle = FileHandle(forReadingAtPath: path) else { self = .unreadable(errno: errno); return }
        defer { try? handle.close() }
        let head = (try? handle.read(upToCount: PageCipher.sqliteMagic.count)) ?? Data()
        if head.isEmpty { self = .missing } else if Self.isPlainHeader(head) { self = .plain } else { self = .other }
    }

    /// Whether `head` starts as a plain SQLite database does ("SQLite format 3\0").
    static func isPlainHeader(_ head: Data) -> Bool { head.starts(with: PageCipher.sqliteMagic) }

    /// Whether the regular file at `path` is a plain SQLite database (false when it cannot be read).
    static func isPlainDatabase(_ path: String) -> Bool {
        guard let fd = try? POSIXFile.openRegularFile(path) else { return false }
        defer { try? fd.close() }
        return isPlainHeader(
            Data((try? POSIXFile.read(fd, count: PageCipher.sqliteMagic.count, at: 0, path: path)) ?? []))
    }

    /// Refuses, before anything is run, a key or class that cannot fit the file.
    func check(_ path: String, creatingClass: Bool, withKey: Bool) throws {
        switch self {
        case .directory:
            throw CLIError("\(path) is a directory, not a database")
        case .unreadable(let code):
            throw CLIError("cannot read \(path): \(String(cString: strerror(code)))")
        case .plain where creatingClass:
            throw CLIError("\(path) is a plain SQLite database; --class creates new ones (nothing was run)")
        case .other where creatingClass:
            throw CLIError(
                "\(path) is not a plain SQLite database and has no key file (\(path)-dpkey); --class creates new ones (nothing was run)"
            )
        case .plain where withKey:
            throw CLIError("\(path) is a plain SQLite database: it takes no key (nothing was run)")
        case .other where !withKey:
            throw CLIError(
                "\(path) is encrypted, or not a database: give --passphrase-file, --raw-key-hex or --raw-key-file for SQLCipher; a class-managed database needs its key file \(path)-dpkey beside it"
            )
        default:
            return
        }
    }
}

struct SQLKey: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql-key",
        abstract: "Print a class-managed database's raw SQLCipher key.",
        usage: "dpctl sql-key <database> [<options>]",
        discussion: """
            Prints 64 hex digits. Open the database elsewhere with PRAGMA key = "x'<hex>'" in \
            SQLCipher 4 or later (the database is in SQLCipher 4's format; Debian 12's \
            sqlcipher 3.4.1 opens only --cipher-compat 3 databases). Refused while the \
            database's class is unavailable (unlock first).

            Example:
              K=$(dpctl sql-key notes.db --passcode-file pc)
              sqlcipher notes.db "PRAGMA key = \\"x'$K'\\"; SELECT * FROM note"
            """)

    @OptionGroup var device: DeviceOptions

    @Argument(help: "The class-managed database.")
    var database: String

    @OptionGroup var unlock: UnlockOptions

    func run() async throws {
        guard FileManager.default.fileExists(atPath: database + DatabaseKeyFile.suffix) else {
            throw CLIError("\(database) has no key file (\(database)-dpkey): it is not a class-managed database")
        }
        let keybag = try await device.openDevice(passcodeFile: unlock.passcodeFile)
        let db = try await PasscodePrompt.retrying(keybag) {
            try await ProtectedDatabase.open(at: URL(fileURLWithPath: database), keybag: keybag, mode: .queue)
        }
        let hex = try await db.rawKeyHex()
        try await db.close()
        printOut(hex)
    }
}
