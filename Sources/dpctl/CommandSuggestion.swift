import ArgumentParser
import Foundation

/// git's "did you mean": a mistyped command is named as such, with the nearest commands, instead
/// of the parser's words about whatever argument came first.
enum CommandSuggestion {
    /// The message for `arguments` (after the global options were moved behind the command), or
    /// `nil` when the command and any subcommand of a group are known (or are options, or help).
    static func message(for arguments: [String], root: any ParsableCommand.Type) -> String? {
        guard let first = arguments.first, !first.hasPrefix("-"), first != "help" else { return nil }
        let commands = root.configuration.subcommands
        guard let command = commands.first(where: { names(of: $0).contains(first) }) else {
            return unknown(first, in: "dpctl", among: commands.flatMap(names(of:)))
        }
        let subcommands = command.configuration.subcommands
        guard !subcommands.isEmpty, arguments.count > 1, !arguments[1].hasPrefix("-"), arguments[1] != "help" else {
            return nil
        }
        let second = arguments[1]
        if subcommands.contains(where: { names(of: $0).contains(second) }) { return nil }
        return unknown(second, in: "dpctl \(first)", among: subcommands.flatMap(names(of:)))
    }

    private static func names(of command: any ParsableCommand.Type) -> [String] {
        let configuration = command.configuration
        return [configuration.commandName ?? ""] + configuration.aliases
    }

    private static func unknown(_ word: String, in command: String, among names: [String]) -> String {
        var text = "'\(word)' is not a \(command) command. See '\(command) --help'."
        let distances = names.map { ($0, distance(word.lowercased(), $0.lowercased())) }
        guard let best = distances.map(\.1).min(), best <= max(2, word.count / 3) else { return text }
        let nearest = distances.filter { $0.1 == best }.map(\.0)
        text +=
            "\n\nThe most similar command\(nearest.count == 1 ? " is" : "s are")\n"
            + nearest.map { "\t\($0)" }.joined(separator: "\n")
        return text
    }

    /// Edit distance (insertions, deletions, substitutions and swaps of neighbours), as git's.
    static func distance(_ a: String, _ b: String) -> Int {
        let a = Array(a), b = Array(b)
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var table = [[Int]](repeating: [Int](repeating: 0, count: b.count + 1), count: a.count + 1)
        for i in 0...a.count { table[i][0] = i }
        for j in 0...b.count { table[0][j] = j }
        for i in 1...a.count {
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    table[i][j] = min(table[i][j], table[i - 2][j - 2] + 1)
                }
            }
        }
        return table[a.count][b.count]
    }
}
