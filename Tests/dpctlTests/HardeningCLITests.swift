import DataProtection
import DataProtectionSystem
import DataProtectionTestSupport
import DataProtectionKeybag
import Foundation
import Testing

/// The CLI attacked as a script and a careless user would: names that are not UTF-8, empty
/// roots, erase without a terminal, one standard input for data and passcode, odd numbers.
@Suite struct HardeningCLITests {
    /// Runs `dpctl` with arguments given as raw bytes (Foundation's `Process` only takes
    /// strings); standard input from `input`, or /dev/null.
    static func spawn(_ arguments: [[UInt8]], input: [UInt8]? = nil, environment: [String: String] = [:],
                      unsetting: [String] = []) throws -> CLI.Result {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("dpctl-spawn-" + UUID().uuidString)
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        let inPath = work.appendingPathComponent("in").path, outPath = work.appendingPathComponent("out").path
        let errPath = work.appendingPathComponent("err").path
        try Data(input ?? []).write(to: URL(fileURLWithPath: inPath))
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, input == nil ? "/dev/null" : inPath, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var env = ProcessInfo.processInfo.environment
        for key in unsetting { env[key] = nil }
        env.merge(environment) { $1 }
        let argv: [[UInt8]] = [Array(CLI.executable.path.utf8)] + arguments
        let cArgs = argv.map { bytes -> UnsafeMutablePointer<CChar>? in
            let p = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
            for (i, b) in bytes.enumerated() { p[i] = CChar(bitPattern: b) }
            p[bytes.count] = 0
            return p
        } + [nil]
        let cEnv = env.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { cArgs.forEach { $0?.deallocate() }; cEnv.forEach { free($0) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, CLI.executable.path, &actions, nil, cArgs, cEnv)
        try #require(rc == 0)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        let code = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        return CLI.Result(status: code, stdout: (try? Data(contentsOf: URL(fileURLWithPath: outPath))) ?? Data(),
                          stderr: String(decoding: (try? Data(contentsOf: URL(fileURLWithPath: errPath))) ?? Data(), as: UTF8.self))
    }

    static func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

    /// `lat\xE9`, `y\xFE` and `y\xFD` are three names through write, cat, ls, protect, cp,
    /// exclude, include, exclusions and backup/restore: none lost, none merged.
    @Test func everyCommandTakesNamesThatAreNotUTF8() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let dir = Self.bytes(cli.work.path + "/docs/")
        try FileManager.default.createDirectory(atPath: cli.work.path + "/docs", withIntermediateDirectories: true)
        let names: [[UInt8]] = [Self.bytes("lat") + [0xE9], [0x79, 0xFE], [0x79, 0xFD]]
        let root = Self.bytes(cli.root)
        func dpctl(_ args: [[UInt8]], input: [UInt8]? = nil) throws -> CLI.Result {
            try Self.spawn([Self.bytes("--root"), root] + args, input: input)
        }
        for (index, name) in names.enumerated() {
            let w = try dpctl([Self.bytes("write"), dir + name, Self.bytes("--class"), Self.bytes("none")], input: Self.bytes("content \(index)"))
            #expect(w.status == 0, "\(w.stderr)")
        }
        let listed = try POSIXFile.directoryEntries(cli.work.path + "/docs").map(LosslessPath.bytes(of:)).sorted { $0.lexicographicallyPrecedes($1) }
        #expect(listed == names.sorted { $0.lexicographicallyPrecedes($1) }, "three files, byte for byte")
        for (index, name) in names.enumerated() {
            let cat = try dpctl([Self.bytes("cat"), dir + name])
            #expect(cat.status == 0 && cat.stdout == Data("content \(index)".utf8), "cat \(name): \(cat.stderr)")
            #expect(try dpctl([Self.bytes("protect"), dir + name, Self.bytes("--class"), Self.bytes("complete")]).status == 0)
        }
        let ls = try dpctl([Self.bytes("ls"), Self.bytes(cli.work.path + "/docs")])
        #expect(ls.status == 0)
        for shown in ["lat\\xE9", "y\\xFE", "y\\xFD"] { #expect(ls.out.contains(shown), "ls shows \(shown): \(ls.out)") }
        #expect(ls.out.components(separatedBy: "complete (A)").count - 1 == 3)
        // cp, exclude, include, exclusions.
        #expect(try dpctl([Self.bytes("cp"), dir + names[0], dir + names[0] + Self.bytes(".copy")]).status == 0)
        #expect(try dpctl([Self.bytes("cat"), dir + names[0] + Self.bytes(".copy")]).stdout == Data("content 0".utf8))
        #expect(try dpctl([Self.bytes("exclude"), dir + names[1]]).status == 0)
        let list = try dpctl([Self.bytes("exclusions"), Self.bytes(cli.work.path + "/docs")])
        #expect(list.status == 0 && [UInt8](list.stdout) == dir + names[1] + [0x0A], "the exclusion list names the file by its bytes")
        #expect(try dpctl([Self.bytes("include"), dir + names[1]]).status == 0)
        // Backup and restore keep all three.
        let backup = try dpctl([Self.bytes("backup"), Self.bytes(cli.work.path + "/docs"), Self.bytes(cli.work.path + "/repo")])
        #expect(backup.status == 0, "\(backup.stderr)")
        let id = try FileManager.default.contentsOfDirectory(atPath: cli.work.path + "/repo/backups").first { !$0.hasPrefix(".") }!
        let restore = try dpctl([Self.bytes("restore"), Self.bytes(cli.work.path + "/repo/backups/" + id), Self.bytes(cli.work.path + "/back")])
        #expect(restore.status == 0, "\(restore.stderr)")
        for (index, name) in names.enumerated() {
            #expect(try dpctl([Self.bytes("cat"), Self.bytes(cli.work.path + "/back/") + name]).stdout == Data("content \(index)".utf8))
        }
        // A message about such a name shows it escaped, on one line.
        let missing = try dpctl([Self.bytes("cat"), dir + [0x7A, 0xFF]])
        #expect(missing.status != 0 && missing.stderr.contains("z\\xFF") && missing.stderr.split(separator: "\n").count == 1, "\(missing.stderr)")
    }

