import DataProtection
import Foundation
import GRDB
import GRDBSQLite

// GRDB statements driven directly where a save or a fault batch runs one statement thousands of
// times: building a `StatementArguments` per run maps every value through a key path.
extension Statement {
    /// Binds `values` to parameters 1, 2, … after resetting the statement (`sqlite3_reset`, then
    /// `sqlite3_bind_*`: values can only be bound to a statement that is not running). Its
    /// result is the last step's, already reported by whoever ran it.
    func bindDirectly<Values: Sequence>(_ values: Values) throws where Values.Element: StatementBinding {
        let statement = sqliteStatement
        sqlite3_reset(statement)
        for (index, value) in zip(CInt(1)..., values) {
            let code = value.bind(to: statement, at: index)
            guard code == SQLITE_OK else {
                throw DatabaseError(
                    resultCode: ResultCode(rawValue: code), message: "could not bind value \(index)", sql: sql)
            }
        }
    }

    /// Runs this query with `keys` bound to its parameters 1, 2, … and calls `body` on each result
    /// row while the statement is on it (`sqlite3_step`): what `Row.fetchCursor(self, arguments:)`
    /// does. The statement is reset again on the way out (an unfinished query keeps its read open).
    func forEachRow(keys: some Collection<Int64>, _ body: (StatementColumns) throws -> Void) throws {
        let statement = sqliteStatement
        defer { sqlite3_reset(statement) }
        try bindDirectly(keys)
        while true {
            switch sqlite3_step(statement) {
            case SQLITE_ROW: try body(StatementColumns(statement: statement))
            case SQLITE_DONE: return
            case let code:
                let message = sqlite3_db_handle(statement).flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) }
                throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
            }
        }
    }
}
