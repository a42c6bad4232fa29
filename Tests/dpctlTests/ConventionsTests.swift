import DataProtectionTestSupport
import Foundation
import Testing

/// What a new user tripped over (issue 18): the conventions of the tools Linux users know.
@Suite struct ConventionsTests {
    @Test func versionsAreReported() throws {
        let cli = CLI.make()
        let dpctl = try cli.run(["--version"])
        #expect(dpctl.status == 0 && dpctl.out.range(of: #"^\d+\.\d+\.\d+\n$"#, options: .regularExpression) != nil, "\(dpctl.out)")
        let keybagd = try ChildProcess.run(CLI.executable.deletingLastPathComponent().appendingPathComponent("keybagd").path, ["--version"])
        #expect(keybagd.status == 0 && keybagd.out == dpctl.out)
    }

    @Test func completionScriptsAreGenerated() throws {
        let cli = CLI.make()
        // Each shell gets its own script whatever $SHELL says (here always another shell's).
        let marks = ["bash": "-F _dpctl dpctl", "zsh": "#compdef dpctl", "fish": "complete -c 'dpctl'"]
        for (shell, otherShell) in [("bash", "/usr/bin/fish"), ("zsh", "/bin/bash"), ("fish", "/bin/zsh")] {
            let result = try cli.run(["--generate-completion-script", shell], environment: ["SHELL": otherShell])
            #expect(result.status == 0 && result.out.contains(marks[shell]!) && result.out.contains("status"),
                    "\(shell) with SHELL=\(otherShell): \(result.stderr)\(result.out.prefix(80))")
        }
    }

    @Test func statusCheckExitsLikeSystemctlIsActive() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let locked = try cli.run(["status", "--check"])
        #expect(locked.status == 3 && locked.out == "before-first-unlock\n")
        let unlocked = try cli.run(["status", "--check", "--passcode-file", passcode])
        #expect(unlocked.status == 0 && unlocked.out == "unlocked\n")
    }

    @Test func classNamesAreAcceptedAndListedAsIOSWritesThem() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let help = try cli.run(["write", "--help"]).out
        for name in ["complete", "completeUnlessOpen", "completeUntilFirstUserAuthentication", "none", "until-first-unlock", "A", "D"] {
            #expect(help.contains(name), "\(name) is not listed")
        }
        for (n, name) in ["completeUntilFirstUserAuthentication", "B", "complete-unless-open", "none"].enumerated() {
            let result = try cli.run(["write", cli.file("f\(n)"), "--class", name, "--passcode-file", passcode], input: Data("x".utf8))
            #expect(result.status == 0, "\(name): \(result.stderr)")
        }
    }

    @Test func aGracePeriodThatIsNotANumberOfSecondsIsAUsageError() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        for value in ["nan", "-5", "1e12", "inf", "ten"] {
            let result = try cli.run(["policy", "--grace-period", value, "--passcode-file", passcode])
            #expect(result.status == 64, "\(value): \(result.stderr)")
            #expect(result.stderr.contains("--grace-period") && !result.stderr.contains("Missing value"), "\(value): \(result.stderr)")
        }
        let ok = try cli.run(["policy", "--grace-period", "30", "--passcode-file", passcode])
        #expect(ok.status == 0 && ok.out.contains("grace period 30.0 s"))
        #expect(try cli.run(["init", "--passcode-file", passcode, "--grace-period", "-1", "--root", cli.file("other")]).status == 64)
    }

    @Test func eraseAfterTenIsSpelledTheSameOnInitAndPolicy() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode, "--erase-after-ten-failures"]).status == 0)
        #expect(try cli.run(["status"]).out.contains("erase after 10:   on"))
        #expect(try cli.run(["policy", "--no-erase-after-ten-failures", "--passcode-file", passcode]).out.contains("erase after 10 failures off"))
        #expect(try cli.run(["policy", "--erase-after-ten-failures", "--passcode-file", passcode]).out.contains("erase after 10 failures on"))
        #expect(try cli.run(["policy", "--erase-after-ten-failures", "on", "--passcode-file", passcode]).status == 64)
    }

    @Test func aPasscodeFileFromTheEnvironment() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let env = ["DP_PASSCODE_FILE": passcode]
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete"], input: Data("secret".utf8), environment: env).status == 0)
        #expect(try cli.run(["cat", cli.file("a")], environment: env).out == "secret")
        #expect(try cli.run(["cat", cli.file("a")]).status == 3)
        #expect(try cli.run(["status", "--check"], environment: env).status == 0)
    }

    @Test func theFifthWrongPasscodeSaysThatADelayStarts() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--passcode-file", cli.writeFile("p", "123456")]).status == 0)
        var fifthStarted = ContinuousClock.now
        for n in 1...5 {
            fifthStarted = ContinuousClock.now
            let result = try cli.run(["status", "--passcode-file", cli.writeFile("g\(n)", "000\(n)")])
            #expect(result.status == 5)
            #expect(result.stderr.contains("a delay now starts") == (n == 5), "\(n): \(result.stderr)")
        }
        let sixth = try cli.run(["status", "--passcode-file", cli.writeFile("g6", "0006")])
        // dpctl runs on the real clock: the 1-minute delay began during the fifth run, so it
        // holds unless a loaded machine took a minute since then (then nothing is asserted).
        if ContinuousClock.now - fifthStarted < .seconds(60) {
            // "1 min", or "59 s" … once a second of it has passed.
            #expect(sixth.status == 5 && sixth.stderr.range(of: #"try again in (1 min|[1-5]?[0-9] s)"#, options: .regularExpression) != nil,
                    "\(sixth.stderr)")
        }
    }

    @Test func statusShowsTheGraceCountdownUnderKeybagd() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let unlock = try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment)
        #expect(unlock.out == "unlocked: every class is available to every process of this root\n", "\(unlock.stderr)")
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete"], input: Data("x".utf8), environment: daemon.environment).status == 0)
        #expect(try cli.run(["lock"], environment: daemon.environment).status == 0)
        try daemon.advance(11, root: cli.root)
        let refused = try cli.run(["cat", cli.file("a")], environment: daemon.environment)
        #expect(refused.status == 3 && refused.stderr.contains("`dpctl unlock` unlocks it for every process"), "\(refused.stderr)")
        #expect(try cli.run(["unlock", "--passcode-file", passcode], environment: daemon.environment).status == 0)
        #expect(try cli.run(["lock"], environment: daemon.environment).status == 0)
        let status = try cli.run(["status"], environment: daemon.environment)
        #expect(status.out.contains("class A discarded in 10 s"), "\(status.out)")
        try daemon.advance(4, root: cli.root)
        #expect(try cli.run(["status"], environment: daemon.environment).out.contains("class A discarded in 6 s"))
    }

    @Test func aWrongBackupPasswordIsCalledThat() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["backup-password", "--passcode-file", passcode, "--password-file", cli.writeFile("b", "backup pw")]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        let result = try cli.run(["backup", source, cli.file("repo"), "--password-file", cli.writeFile("w", "wrong")])
        #expect(result.status == 5)
        #expect(result.stderr == "dpctl: wrong backup password (or the backup keybag was modified)\n")
    }

    @Test func backupWarnsWithoutABackupPasswordAndKeepsJSONClean() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        try Data("x".utf8).write(to: URL(fileURLWithPath: source + "/a.txt"))
        let result = try cli.run(["backup", source, cli.file("repo"), "--json", "--log"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.contains("restores only on this device"))
        #expect((try? JSONSerialization.jsonObject(with: result.stdout)) != nil, "\(result.out)")
    }

    @Test func lsTakesSeveralPathsAndPrintsJSON() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete", "--passcode-file", passcode], input: Data("12345".utf8)).status == 0)
        let plain = cli.writeFile("b", "xy")
        let result = try cli.run(["ls", "--json", cli.file("a"), plain])
        #expect(result.status == 0, "\(result.stderr)")
        let items = try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [[String: Any]])
        #expect(items.map { $0["name"] as? String } == [cli.file("a"), plain])
        #expect(items.map { $0["class"] as? String } == ["complete (A)", "plain (unprotected)"])
        #expect(items.map { $0["size"] as? Int } == [5, 2])
        #expect(!result.out.contains("\\/"))   // slashes unescaped
        let text = try cli.run(["ls", cli.file("a"), plain]).out
        #expect(text.contains(cli.file("a")) && text.contains(plain))
    }

    @Test func aRepositoryInsideItsSourceIsNotBackedUpIntoItself() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let source = cli.file("src")
        try FileManager.default.createDirectory(atPath: source, withIntermediateDirectories: true)
        try Data("kept".utf8).write(to: URL(fileURLWithPath: source + "/a.txt"))
        let repository = source + "/repo"
        for _ in 0..<2 {   // the second run would find the first one's objects
            let result = try cli.run(["backup", source, repository, "--log"])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.out.contains("Not backed up (the backup repository): \(repository)"), "\(result.out)")
        }
        let backups = try FileManager.default.contentsOfDirectory(atPath: repository + "/backups").filter { !$0.hasPrefix(".") }.sorted()
        let destination = cli.file("restored")
        let restore = try cli.run(["restore", repository + "/backups/" + backups.last!, destination])
        #expect(restore.status == 0, "\(restore.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: destination) == ["a.txt"])
    }

    @Test func catSaysWhenAFileIsNotProtected() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let plain = cli.writeFile("plain.txt", "anyone wrote this")
        let shown = try cli.run(["cat", plain])
        #expect(shown.status == 0 && shown.out == "anyone wrote this")
        #expect(shown.stderr.contains("is not a protected file"))
        let strict = try cli.run(["cat", "--strict", plain])
        #expect(strict.status == 1 && strict.out.isEmpty && strict.stderr.contains("--strict"))
    }

    @Test func namesUpToNameMaxAreWrittenAtomically() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        for length in [235, 236, 250, 255] {
            let path = cli.file(String(repeating: "n", count: length))
            let write = try cli.run(["write", path], input: Data("long \(length)".utf8))
            #expect(write.status == 0, "\(length): \(write.stderr)")
            #expect(try cli.run(["cat", path]).out == "long \(length)")
            let again = try cli.run(["write", path], input: Data("replaced".utf8))   // replacing goes through a temporary name too
            #expect(again.status == 0, "\(length): \(again.stderr)")
            #expect(try cli.run(["cat", path]).out == "replaced")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: cli.work.path).allSatisfy { !$0.contains("dp-tmp") })
    }

    /// Every command's help, at 80 columns: no line longer, and every abstract in a command
    /// list on one line (a long one wraps mid-sentence under the next command's name) — for
    /// dpctl, keybagd and dp-bench.
    @Test func everyHelpFitsEightyColumns() throws {
        let directory = CLI.executable.deletingLastPathComponent()
        var seen = 0
        var offenders: [String] = []
        for tool in ["dpctl", "keybagd", "dp-bench"] {
            var pending: [[String]] = [[]]
            while let command = pending.popLast() {
                let help = try ChildProcess.run(directory.appendingPathComponent(tool).path, command + ["--help"], environment: ["COLUMNS": "80"])
                #expect(help.status == 0, "\(tool) \(command)")
                seen += 1
                var inSubcommands = false
                for line in help.out.split(separator: "\n", omittingEmptySubsequences: false) {
                    if line.count > 80 { offenders.append("\(tool) \(command.joined(separator: " ")): \(line)") }
                    if line.hasPrefix("SUBCOMMANDS:") { inSubcommands = true; continue }
                    guard inSubcommands else { continue }
                    if line.isEmpty { inSubcommands = false; continue }
                    if line.hasPrefix("  "), !line.hasPrefix("   ") {
                        let name = String(line.dropFirst(2).prefix { $0 != " " })
                        if name != "help", command.count < 3 { pending.append(command + [name]) }
                    } else {
                        offenders.append("\(tool) \(command.joined(separator: " ")): a wrapped abstract: \(line)")
                    }
                }
            }
        }
        #expect(seen > 60, "every command was visited")
        #expect(offenders.isEmpty, "\(offenders.joined(separator: "\n"))")
    }

    /// The README's dpctl sections name every command the help lists.
    @Test func theReadmeNamesEveryCommand() throws {
        let readme = try String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../README.md").standardizedFileURL, encoding: .utf8)
        let cli = CLI.make()
        var pending: [[String]] = [[]]
        var missing: [String] = []
        while let command = pending.popLast() {
            let help = try cli.run(command + ["--help"]).out
            let names = help.components(separatedBy: "SUBCOMMANDS:").dropFirst().first?
                .split(separator: "\n", omittingEmptySubsequences: false).dropFirst().prefix { !$0.isEmpty }
                .filter { $0.hasPrefix("  ") && !$0.hasPrefix("   ") }
                .map { String($0.dropFirst(2).prefix { $0 != " " }) }.filter { $0 != "help" } ?? []
            for name in names where command.count < 3 { pending.append(command + [name]) }
            if names.isEmpty, !command.isEmpty, !readme.contains(command.joined(separator: " ")) {
                missing.append(command.joined(separator: " "))
            }
        }
        #expect(missing.isEmpty, "not in the README: \(missing)")
    }

    /// Every path the documents cite (README, CONTRIBUTING, docs/) and every path a comment cites
    /// in the sources, tests and scripts exists: a map that names a moved file is a wrong map.
    @Test func everyPathCitedExists() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardizedFileURL.path
        let manager = FileManager.default
        // A path starts where no name, path or dot goes on before it.
        let pattern = try Regex(#"(?:^|[^\w/.-])((?:Sources|Tests|scripts|contrib|\.ci)/[A-Za-z0-9_./+@-]*[A-Za-z0-9_+@-]|docs/[A-Za-z0-9_-]+\.md)"#)
        var cited: [(path: String, in: String)] = []
        func scan(_ text: Substring, in file: String) {
            for match in text.matches(of: pattern) {
                if let path = match.output[1].substring { cited.append((String(path), file)) }
            }
        }
        let documents = ["README.md", "CONTRIBUTING.md"] + (try manager.contentsOfDirectory(atPath: root + "/docs")).map { "docs/" + $0 }
        for document in documents where document.hasSuffix(".md") {
            scan(Substring(try String(contentsOfFile: root + "/" + document, encoding: .utf8)), in: document)
        }
        var sources: [String] = [".ci/run"] + (try manager.contentsOfDirectory(atPath: root + "/scripts")).map { "scripts/" + $0 }
        for top in ["Sources", "Tests"] {
            for case let relative as String in manager.enumerator(atPath: root + "/" + top)!
            where [".swift", ".c", ".h"].contains(where: relative.hasSuffix) {
                sources.append(top + "/" + relative)
            }
        }
        for file in sources {
            guard let text = try? String(contentsOfFile: root + "/" + file, encoding: .utf8) else { continue }
            let shell = !file.hasSuffix(".swift") && !file.hasSuffix(".c") && !file.hasSuffix(".h")
            for line in text.split(separator: "\n") {
                if shell {
                    if line.trimmingCharacters(in: .whitespaces).hasPrefix("#") { scan(line, in: file) }
                } else if let comment = line.range(of: "//") {
                    scan(line[comment.lowerBound...], in: file)
                }
            }
        }
        #expect(cited.count > 100, "the documents cite paths: \(cited.count) found")
        let missing = cited.filter { !manager.fileExists(atPath: root + "/" + $0.path) }.map { "\($0.in): \($0.path)" }
        #expect(missing.isEmpty, "cited but not there:\n\(missing.joined(separator: "\n"))")
    }

    /// Every type declared `@unchecked Sendable` states, in the comment just above it, the
    /// invariant that makes it safe (CONTRIBUTING.md, "The concurrency model").
    @Test func everyUncheckedSendableStatesItsInvariant() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardizedFileURL.path
        var declarations = 0
        var unstated: [String] = []
        for case let relative as String in FileManager.default.enumerator(atPath: root + "/Sources")! where relative.hasSuffix(".swift") {
            let lines = try String(contentsOfFile: root + "/Sources/" + relative, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            for (index, line) in lines.enumerated() where line.contains("@unchecked Sendable") && !line.trimmingCharacters(in: .whitespaces).hasPrefix("//") {
                declarations += 1
                // The comment block just above the declaration says it.
                var above = index - 1
                var stated = false
                while above >= 0, lines[above].trimmingCharacters(in: .whitespaces).hasPrefix("//") {
                    if lines[above].contains("`@unchecked Sendable`:") { stated = true }
                    above -= 1
                }
                if !stated { unstated.append("Sources/\(relative):\(index + 1)") }
            }
        }
        #expect(declarations > 10)
        #expect(unstated.isEmpty, "no invariant stated above: \(unstated)")
    }

    /// No line of the sources is wider than 120 columns unless a literal needs it (a string, a
    /// multi-line string's text, a documentation link to a symbol, a code example or a table in a
    /// comment): `swift format` with the
    /// repository's `.swift-format` keeps code within it.
    @Test func sourceLinesFitOneHundredTwentyColumns() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardizedFileURL.path
        var wide: [String] = []
        for case let relative as String in FileManager.default.enumerator(atPath: root + "/Sources")! where relative.hasSuffix(".swift") {
            var inMultilineString = false, inCodeExample = false
            for (index, line) in try String(contentsOfFile: root + "/Sources/" + relative, encoding: .utf8).split(separator: "\n").enumerated() {
                let quotes = line.components(separatedBy: "\"\"\"").count - 1
                let text = line.trimmingCharacters(in: .whitespaces)
                if text.hasPrefix("/// ```") { inCodeExample.toggle() }
                defer { if quotes % 2 == 1 { inMultilineString.toggle() } }
                // A string, a documentation link, a code example or a table row in a comment is a literal.
                guard line.count > 120, !inMultilineString, !inCodeExample, quotes == 0, !line.contains("\""), !line.contains("``"),
                      !text.hasPrefix("/// |") else { continue }
                wide.append("Sources/\(relative):\(index + 1)")
            }
        }
        #expect(wide.isEmpty, "wider than 120 columns: \(wide)")
    }

    /// No source file is over 500 lines: a file that grows past one concept is split by facet
    /// (`Type+Facet.swift`).
    @Test func noSourceFileIsOverFiveHundredLines() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../..").standardizedFileURL.path
        var long: [String] = []
        for case let relative as String in FileManager.default.enumerator(atPath: root + "/Sources")! where relative.hasSuffix(".swift") {
            let lines = try String(contentsOfFile: root + "/Sources/" + relative, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            if lines.count > 501 { long.append("Sources/\(relative): \(lines.count - 1) lines") }
        }
        #expect(long.isEmpty, "over 500 lines: \(long)")
    }

    /// On a terminal, a command that needs a locked class asks for the passcode (without echo),
    /// as fscrypt and age do; without one it fails with exit 3 as before.
    @Test func commandsAskForThePasscodeOnATerminal() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("p", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        #expect(try cli.run(["write", cli.file("a"), "--class", "complete", "--passcode-file", passcode], input: Data("secret text".utf8)).status == 0)
        #expect(try cli.run(["cat", cli.file("a")]).status == 3, "no terminal: no question")

        let cat = try cli.runOnTerminal(["cat", cli.file("a")], answer: "123456")
        #expect(cat.status == 0 && cat.screen.contains("Passcode:") && cat.screen.contains("secret text"), "\(cat.screen)")
        #expect(!cat.screen.contains("123456"), "the passcode is not echoed")

        let wrong = try cli.runOnTerminal(["cat", cli.file("a")], answer: "9999")
        #expect(wrong.status == 5 && wrong.screen.contains("wrong passcode") && !wrong.screen.contains("secret text"), "\(wrong.screen)")

        // An empty answer is no attempt; DP_TERMINAL_PROMPT=0 asks nothing (as GIT_TERMINAL_PROMPT=0).
        let empty = try cli.runOnTerminal(["cat", cli.file("a")], answer: "")
        #expect(empty.status == 3 && !empty.screen.contains("secret text"), "\(empty.screen)")
        let off = try cli.runOnTerminal(["cat", cli.file("a")], answer: "123456", environment: ["DP_TERMINAL_PROMPT": "0"])
        #expect(off.status == 3 && !off.screen.contains("Passcode:"), "\(off.screen)")
        #expect(try cli.run(["status", "--json"]).out.contains("\"failedAttempts\" : 1"), "only the wrong answer counted")

        // Class D needs nothing: no question.
        #expect(try cli.run(["write", cli.file("d"), "--class", "none"], input: Data("open".utf8)).status == 0)
        let plain = try cli.runOnTerminal(["cat", cli.file("d")], answer: "123456")
        #expect(plain.status == 0 && !plain.screen.contains("Passcode:"), "\(plain.screen)")

        // A check first, then the question, then the work: protect, sql.
        let protect = try cli.runOnTerminal(["protect", cli.file("a"), "--class", "until-first-unlock"], answer: "123456")
        #expect(protect.status == 0 && protect.screen.contains("Passcode:"), "\(protect.screen)")
        #expect(try cli.run(["cat", cli.file("a"), "--passcode-file", passcode]).out == "secret text")
        #expect(try cli.run(["sql", cli.file("n.db"), "--class", "A", "--passcode-file", passcode, "CREATE TABLE t(x); INSERT INTO t VALUES (42)"]).status == 0)
        let sql = try cli.runOnTerminal(["sql", cli.file("n.db"), "SELECT x FROM t"], answer: "123456")
        #expect(sql.status == 0 && sql.screen.contains("Passcode:") && sql.screen.contains("42"), "\(sql.screen)")
    }
}
