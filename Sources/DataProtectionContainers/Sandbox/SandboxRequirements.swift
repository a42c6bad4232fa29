import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// What the sandbox needs from this machine, found before anything runs: bubblewrap (mount,
/// user and pid namespaces), `dp-sandbox-exec` (Landlock), and a kernel whose Landlock is
/// recent enough. A missing part is ``ContainerError/sandboxUnavailable(_:)`` with the reason;
/// an app is never run unconfined instead.
public struct SandboxRequirements: Sendable, Equatable {
    /// bubblewrap's executable.
    public var bubblewrap: String
    /// The Landlock step's executable.
    public var sandboxExec: String
    /// The kernel's Landlock ABI.
    public var landlockABI: Int

    /// The oldest Landlock ABI the sandbox accepts: 3 (Linux 6.2) brings TRUNCATE, without which
    /// an Inbox file could be emptied.
    public static let minimumLandlockABI = 3
    /// From ABI 6 (Linux 6.12) abstract Unix sockets and signals are also scoped to the sandbox
    /// (the app has its own network namespace in any case).
    public static let scopingLandlockABI = 6

    /// Whether Landlock scopes abstract sockets and signals here.
    public var scopesSockets: Bool { landlockABI >= Self.scopingLandlockABI }

    /// Finds the parts. `environment` may name them: `DATAPROTECTION_BWRAP`,
    /// `DATAPROTECTION_SANDBOX_EXEC` (default: beside the running executable, then
    /// `../libexec/dataprotection/`, then `PATH`).
    public static func probe(
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws -> SandboxRequirements {
        guard
            let bwrap = environment["DATAPROTECTION_BWRAP"].map({ $0 })
                ?? findInPath("bwrap", environment: environment),
            isExecutable(bwrap)
        else {
            throw ContainerError.sandboxUnavailable("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        }
        // Beside us (a build directory), then where an installation keeps helpers (PREFIX/bin/dpctl:
        // PREFIX/libexec/dataprotection/), then PATH.
        let directory = URL(fileURLWithPath: currentExecutable()).deletingLastPathComponent()
        let candidates = [
            directory.appendingPathComponent("dp-sandbox-exec").path,
            directory.deletingLastPathComponent().appendingPathComponent("libexec/dataprotection/dp-sandbox-exec").path,
        ]
        let exec =
            environment["DATAPROTECTION_SANDBOX_EXEC"] ?? candidates.first(where: isExecutable)
            ?? findInPath("dp-sandbox-exec", environment: environment)
        guard let exec, isExecutable(exec) else {
            throw ContainerError.sandboxUnavailable(
                "dp-sandbox-exec was not found beside \(currentExecutable()), in ../libexec/dataprotection, nor on PATH (it is built and installed with this package)"
            )
        }
        let abi: Int
        do throws(Errno) { abi = try SystemCall.landlockABI() } catch {
            switch error {
            case .noFunction:
                throw ContainerError.sandboxUnavailable(
                    "this kernel has no Landlock (Linux 5.13 or later, CONFIG_SECURITY_LANDLOCK)")
            case .notSupported:
                throw ContainerError.sandboxUnavailable(
                    "Landlock is disabled on this kernel (add landlock to the lsm= boot parameter)")
            default: throw ContainerError.sandboxUnavailable("Landlock: \(error.description)")
            }
        }
        let simulated = environment["DATAPROTECTION_LANDLOCK_ABI_LIMIT"].flatMap(Int.init)   // tests: an older kernel
        let effective = min(abi, simulated ?? abi)
        guard effective >= minimumLandlockABI else {
            throw ContainerError.sandboxUnavailable(
                "Landlock ABI \(effective) is too old: the sandbox needs ABI \(minimumLandlockABI) (Linux 6.2) to keep the Inbox read-only"
            )
        }
        // dp-sandbox-exec loads libseccomp for the app's system-call filter (as systemd does).
        if let library = dlopen("libseccomp.so.2", RTLD_LAZY | RTLD_LOCAL) {
            dlclose(library)
        } else {
            throw ContainerError.sandboxUnavailable(
                "libseccomp is not installed (the app's system-call filter needs libseccomp.so.2): apt-get install libseccomp2"
            )
        }
        guard userNamespacesAllowed() else {
            throw ContainerError.sandboxUnavailable(
                "unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0)"
            )
        }
        return SandboxRequirements(bubblewrap: bwrap, sandboxExec: exec, landlockABI: effective)
    }

    /// slirp4netns, for apps with the network entitlement (`DATAPROTECTION_SLIRP4NETNS`, else
    /// `PATH`); `nil` when it is not installed.
    package static func slirp4netns(environment: [String: String] = ProcessInfo.processInfo.environment) -> String? {
        if let named = environment["DATAPROTECTION_SLIRP4NETNS"] { return isExecutable(named) ? named : nil }
        return findInPath("slirp4netns", environment: environment)
    }

    package static func findInPath(_ name: String, environment: [String: String]) -> String? {
        for directory in (environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":") {
            let candidate = String(directory) + "/" + name
            if isExecutable(candidate) { return candidate }
        }
        return nil
    }

    static func isExecutable(_ path: String) -> Bool { access(path, X_OK) == 0 }

    static func currentExecutable() -> String {
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    }

    static func userNamespacesAllowed() -> Bool {
        if let text = try? String(contentsOfFile: "/proc/sys/user/max_user_namespaces", encoding: .utf8),
            Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) == 0
        {
            return false
        }
        if let text = try? String(contentsOfFile: "/proc/sys/kernel/unprivileged_userns_clone", encoding: .utf8),
            text.trimmingCharacters(in: .whitespacesAndNewlines) == "0", getuid() != 0
        {
            return false
        }
        return true
    }
}
