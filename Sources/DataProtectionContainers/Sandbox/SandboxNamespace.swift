import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The sandbox bubblewrap has built, seen from outside while it waits before the app starts
/// (`--info-fd`, `--block-fd`; FORMAT.md §10.2): what the supervisor sets up in it then — the
/// app's inotify budget, and with the network entitlement its user-mode network — is in force
/// from the app's first instruction.
struct SandboxNamespace {
    /// The sandbox's first process, as the host sees it. Its user namespace is the app's own
    /// (`--disable-userns` nests it in the one bubblewrap made).
    let pid: pid_t

    /// Reads the process id bubblewrap writes on `info` (`{"child-pid": N, …}`).
    static func read(info: Pipe2) throws -> SandboxNamespace {
        info.closeWriteEnd()
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1024)
        while !text.contains(UInt8(ascii: "}")), text.count < 8192 {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(info.read, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            text += buffer[0..<n]
        }
        // `"child-pid": N`, read by hand: a regular expression's first use costs a millisecond
        // of every launch.
        let key = Array(#""child-pid""#.utf8)
        guard let start = text.indices.first(where: { text[$0...].starts(with: key) }) else {
            throw ContainerError.launchFailed("bubblewrap did not say which process the sandbox is")
        }
        var digits = text[(start + key.count)...].drop {
            $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t")
        }
        digits = digits.prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
        guard !digits.isEmpty, digits.count <= 9, let pid = pid_t(String(decoding: digits, as: UTF8.self)), pid > 0
        else {
            throw ContainerError.launchFailed("bubblewrap did not say which process the sandbox is")
        }
        return SandboxNamespace(pid: pid)
    }

    /// Opens the app's user namespace (`/proc/PID/ns/user`).
    func openUserNamespace() throws -> Int32 {
        let fd = open("/proc/\(pid)/ns/user", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw ContainerError.launchFailed("the sandbox's user namespace: \(String(cString: strerror(errno)))")
        }
        return fd
    }

    /// Gives the app's user namespace its own inotify budget (``SystemCall/limitInotify(_:instances:watches:)``: a
    /// forked
    /// child — one thread, as `setns` needs; this process has many — joins it and sets
    /// `/proc/sys/user/max_inotify_instances` and `max_inotify_watches` there).
    func limitInotify(_ limits: AppResourceLimits) throws {
        let namespace = try openUserNamespace()
        defer { close(namespace) }
        do throws(SystemCall.InotifyLimitError) {
            try SystemCall.limitInotify(namespace, instances: limits.inotifyInstances, watches: limits.inotifyWatches)
        } catch {
            let steps = [
                "starting a helper", "joining the sandbox's user namespace", "max_inotify_instances",
                "max_inotify_watches",
            ]
            let what = steps[Int(min(max(error.step, 0), 3))]
            throw ContainerError.launchFailed(
                "the app's inotify budget could not be set: \(what): \(error.errno.description)")
        }
    }
}
