import ArgumentParser
import Foundation
import GRDB

/// How `dpctl sql` prints result rows: the output modes of the sqlite3 shell.
enum SQLOutputMode: String, EnumerableFlag {
    /// Fields separated by a tab; tabs, newlines and backslashes escaped.
    case list
    /// RFC 4180 comma-separated values, quoted where needed, rows ending in CRLF.
    case csv
    /// A JSON array of objects, one per row, keys in column order.
    case json
    /// One `column = value` line per field, a blank line between rows.
    case line
    /// Aligned columns, with a header and a rule under it.
    case column

    static func name(for value: SQLOutputMode) -> NameSpecification {
        // sqlite3 spells its options with one dash; both spellings are accepted.
        [.customLong(value.rawValue), .customLong(value.rawValue, withSingleDash: true)]
    }

    static func help(for value: SQLOutputMode) -> ArgumentHelp? {
        switch value {
        case .list: "Tab-separated fields (the default); tab, newline, CR and \\ escaped as \\t \\n \\r \\\\."
        case .csv: "Comma-separated values (RFC 4180)."
        case .json: "A JSON array of objects, keys in column order."
        case .line: "One \"column = value\" line per field, a blank line between rows."
        case .column: "Aligned columns under a header."
        }
    }
}

/// The rows one statement returned, as the sqlite3 shell would print them.
struct SQLResultFormatter {
    var mode: SQLOutputMode
    /// Whether list and CSV output start with the column names (column mode always has them).
    var header: Bool
    /// What NULL prints as, in every mode but JSON (where it is `null`).
    var nullValue: String

    /// The text for one statement's result: empty when it returned no row.
    func format(columns: [String], rows: [[DatabaseValue]]) -> String {
        guard !rows.isEmpty else { return "" }
        switch mode {
        case .list:
            var lines: [String] = []
            if header { lines.append(columns.map(Self.escaped).joined(separator: "\t")) }
            for row in rows { lines.append(row.map { Self.escaped(text($0)) }.joined(separator: "\t")) }
            return lines.map { $0 + "\n" }.joined()
        case .csv:
            var lines: [String] = []
            if header { lines.append(columns.map(Self.csvField).joined(separator: ",")) }
            for row in rows { lines.append(row.map { Self.csvField(text($0)) }.joined(separator: ",")) }
            return lines.map { $0 + "\r\n" }.joined()
        case .json:
            let objects = rows.map { row in
                "{" + zip(columns, row).map { Self.jsonString($0) + ":" + Self.json($1) }.joined(separator: ",") + "}"
            }
            return "[" + objects.joined(separator: ",\n") + "]\n"
        case .line:
            let names = columns.map(Self.escaped)
            let width = names.map(\.count).max() ?? 0
            return rows.map { row in
                zip(names, row).map { name, value in
                    String(repeating: " ", count: max(0, width - name.count)) + name + " = " + Self.escaped(text(value))
                        + "\n"
                }.joined()
            }.joined(separator: "\n")
        case .column:
            // Widths of what is printed: escaped names and values.
            let names = columns.map(Self.escaped)
            let cells = rows.map { $0.map { Self.escaped(text($0)) } }
            let widths = names.indices.map { i in
                max(names[i].count, cells.map { i < $0.count ? $0[i].count : 0 }.max() ?? 0)
            }
            func line(_ fields: [String]) -> String {
                let padded = zip(fields, widths).map { $0 + String(repeating: " ", count: max(0, $1 - $0.count)) }
                return padded.joined(separator: "  ").replacingOccurrences(
                    of: " +$", with: "", options: .regularExpression) + "\n"
            }
            var out = ""
            if header {
                out += line(names)
                out += line(widths.map { String(repeating: "-", count: $0) })
            }
            for row in cells { out += line(row) }
            return out
        }
    }

    /// A value as text: NULL as `nullValue`, reals as sqlite3 prints them, blobs as `X'…'`.
    func text(_ value: DatabaseValue) -> String {
        switch value.storage {
        case .null: return nullValue
        case .int64(let n): return String(n)
        case .double(let d): return Self.real(d)
        case .string(let s): return s
        case .blob(let data): return Self.hexLiteral(data)
        }
    }

    /// sqlite3's "%!.15g": 15 significant digits, always a decimal point.
    static func real(_ d: Double) -> String {
        var text = String(format: "%.15g", d)
        if !text.contains(where: { ".ni".contains($0) }) {
            if let e = text.firstIndex(of: "e") { text.insert(contentsOf: ".0", at: e) } else { text += ".0" }
        }
        return text
    }

    /// A blob as the SQL literal that writes it back: `X'00ff'`.
    static func hexLiteral(_ data: Data) -> String {
        "X'" + data.map { String(format: "%02x", $0) }.joined() + "'"
    }

    /// Tab, newline, carriage return and backslash escaped, so one row stays one line. Scalars
    /// are compared, not characters: a combining mark after a tab must not hide it.
    static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: { "\t\n\r\\".unicodeScalars.contains($0) }) else { return text }
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\t": out += "\\t"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\\": out += "\\\\"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// A field quoted when it holds a comma, a quote, a line break (scalars compared, so a
    /// combining mark cannot hide one) or edge spaces.
    static func csvField(_ text: String) -> String {
        let special = ",\"\n\r".unicodeScalars
        guard
            text.unicodeScalars.contains(where: { special.contains($0) }) || text.hasPrefix(" ") || text.hasSuffix(" ")
        else {
            return text
        }
        var out = "\""
        for scalar in text.unicodeScalars {
            if scalar == "\"" { out += "\"" }
            out.unicodeScalars.append(scalar)
        }
        return out + "\""
    }

    static func json(_ value: DatabaseValue) -> String {
        switch value.storage {
        case .null: return "null"
        case .int64(let n): return String(n)
        case .double(let d): return d.isFinite ? real(d) : jsonString(real(d))
        case .string(let s): return jsonString(s)
        case .blob(let data): return jsonString(hexLiteral(data))
        }
    }

    /// A JSON string: quotes, backslashes and control characters escaped; `/` and non-ASCII kept.
    static func jsonString(_ text: String) -> String {
        quotedEscaping(text, isControl: { $0.value < 0x20 }, control: { String(format: "\\u%04x", $0.value) })
    }
}
