import DataProtectionTestSupport
import Foundation
import Testing

/// Help reaches the user as help (exit 0, on standard output), through every spelling.
@Suite struct HelpTests {
    @Test func helpIsPrintedNotReportedAsAnError() throws {
        let cli = CLI.make()
        for args in [["--help"], ["help"], ["help", "app"], ["app", "--help"], ["app", "run", "--help"], ["defaults", "write", "--help"], ["status", "-h"]] {
            let result = try cli.run(args)
            #expect(result.status == 0, "\(args): \(result.stderr)")
            #expect(result.out.contains("USAGE:"), "\(args): \(result.out.prefix(200))")
            #expect(!result.stderr.contains("CommandError"), "\(args): \(result.stderr)")
        }
        #expect(try cli.run(["--help"]).out.contains("app"))
        #expect(try cli.run(["--help"]).out.contains("defaults"))
    }

    /// Every help text of dpctl, keybagd and dp-bench, every subcommand's: no sentence broken
    /// mid-line by wrapping twice (a short line that does not end a sentence, followed by one
    /// that goes on in lower case), and no option saying its default twice.
    @Test func noHelpTextIsWrappedTwice() throws {
        let tools = CLI.executable.deletingLastPathComponent()
        var problems: [String] = []
        func walk(_ tool: String, _ path: [String]) throws {
            let text = try ChildProcess.run(tools.appendingPathComponent(tool).path, path + ["--help"]).out
            let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            let discussionEnd = lines.firstIndex { $0.hasPrefix("USAGE:") } ?? lines.count
            for index in 0..<max(discussionEnd - 1, 0) {
                let line = lines[index].trimmingCharacters(in: .whitespaces), next = lines[index + 1]
                guard !line.isEmpty, line.count < 50, !line.hasSuffix("."), !line.hasSuffix(":"), !line.hasSuffix(";"),
                      let first = next.first, first.isLowercase else { continue }
                problems.append("\(([tool] + path).joined(separator: " ")): \"\(line)\" / \"\(next)\"")
            }
            for (index, line) in lines.enumerated() where line.components(separatedBy: "(default:").count > 2
                || (line.contains("(default:") && index + 1 < lines.count && lines[index + 1].contains("(default:") && lines[index + 1].hasPrefix("    ")) {
                problems.append("\(([tool] + path).joined(separator: " ")): two defaults: \(line)")
            }
            if let start = lines.firstIndex(of: "SUBCOMMANDS:") {
                for line in lines[(start + 1)...] {
                    if line.isEmpty { break }
                    guard line.hasPrefix("  "), !line.hasPrefix("   "), let name = line.split(separator: " ").first, name != "help" else { continue }
                    try walk(tool, path + [String(name)])
                }
            }
        }
        for tool in ["dpctl", "keybagd", "dp-bench"] { try walk(tool, []) }
        #expect(problems.isEmpty, "\(problems.joined(separator: "\n"))")
    }
}
