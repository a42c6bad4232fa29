import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A software TPM 2.0 (Debian `swtpm`) of a test's own, on a Unix socket, reached through
/// libtss2's swtpm TCTI; tpm2-tools (`tpm2_*`) inspect and administer it as an owner would.
public final class SoftwareTPM: @unchecked Sendable {
    /// Its state directory.
    public let directory: String
    /// The TCTI configuration that reaches it (`swtpm:path=…`).
    public let tcti: String
    private let pid: pid_t

    /// Starts a fresh TPM (manufactured on first start: new seeds, so its own storage keys).
    ///
    /// - Parameter state: An existing state directory to start from instead (the same TPM).
    public init(state: String? = nil) throws {
        directory = state ?? NSTemporaryDirectory() + "swtpm-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let socket = directory + "/sock"
        tcti = "swtpm:path=" + socket
        // --daemon returns once the sockets accept connections; the pid file says whom to stop.
        // Python starts it with every other descriptor closed: a daemon that inherited one of this
        // process's pipes (Foundation's Process watches its child through one) would hold it open.
        let arguments = [
            "swtpm", "socket", "--tpm2", "--tpmstate", "dir=" + directory,
            "--server", "type=unixio,path=" + socket, "--ctrl", "type=unixio,path=" + socket + ".ctrl",   // where the TCTI looks
            "--flags", "not-need-init,startup-clear", "--pid", "file=" + directory + "/pid",
            "--log", "file=" + directory + "/log", "--daemon",
        ]
        let script = "import subprocess, sys; d = subprocess.DEVNULL; "
            + "sys.exit(subprocess.run(sys.argv[1:], stdin=d, stdout=d, stderr=d, close_fds=True).returncode)"
        let started = try ChildProcess.run("python3", ["-c", script] + arguments)
        guard started.status == 0, let text = try? String(contentsOfFile: directory + "/pid", encoding: .utf8),
              let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            let log = (try? String(contentsOfFile: directory + "/log", encoding: .utf8)) ?? ""
            throw SoftwareTPMError("swtpm did not start (status \(started.status)): \(started.err) \(log)")
        }
        self.pid = pid
    }

    /// The environment that points `dpctl`, `keybagd` and tpm2-tools at this TPM.
    public var environment: [String: String] { ["DATAPROTECTION_TPM_TCTI": tcti, "TPM2TOOLS_TCTI": tcti] }

    /// Runs a tpm2-tools command against this TPM.
    @discardableResult
    public func tool(_ name: String, _ arguments: [String]) throws -> ChildProcess {
        let result = try ChildProcess.run(name, arguments, environment: ["TPM2TOOLS_TCTI": tcti])
        guard result.status == 0 else { throw SoftwareTPMError("\(name) \(arguments.joined(separator: " ")): \(result.err)") }
        return result
    }

    /// `tpm2_dictionarylockout --setup-parameters`: lockout after `maxTries` failures, one
    /// forgotten every `recoveryTime` seconds.
    public func setDictionaryAttackParameters(maxTries: Int, recoveryTime: Int = 600, lockoutRecovery: Int = 600) throws {
        try tool("tpm2_dictionarylockout", ["--setup-parameters", "--max-tries=\(maxTries)",
                                            "--recovery-time=\(recoveryTime)", "--lockout-recovery-time=\(lockoutRecovery)"])
    }

    /// `tpm2_dictionarylockout --clear-lockout`: the owner resets the failure count.
    public func clearLockout() throws { try tool("tpm2_dictionarylockout", ["--clear-lockout"]) }

    /// A variable property (`tpm2_getcap properties-variable`), e.g. `TPM2_PT_LOCKOUT_COUNTER`.
    public func property(_ name: String) throws -> UInt32? {
        let out = try tool("tpm2_getcap", ["properties-variable"]).out
        for line in out.split(separator: "\n") where line.hasPrefix(name + ":") {
            let value = line.dropFirst(name.count + 1).trimmingCharacters(in: .whitespaces)
            return value.hasPrefix("0x") ? UInt32(value.dropFirst(2), radix: 16) : UInt32(value)
        }
        return nil
    }

    /// The persistent handles in use (`tpm2_getcap handles-persistent`).
    public func persistentHandles() throws -> [String] {
        try tool("tpm2_getcap", ["handles-persistent"]).out.split(separator: "\n")
            .map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "- ")) }.filter { !$0.isEmpty }
    }

    /// The NV indices defined (`tpm2_getcap handles-nv-index`).
    public func nvIndices() throws -> [String] {
        try tool("tpm2_getcap", ["handles-nv-index"]).out.split(separator: "\n")
            .map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "- ")) }.filter { !$0.isEmpty }
    }

    /// Stops the simulator (swtpm ignores SIGTERM while it waits for a client; nothing of its
    /// state matters once the test is over).
    public func stop() {
        kill(pid, SIGKILL)
    }

    deinit { stop() }
}

public struct SoftwareTPMError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
