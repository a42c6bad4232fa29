import CLinuxShims
import Foundation
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

    /// Attaches slirp4netns to the sandbox whose process id bubblewrap writes on `info`
    /// (`--info-fd`: `{"child-pid": N, …}`), and waits until the network is configured.
    static func attach(slirp4netns: String, info: Pipe2, errors: Int32) throws -> UserModeNetwork {
        info.closeWriteEnd()
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1024)
        while !text.contains(UInt8(ascii: "}")), text.count < 8192 {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(info.read, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            text += buffer[0..<n]
        }
        let json = String(decoding: text, as: UTF8.self)
        guard let range = json.range(of: #""child-pid":\s*[0-9]+"#, options: .regularExpression),
              let pid = pid_t(json[range].split(separator: ":").last?.trimmingCharacters(in: .whitespaces) ?? "") else {
            throw ContainerError.launchFailed("bubblewrap did not say which process the sandbox is (no network for the app)")
        }
        // The sandbox's network namespace belongs to the user namespace bubblewrap made; the app's
        // own (--disable-userns) is nested in it. slirp4netns joins the owner.
        let nested = open("/proc/\(pid)/ns/user", O_RDONLY | O_CLOEXEC)
        guard nested >= 0 else { throw ContainerError.launchFailed("the sandbox's user namespace: \(String(cString: strerror(errno)))") }
        defer { close(nested) }
        let owner = cshim_namespace_parent(nested)
        guard owner >= 0 else { throw ContainerError.launchFailed("the sandbox's user namespace: \(String(cString: strerror(-owner)))") }
        defer { close(owner) }
        let ready = try Pipe2(), exitPipe = try Pipe2()
        let devNull = open("/dev/null", O_RDWR | O_CLOEXEC)
        defer { if devNull >= 0 { close(devNull) } }
        let process = ChildProcess(path: slirp4netns, arguments: [
            slirp4netns, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
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
