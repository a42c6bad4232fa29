import DataProtection
import DataProtectionKeybag
import DataProtectionTestSupport
import Foundation
import Testing

/// `dpctl init --tpm`, `dpctl tpm enroll|remove`, `dpctl status` and keybagd, as a user and an
/// attacker with the root's files meet them.
@Suite struct TPMCLITests {
    func json(_ result: CLI.Result) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [String: Any])
    }

    @Test func initWithTPMStatusAndLockoutThroughTheCLI() throws {
        let tpm = try SoftwareTPM()
        try tpm.setDictionaryAttackParameters(maxTries: 3)
        let cli = CLI.make()
        let env = tpm.environment
        let passcode = cli.writeFile("passcode", "123456\n")
        let init_ = try cli.run(["init", "--tpm", "--passcode-file", passcode], environment: env)
        #expect(init_.status == 0, "\(init_.stderr)")
        #expect(init_.out.contains("sealed by the TPM"))

        let status = try cli.run(["status"], environment: env)
        #expect(status.out.contains("device secret:    sealed by the TPM"))
        #expect(status.out.contains("TPM lockout:      0 of 3 failures counted, 3 left"))
        let object = try json(try cli.run(["status", "--json"], environment: env))
        let secret = try #require(object["deviceSecret"] as? [String: Any])
        #expect(secret["storage"] as? String == "tpm")
        #expect((object["tpm"] as? [String: Any])?["maxTries"] as? Int == 3)

        for (n, guess) in ["0000", "1111"].enumerated() {
            let wrong = try cli.run(["status", "--passcode-file", cli.writeFile("guess\(n)", guess)], environment: env)
            #expect(wrong.status == 5)
            #expect(wrong.stderr == "dpctl: wrong passcode (\(n + 1) consecutive failure\(n == 0 ? "" : "s"))\n")   // one line, no stack noise
        }
        _ = try cli.run(["status", "--passcode-file", cli.writeFile("guess2", "2222")], environment: env)
        let refused = try cli.run(["status", "--passcode-file", passcode], environment: env)
        #expect(refused.status == 5)
        #expect(refused.stderr.contains("dictionary-attack lockout") && refused.stderr.contains("tpm2_dictionarylockout --clear-lockout"))
        #expect(try cli.run(["status"], environment: env).out.contains("IN LOCKOUT"))
        try tpm.clearLockout()
        #expect(try cli.run(["status", "--passcode-file", passcode], environment: env).status == 0)
    }

    @Test func enrollAndRemoveAnExistingDeviceKeepingItsFiles() throws {
        let tpm = try SoftwareTPM()
        let cli = CLI.make()
        let env = tpm.environment
        let passcode = cli.writeFile("passcode", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode], environment: env).status == 0)
        let file = cli.file("secret.txt")
        #expect(try cli.run(["write", file, "--class", "complete", "--passcode-file", passcode], input: Data("kept".utf8), environment: env).status == 0)
        let before = try cli.run(["status"], environment: env)
        #expect(before.out.contains("device secret:    stored in a file: a copy of the data root can be attacked offline"))

        let enroll = try cli.run(["tpm", "enroll", "--passcode-file", passcode], environment: env)
        #expect(enroll.status == 0, "\(enroll.stderr)")
        #expect(!FileManager.default.fileExists(atPath: cli.root + "/device.secret"))
        #expect(try cli.run(["cat", file, "--passcode-file", passcode], environment: env).out == "kept")

        let remove = try cli.run(["tpm", "remove", "--passcode-file", passcode], environment: env)
        #expect(remove.status == 0, "\(remove.stderr)")
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try cli.run(["cat", file, "--passcode-file", passcode]).out == "kept")   // no TPM needed any more
    }

    @Test func eraseWorksWhenThePCRsNoLongerMatch() throws {
        let tpm = try SoftwareTPM()
        let cli = CLI.make()
        let env = tpm.environment
        #expect(try cli.run(["init", "--tpm", "--tpm-pcrs", "16", "--passcode-file", cli.writeFile("p", "123456")], environment: env).status == 0)
        try tpm.tool("tpm2_pcrextend", ["16:sha256=" + String(repeating: "ef", count: 32)])
        let status = try cli.run(["status"], environment: env)
        #expect(status.status == 1 && status.stderr.contains("PCRs"))
        let erase = try cli.run(["erase", "--yes"], environment: env)
        #expect(erase.status == 0, "\(erase.stderr)")
        #expect(erase.out.contains("TPM objects destroyed"))
        #expect(try tpm.persistentHandles().isEmpty)
        #expect(try cli.run(["status"], environment: env).status == 1)   // not initialized any more
    }

    @Test func withoutATPMInitSaysWhereItLooked() throws {
        let cli = CLI.make()
        let result = try cli.run(["init", "--tpm", "--passcode-file", cli.writeFile("p", "123456")],
                                 environment: ["DATAPROTECTION_TPM_TCTI": "swtpm:path=" + cli.file("no-tpm")])
        #expect(result.status == 1)
        #expect(result.stderr.hasPrefix("dpctl: TPM: sealing the device secret: no TPM answers on swtpm:path="))
        #expect(result.stderr.split(separator: "\n").count == 1)
        #expect(!FileManager.default.fileExists(atPath: cli.root + "/keybag"))
    }

    /// Without a TPM the file can be rolled back across restarts, but not under a running keybagd.
    @Test func keybagdRefusesAKeybagOlderThanOneItHasSeen() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
        #expect(try cli.run(["init", "--passcode-file", passcode]).status == 0)
        let daemon = try KeybagdProcess(cli: cli)
        defer { daemon.stop() }
        let saved = try Data(contentsOf: URL(fileURLWithPath: cli.root + "/keybag"))
        for n in 1...3 {
            let wrong = try cli.run(["unlock", "--passcode-file", cli.writeFile("g\(n)", "000\(n)")], environment: daemon.environment)
            #expect(wrong.stderr.contains("wrong passcode (\(n) consecutive failure"))
        }
        try saved.write(to: URL(fileURLWithPath: cli.root + "/keybag"))   // the attacker's reset
        let next = try cli.run(["unlock", "--passcode-file", cli.writeFile("g4", "0004")], environment: daemon.environment)
        #expect(next.stderr.contains("wrong passcode (4 consecutive failures)"))
        let status = try json(try cli.run(["status", "--json"], environment: daemon.environment))
        #expect(status["failedAttempts"] as? Int == 4)
        #expect(status["lastKeybagRollback"] != nil)
        #expect(try cli.run(["status"], environment: daemon.environment).out.contains("rollback:"))
    }
}
