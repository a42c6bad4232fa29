import Foundation
import Glibc

/// A real server on loopback, run for one test and stopped with it. Spawned and reaped here
/// (`posix_spawn`, `waitpid`), not through Foundation's `Process`, whose reaping of a child that
/// runs for the whole test held up the reaping of the commands run meanwhile.
public final class LoopbackServer: @unchecked Sendable {
    public let pid: pid_t
    public let port: Int
    private var reaped = false

    /// Starts `executable ARGUMENTS` and reads its standard error until a line matches `ready`
    /// (its first capture group is the port, when `port` is nil): no waiting on the clock.
    public init(_ executable: String, _ arguments: [String], port: Int? = nil, ready: String) throws {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw ServerFailed(output: "pipe failed") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
        posix_spawn_file_actions_addclose(&actions, fds[0])
        posix_spawn_file_actions_addclose(&actions, fds[1])
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var child: pid_t = 0
        let spawned = posix_spawn(&child, executable, &actions, nil, argv, environ)
        close(fds[1])
        guard spawned == 0 else {
            close(fds[0])
            throw ServerFailed(output: "posix_spawn \(executable): \(String(cString: strerror(spawned)))")
        }
        pid = child
        let errors = FileHandle(fileDescriptor: fds[0], closeOnDealloc: true)
        let pattern = try NSRegularExpression(pattern: ready)
        var seen = ""
        var found: Int?
        while found == nil {
            let chunk = errors.availableData
            guard !chunk.isEmpty else { break }
            seen += String(decoding: chunk, as: UTF8.self)
            if let match = pattern.firstMatch(in: seen, range: NSRange(seen.startIndex..., in: seen)) {
                found = port ?? (match.numberOfRanges > 1 ? Range(match.range(at: 1), in: seen).flatMap { Int(seen[$0]) } : nil)
            }
        }
        guard let found else {
            Glibc.kill(child, SIGKILL)
            var status: Int32 = 0
            waitpid(child, &status, 0)
            throw ServerFailed(output: seen)
        }
        self.port = found
        // The rest of its log is read and dropped, so it never blocks on a full pipe.
        Thread.detachNewThread { while !errors.availableData.isEmpty {} }
    }

    public struct ServerFailed: Error { public var output: String }

    /// Kills the server (a cut connection, as far as its clients can tell) and reaps it.
    public func kill() {
        guard !reaped else { return }
        reaped = true
        Glibc.kill(pid, SIGKILL)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }

    deinit { kill() }

    /// rclone's WebDAV server over `directory`, on a port the kernel picks.
    public static func webDAV(serving directory: String) throws -> LoopbackServer {
        try LoopbackServer("/usr/bin/rclone", ["serve", "webdav", directory, "--addr", "127.0.0.1:0", "--dir-cache-time", "0s"],
                           ready: #"WebDav Server started on \[?http://127\.0\.0\.1:(\d+)/"#)
    }

    /// A free port on loopback (the kernel's pick, released for the server to take).
    public static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// An SFTP server on loopback: OpenSSH's sshd with a host key of its own, taking one user key
    /// for root, sftp-server behind it; keys, configuration and known_hosts in `keys`.
    public static func sftp(keysIn keys: String) throws -> LoopbackSFTP {
        try FileManager.default.createDirectory(atPath: keys, withIntermediateDirectories: true)
        for name in ["host", "user"] {
            let made = try ChildProcess.run("/usr/bin/ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", "\(keys)/\(name)"])
            guard made.status == 0 else { throw ServerFailed(output: made.err) }
        }
        try FileManager.default.copyItem(atPath: "\(keys)/user.pub", toPath: "\(keys)/authorized_keys")
        try FileManager.default.createDirectory(atPath: "/run/sshd", withIntermediateDirectories: true)
        let port = try freePort()
        let config = """
            Port \(port)
            ListenAddress 127.0.0.1
            HostKey \(keys)/host
            PidFile none
            AuthorizedKeysFile \(keys)/authorized_keys
            StrictModes no
            PermitRootLogin prohibit-password
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            Subsystem sftp /usr/lib/openssh/sftp-server

            """
        try Data(config.utf8).write(to: URL(fileURLWithPath: "\(keys)/sshd_config"))
        let server = try LoopbackServer("/usr/sbin/sshd", ["-D", "-e", "-f", "\(keys)/sshd_config"], port: port,
                                        ready: "Server listening on 127\\.0\\.0\\.1 port \(port)")
        let hostKey = try String(contentsOfFile: "\(keys)/host.pub", encoding: .utf8).split(separator: " ").prefix(2).joined(separator: " ")
        try Data("[127.0.0.1]:\(port) \(hostKey)\n".utf8).write(to: URL(fileURLWithPath: "\(keys)/known_hosts"))
        return LoopbackSFTP(server: server, keys: keys)
    }
}

/// ``LoopbackServer/sftp(keysIn:)``'s server and how a client reaches it.
public struct LoopbackSFTP: Sendable {
    public let server: LoopbackServer
    public let keys: String
    public var knownHosts: String { keys + "/known_hosts" }
    public var userKey: String { keys + "/user" }
    /// What makes rclone's SFTP client use the user key and check the host key (no agent).
    public var environment: [String: String] {
        ["RCLONE_SFTP_KNOWN_HOSTS_FILE": knownHosts, "RCLONE_SFTP_KEY_FILE": userKey, "SSH_AUTH_SOCK": ""]
    }
    /// OpenSSH's client command for this server (as restic's `-o sftp.command=` takes it).
    public var sshCommand: String {
        "ssh -p \(server.port) -i \(userKey) -o IdentitiesOnly=yes -o UserKnownHostsFile=\(knownHosts) -o BatchMode=yes root@127.0.0.1 -s sftp"
    }
}
