import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The way out of an app's network namespace for an app with the network entitlement
/// (FORMAT.md §10.2): `slirp4netns`, user-mode networking, as rootless containers use it. The
/// app gets a `tap0` interface (10.0.2.100/24, default route 10.0.2.2) whose traffic slirp4netns
/// carries out through ordinary sockets of the supervisor's user — never to the host's loopback
/// (`--disable-host-loopback`), never into the host's network namespace's abstract sockets. It
/// is attached while bubblewrap holds the sandbox before the app starts (`--block-fd`), so the
/// app's first instruction already has the network.
final class UserModeNetwork: Sendable {
    private let process: ChildProcess
    private let exitPipe: Pipe2

    private init(process: ChildProcess, exitPipe: Pipe2) {
        self.process = process
        self.exitPipe = exitPipe
    }

    /// Attaches slirp4netns to `sandbox`, and waits until the network is configured.
    static func attach(slirp4netns: String, sandbox: SandboxNamespace, errors: Int32) throws -> UserModeNetwork {
        let pid = sandbox.pid
        // The sandbox's network namespace belongs to the user namespace bubblewrap made; the app's
        // own (--disable-userns) is nested in it. slirp4netns joins the owner.
        let nested = try sandbox.openUserNamespace()
        defer { close(nested) }
        let owner: Int32
        do throws(Errno) { owner = try SystemCall.namespaceParent(nested) } catch {
            throw ContainerError.launchFailed("the sandbox's user namespace: \(error.description)")
        }
        defer { close(owner) }
        let ready = try Pipe2(), exitPipe = try Pipe2()
        let devNull = open("/dev/null", O_RDWR | O_CLOEXEC)
        defer { if devNull >= 0 { close(devNull) } }
        let process = ChildProcess(
            path: slirp4netns,
            arguments: [
                slirp4netns, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                "--enable-seccomp",
                "--userns-path=/proc/self/fd/5", "--ready-fd=3", "--exit-fd=4", String(pid), "tap0",
            ], environment: [:], descriptors: [devNull, devNull, errors, ready.write, exitPipe.read, owner])
        try process.start()
        ready.closeWriteEnd()
        var byte: UInt8 = 0
        var n = 0
        repeat { n = Glibc.read(ready.read, &byte, 1) } while n < 0 && errno == EINTR
        guard n == 1 else {
            exitPipe.closeWriteEnd()
            throw ContainerError.launchFailed("slirp4netns could not give the app its network (see its message above)")
        }
        return UserModeNetwork(process: process, exitPipe: exitPipe)
    }

    /// Ends slirp4netns (its exit descriptor closes) and waits for it.
    func stop() async {
        exitPipe.closeWriteEnd()
        _ = await process.exitStatus()
    }
}
