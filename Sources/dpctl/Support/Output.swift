import ArgumentParser
import DataProtection
import DataProtectionBackup
import DataProtectionContainers
import DataProtectionLifecycle
import DataProtectionSQLite
import DataProtectionSystem
import Foundation
import Logging
import Synchronization

// What dpctl prints: standard output for results (text, JSON, tables), standard error for notes
// and errors, with names shown as LosslessPath shows them.

/// Writes to standard output without buffering surprises.
func printOut(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

/// JSON for people and scripts alike: keys in a stable (sorted) order, `/` unescaped, dates in
/// ISO 8601. Names are the real names (a newline is `\n`, a backslash `\\`); a byte that is
/// not UTF-8 is `\udcHH`, as borg writes it (Python: `os.fsencode(name)` gives the bytes).
func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    encoder.dateEncodingStrategy = .iso8601
    printOut(LosslessPath.surrogateEscaped(String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)))
}

/// `text` in double quotes with `"`, `\`, newline, CR and tab escaped by a backslash, and every
/// other scalar `isControl` names written as `control` spells it (JSON's `\u0001`, a property
/// list's `\U0001`).
func quotedEscaping(_ text: String, isControl: (Unicode.Scalar) -> Bool, control: (Unicode.Scalar) -> String) -> String
{
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case _ where isControl(scalar): out += control(scalar)
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

/// One line on standard error (progress and notes that are not the command's output).
func printError(_ text: String) {
    FileHandle.standardError.write(Data((text + "\n").utf8))
}

/// Left-aligned text table.
func table(_ rows: [[String]], rightAligned: Set<Int> = []) -> String {
    guard let first = rows.first else { return "" }
    var widths = [Int](repeating: 0, count: first.count)
    for row in rows {
        for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], cell.count) }
    }
    return rows.map { row in
        row.enumerated().map { i, cell in
            let pad = String(repeating: " ", count: widths[i] - cell.count)
            return rightAligned.contains(i) ? pad + cell : (i == row.count - 1 ? cell : cell + pad)
        }.joined(separator: "  ")
    }.joined(separator: "\n")
}

/// One line on standard error that is not an error: something done or not done that the user
/// must know of.
func note(_ text: String) {
    FileHandle.standardError.write(Data("dpctl: \(LosslessPath.display(text))\n".utf8))
}
