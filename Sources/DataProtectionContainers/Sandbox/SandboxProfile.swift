import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The sandbox of one launch, as two argument lists (FORMAT.md §10.2): bubblewrap's, which builds
/// a mount namespace holding only what the app may see, and `dp-sandbox-exec`'s, which then
/// restricts the app's rights on what it sees with Landlock.
///
/// What the app sees:
/// - its container, read-write below `Documents`, `Library` and `tmp`; the container's root
///   read-only (as on iOS); `Documents/Inbox` (the container's `.Inbox`) readable and
///   deletable, not writable; the metadata file read-only (a read-only mount: not even chmod);
/// - its groups' containers read-write, but no link or rename across directories (a group file
///   cannot be linked into the container and kept after leaving the group);
/// - `/usr` (and the `/bin`, `/lib`… links into it), the Swift runtime and the command's own
///   executable, read and execute; a few files of `/etc` (users, name resolution, time zone,
///   certificates, loader cache), read-only;
/// - its own `/proc` (a new pid namespace), a minimal `/dev`, a private `/tmp`.
///
/// Nothing else: no other container, no device secret, no keybag, no daemon socket (they are
/// not mounted), no home directory. All capabilities are dropped, the app runs in new user,
/// pid, IPC and UTS namespaces and a new session (no terminal injection), can make no user
/// namespace of its own (`--disable-userns`), runs under `dp-sandbox-exec`'s system-call filter
/// (no key calls, new namespaces, mounts, ptrace, bpf, io_uring …) with a new empty session
/// keyring, and dies with its supervisor. It always has a network namespace of its own;
/// abstract Unix sockets and signals are also scoped to the sandbox (Landlock ABI 6). Its
/// tasks budget is set inside (``AppResourceLimits``).
package struct SandboxProfile: Sendable {
    var requirements: SandboxRequirements
    var app: AppContainer
    var groups: [GroupContainer]
    /// The program, resolved to a path outside the sandbox.
    var executable: String
    var arguments: [String]
    /// The environment the app gets (built by the supervisor).
    var environment: [String: String]
    /// The app's budgets: its tasks limit is set inside (``AppResourceLimits``).
    var limits: AppResourceLimits
    /// Where the containers are bound from: the protected file system serving them (the app
    /// sees them at their own paths), or `nil` for the directories themselves.
    var servedFrom: (@Sendable (String) -> String)?

    /// Descriptors the app inherits (numbers inside the sandbox).
    static let supervisorDescriptor: Int32 = 3
    static let statusDescriptor: Int32 = 4
    static let stderrDescriptor: Int32 = 5
    /// bubblewrap's `--info-fd` and `--block-fd`: the supervisor sets the sandbox up before the app starts.
    static let infoDescriptor: Int32 = 6
    static let blockDescriptor: Int32 = 7

    /// `/etc` entries an ordinary program needs; anything else of `/etc` is not there.
    static let etcEntries = [
        "passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "localtime", "timezone",
        "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "alternatives",
        "os-release", "mime.types", "locale.alias",
    ]

    package init(
        requirements: SandboxRequirements, app: AppContainer, groups: [GroupContainer], executable: String,
        arguments: [String], environment: [String: String], limits: AppResourceLimits,
        servedFrom: (@Sendable (String) -> String)? = nil
    ) {
        self.servedFrom = servedFrom
        self.requirements = requirements
        self.app = app
        self.groups = groups
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.limits = limits
    }

    /// bubblewrap's arguments, ending with `dp-sandbox-exec`'s and the program's. Without
    /// `landlock`, the program follows bubblewrap directly and nothing waits for the supervisor
    /// (the benchmark's "bubblewrap alone").
    package func bubblewrapArguments(landlock: Bool = true) -> [String] {
        var a = [
            "--unshare-user", "--disable-userns", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        ]
        // A network namespace of its own, always: no host loopback service, no host abstract
        // socket, nothing of the host's /proc/net (iOS gives an app no view of other processes).
        a.append("--unshare-net")
        // The sandbox waits (before the app runs) until the supervisor has set its inotify budget
        // and, with the network entitlement, attached user-mode networking to it. (Not for
        // bubblewrap alone, which nothing sets up.)
        if landlock { a += ["--info-fd", String(Self.infoDescriptor), "--block-fd", String(Self.blockDescriptor)] }
        // The system, read-only.
        a += ["--ro-bind", "/usr", "/usr"]
        for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let path = "/" + top
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: path) {
                a += ["--symlink", target, path]
            } else if directoryExists(path) {
                a += ["--ro-bind", path, path]
            }
        }
        for entry in Self.etcEntries { a += ["--ro-bind-try", "/etc/" + entry, "/etc/" + entry] }
        a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for directory in runtimeDirectories() { a += ["--ro-bind", directory, directory] }
        if !executable.hasPrefix("/usr/") { a += ["--ro-bind", executable, executable] }
        a += ["--ro-bind", requirements.sandboxExec, requirements.sandboxExec]
        // The containers, at the paths they have outside (so paths mean the same inside and out),
        // from the protected file system when one serves them.
        let source = servedFrom ?? { $0 }
        let container = app.url.path
        a += ["--bind", source(container), container]
        a += ["--ro-bind", source(metadataPath(container)), metadataPath(container)]
        for group in groups {
            a += ["--bind", source(group.url.path), group.url.path]
            a += ["--ro-bind", source(metadataPath(group.url.path)), metadataPath(group.url.path)]
        }
        a += ["--chdir", container, "--clearenv"]
        for (key, value) in environment.sorted(by: { $0.key < $1.key }) { a += ["--setenv", key, value] }
        a +=
            landlock
            ? ["--", requirements.sandboxExec] + landlockArguments() + ["--", executable] + arguments
            : ["--", executable] + arguments
        return a
    }

    /// Refuses a layout where a system rule would cover a container (a data root under `/usr`,
    /// say): Landlock's rights add up along a path, so the container would get the system's.
    func validate() throws {
        let system = ["/usr", "/etc", "/proc", "/dev"] + runtimeDirectories()
        for container in [app.url.path] + groups.map(\.url.path) {
            if let covering = system.first(where: { container == $0 || container.hasPrefix($0 + "/") }) {
                throw ContainerError.sandboxUnavailable(
                    "the container \(container) is below \(covering), which apps may read: move the data root elsewhere"
                )
            }
        }
    }

    /// `dp-sandbox-exec`'s arguments (before `--`).
    func landlockArguments() -> [String] {
        var a = ["--status-fd", String(Self.statusDescriptor), "--stderr-fd", String(Self.stderrDescriptor)]
        if requirements.scopesSockets { a.append("--scope") }
        a += ["--max-tasks", String(limits.tasks)]
        // No rule on /tmp (the private one stays read-only; TMPDIR is the container's tmp): a rule
        // there would reach a container mounted below it, since rights add up along a path.
        var rules = [("exec", "/usr"), ("read", "/etc"), ("read", "/proc"), ("device", "/dev")]
        for directory in runtimeDirectories() { rules.append(("exec", directory)) }
        if !executable.hasPrefix("/usr/") { rules.append(("exec", executable)) }
        let container = app.url.path
        rules.append(("read", container))
        // Sockets and FIFOs only in tmp (TMPDIR: Python's multiprocessing, asyncio …), never among data.
        for directory in AppContainer.writableDirectories {
            rules.append((directory == "tmp" ? "scratch" : "write", container + "/" + directory))
        }
        rules.append(("inbox", app.inboxStorage.path))
        for group in groups { rules.append(("shared", group.url.path)) }
        for (rights, path) in rules { a += ["--allow", rights + ":" + path] }
        return a
    }

    private func metadataPath(_ container: String) -> String {
        container + "/" + DataRootLayout.containerMetadataFileName
    }

    /// Where the Swift runtime this process uses lives, when outside `/usr` (a toolchain in
    /// `/opt`): an app built with it needs it to start. Read once per process.
    func runtimeDirectories() -> [String] { Self.runtime }

    private static let runtime: [String] = {
        guard let data = try? FileHandle(forReadingFrom: URL(fileURLWithPath: "/proc/self/maps")).readToEnd() else {
            return []
        }   // size 0 in stat: read to the end
        let maps = String(decoding: data, as: UTF8.self)
        var found = Set<String>()
        for line in maps.split(separator: "\n")
        where line.hasSuffix("/libswiftCore.so") || line.contains("/libswiftCore.so ") {
            guard let slash = line.firstIndex(of: "/") else { continue }
            let directory = URL(fileURLWithPath: String(line[slash...])).deletingLastPathComponent().path
            if !directory.hasPrefix("/usr/") { found.insert(directory) }
        }
        return found.sorted()
    }()

    private func directoryExists(_ path: String) -> Bool {
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) && isDirectory.boolValue
    }
}
