import ArgumentParser
import DataProtection
import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dp-bench tpm`: what sealing the device secret by a TPM costs a user — opening the device
/// (boot) and unlocking it — beside the file secret, with the same scrypt parameters, in one run.
struct TPMBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tpm",
        abstract: "Open and unlock with a TPM vs a file secret.",
        discussion:
            "Device open and unlock with the device secret sealed by a TPM, beside the file secret (on a software TPM unless --tcti)."
    )

    @Option(help: "Opens and unlocks measured on each side.")
    var rounds = 20

    @Option(help: "The TPM to measure (default: a software TPM, swtpm, started for this run).")
    var tcti: String?

    func run() async throws {
        let base = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "dp-bench-tpm-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: base) }
        var swtpmPID: pid_t?
        defer { if let swtpmPID { kill(swtpmPID, SIGKILL) } }
        let tcti: String
        if let given = self.tcti {
            tcti = given
        } else {
            guard toolExists("swtpm") else {
                throw ValidationError("swtpm is not installed (Debian: apt-get install swtpm), and no --tcti was given")
            }
            let socket = base.appendingPathComponent("sock").path
            // swtpm daemonizes once its socket accepts connections; it keeps none of our descriptors.
            let script =
                "import subprocess, sys; d = subprocess.DEVNULL; sys.exit(subprocess.run(sys.argv[1:], stdin=d, stdout=d, stderr=d, close_fds=True).returncode)"
            guard
                runTool(
                    "python3",
                    [
                        "-c", script, "swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + base.path,
                        "--server", "type=unixio,path=" + socket, "--ctrl", "type=unixio,path=" + socket + ".ctrl",
                        "--flags", "not-need-init,startup-clear", "--pid", "file=" + base.path + "/pid", "--daemon",
                    ]) != nil,
                let pid = pid_t(
                    (try? String(contentsOfFile: base.path + "/pid", encoding: .utf8))?.trimmingCharacters(
                        in: .whitespacesAndNewlines) ?? "")
            else { throw ValidationError("swtpm did not start") }
            swtpmPID = pid
            tcti = "swtpm:path=" + socket
        }
        let kdf = try PasscodeKDF.calibrated()
        let fileRoot = base.appendingPathComponent("file").path
        let tpmRoot = base.appendingPathComponent("tpm").path
        _ = try await Keybag.create(root: fileRoot, passcode: "123456", kdf: kdf)
        _ = try await Keybag.create(root: tpmRoot, passcode: "123456", kdf: kdf, tpm: TPMBinding(tcti: tcti))
        print(
            "dp-bench tpm: \(rounds) opens and unlocks on each side, alternated; passcode KDF \(kdf) on both; TPM: \(tcti)"
        )

        func milliseconds(_ d: Duration) -> Double {
            Double(d.components.seconds) * 1e3 + Double(d.components.attoseconds) / 1e15
        }
        var openFile: [Double] = [], openTPM: [Double] = [], unlockFile: [Double] = [], unlockTPM: [Double] = []
        let clock = ContinuousClock()
        for _ in 0..<rounds {
            for (root, opens, unlocks) in [(fileRoot, 0, 0), (tpmRoot, 1, 1)] {
                var keybag: Keybag?
                let open = try await clock.measure { keybag = try await Keybag.open(root: root, tpmTCTI: tcti) }
                let unlock = try await clock.measure { try await keybag!.unlock(passcode: "123456") }
                if opens == 0 { openFile.append(milliseconds(open)) } else { openTPM.append(milliseconds(open)) }
                if unlocks == 0 {
                    unlockFile.append(milliseconds(unlock))
                } else {
                    unlockTPM.append(milliseconds(unlock))
                }
            }
        }
        let rows = [
            Row(
                metric: "open the device (boot), p50", ours: percentile(openTPM, 50), peerName: "file secret",
                peer: percentile(openFile, 50),
                unit: "ms", higherIsBetter: false),
            Row(
                metric: "unlock with the passcode, p50", ours: percentile(unlockTPM, 50), peerName: "file secret",
                peer: percentile(unlockFile, 50),
                unit: "ms", higherIsBetter: false),
            Row(
                metric: "unlock with the passcode, p99", ours: percentile(unlockTPM, 99), peerName: "file secret",
                peer: percentile(unlockFile, 99),
                unit: "ms", higherIsBetter: false),
        ]
        printTable(rows)
        let tpmAdds =
            percentile(openTPM, 50) + percentile(unlockTPM, 50) - percentile(openFile, 50) - percentile(unlockFile, 50)
        print("(ratio above 1 = the TPM is faster; the TPM adds \(format(tpmAdds)) ms to open + unlock on this TPM)")
        print(
            String(
                format:
                    "summary: open_tpm_ms=%.2f open_file_ms=%.2f unlock_tpm_ms=%.2f unlock_file_ms=%.2f unlock_ratio=%.2f tpm_adds_ms=%.2f",
                percentile(openTPM, 50), percentile(openFile, 50), percentile(unlockTPM, 50),
                percentile(unlockFile, 50),
                percentile(unlockTPM, 50) / percentile(unlockFile, 50), tpmAdds))
    }
}