    /// `--root ""` and `DP_ROOT=` are refused: a script's unset variable never reaches the real device.
    @Test func anEmptyRootIsRefusedAndTheDefaultDeviceIsUntouched() throws {
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("home-" + UUID().uuidString).path
        let env = ["HOME": home, "XDG_DATA_HOME": home + "/.local/share"]
        let made = try Self.spawn([Self.bytes("init"), Self.bytes("--no-passcode")], environment: env, unsetting: ["DP_ROOT"])
        try #require(made.status == 0, "\(made.stderr)")
        let keybag = home + "/.local/share/dataprotection/keybag"
        #expect(FileManager.default.fileExists(atPath: keybag))
        let emptyFlag = try Self.spawn([Self.bytes("--root"), [], Self.bytes("erase"), Self.bytes("--yes")], environment: env, unsetting: ["DP_ROOT"])
        #expect(emptyFlag.status != 0 && emptyFlag.stderr.contains("empty"), "\(emptyFlag.stderr)")
        var withEmptyVariable = env
        withEmptyVariable["DP_ROOT"] = ""
        let emptyVariable = try Self.spawn([Self.bytes("erase"), Self.bytes("--yes")], environment: withEmptyVariable)
        #expect(emptyVariable.status != 0 && emptyVariable.stderr.contains("DP_ROOT"), "\(emptyVariable.stderr)")
        #expect(FileManager.default.fileExists(atPath: keybag), "the default device survived")
    }

    /// Without a terminal, `erase` needs `--yes`.
    @Test func eraseWithoutATerminalNeedsYes() throws {
        let cli = CLI.make()
        #expect(try cli.run(["init", "--no-passcode"]).status == 0)
        let refused = try Self.spawn([Self.bytes("--root"), Self.bytes(cli.root), Self.bytes("erase")])   // stdin: /dev/null
        #expect(refused.status != 0 && refused.stderr.contains("--yes"), "\(refused.stderr)")
        #expect(FileManager.default.fileExists(atPath: cli.root + "/keybag"))
        #expect(try Self.spawn([Self.bytes("--root"), Self.bytes(cli.root), Self.bytes("erase"), Self.bytes("--yes")]).status == 0)
        #expect(!FileManager.default.fileExists(atPath: cli.root + "/keybag"))
    }

    /// `write --passcode-file -` would take the data for the passcode and count a failure:
    /// refused before any attempt. A passcode file ending in `\r\n` unlocks.
    @Test func oneStandardInputCannotCarryDataAndPasscode() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let refused = try cli.run(["write", cli.file("x"), "--passcode-file", "-"], input: Data("the data\n".utf8))
        #expect(refused.status != 0 && refused.stderr.contains("standard input"), "\(refused.stderr)")
        let status = try cli.run(["status", "--json"])
        #expect(status.out.contains("\"failedAttempts\" : 0") || status.out.contains("\"failedAttempts\":0"), "\(status.out)")
        let twice = try cli.run(["change-passcode", "--passcode-file", "-", "--new-passcode-file", "-"], input: Data("123456\n".utf8))
        #expect(twice.status != 0 && twice.stderr.contains("only one"), "\(twice.stderr)")
        let crlf = cli.writeFile("crlf", "123456\r\n")
        let written = try cli.run(["write", cli.file("y"), "--class", "complete", "--passcode-file", crlf], input: Data("ok".utf8))
        #expect(written.status == 0, "a passcode file with \\r\\n unlocks: \(written.stderr)")
    }

    /// Out-of-range grace periods are refused with a message, never a crash — by the CLI, and
    /// by a running keybagd (which every process would otherwise lose).
    @Test func outOfRangeGracePeriodsAreRefusedEverywhere() async throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456\n")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        for value in ["nan", "1e300", "inf", "86401"] {
            let result = try cli.run(["policy", "--grace-period", value, "--passcode-file", passcode])
            // Refused as a usage error before the device is touched (the library refuses them too, below).
            #expect(result.status == 64 && result.stderr.contains("--grace-period"), "\(value): \(result.status) \(result.stderr)")
        }
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.kill() }
        let keybag = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        try await keybag.unlock(passcode: "123456")
        // Straight onto the wire, past the client's own check.
        let client = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket))
        for seconds in [Double.nan, 1e300, -1] {
            #expect(throws: KeybagError.self) { try client.call(.setGracePeriod) { KeybagWire.double(&$0, seconds) } }
        }
        #expect(await keybag.gracePeriod == 10)
        #expect(await keybag.lockState == .unlocked, "the daemon is alive and kept its keys")
    }
}
