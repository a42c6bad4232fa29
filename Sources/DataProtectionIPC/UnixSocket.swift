import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Unix stream sockets the way DataProtection's servers use them: a 0700 directory of the user,
/// a 0600 socket, peers checked with `SO_PEERCRED`, systemd socket activation, and descriptors
/// passed with `SCM_RIGHTS` (a sandboxed app is handed open files, never paths).
package enum UnixSocket {
    /// Connects to `path`; `nil` when nothing listens there. Sends and receives time out after
    /// `timeout` seconds, so a hung server gives an error, not a hang.
    package static func connect(_ path: String, timeout: Int = 5) -> Int32? {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_un()
        guard fill(&address, path) else { close(fd); return nil }
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard ok == 0 else { close(fd); return nil }
        setTimeouts(fd, seconds: timeout)
        return fd
    }

    /// Why a socket directory must not be trusted by a client of this user, or `nil` when it can
    /// be (or does not exist: nothing listens there): a real directory (not a link), of this
    /// user, closed to others (0700). Anyone could have made it first, in `/tmp` above all.
    package static func distrustedDirectory(_ directory: String) -> String? {
        var info = stat()
        guard lstat(directory, &info) == 0 else { return nil }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "\(directory) is not a directory" }
        guard info.st_uid == getuid() else {
            return "\(directory) belongs to uid \(info.st_uid), not to this user (uid \(getuid()))"
        }
        guard info.st_mode & 0o077 == 0 else {
            return "\(directory) is open to other users (mode \(String(info.st_mode & 0o777, radix: 8)))"
        }
        return nil
    }

    /// Connects as a client that will send secrets: the directory must be trusted
    /// (``distrustedDirectory(_:)``), the socket a socket of this user, and the peer a process of
    /// this user (`SO_PEERCRED`) — checked before anything is sent. `nil` when nothing listens.
    ///
    /// - Throws: ``IPCError`` saying which check failed; nothing was sent.
    package static func connectTrusted(_ path: String, timeout: Int = 5) throws -> Int32? {
        let directory = (path as NSString).deletingLastPathComponent
        if let why = distrustedDirectory(directory) {
            throw IPCError("refused to connect to \(path): \(why); nothing was sent")
        }
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        guard info.st_mode & S_IFMT == S_IFSOCK, info.st_uid == getuid() else {
            throw IPCError("refused to connect to \(path): not a socket of this user; nothing was sent")
        }
        guard let fd = connect(path, timeout: timeout) else { return nil }
        guard let peer = peerCredentials(fd), peer.uid == getuid() else {
            let who = peerCredentials(fd).map { "uid \($0.uid), pid \($0.pid)" } ?? "an unknown peer"
            close(fd)
            throw IPCError(
                "refused to talk to \(path): it is served by \(who), not by this user (uid \(getuid())); nothing was sent"
            )
        }
        return fd
    }

    /// `SO_RCVTIMEO` and `SO_SNDTIMEO` (0: none).
    package static func setTimeouts(_ fd: Int32, seconds: Int, sending: Bool = true, receiving: Bool = true) {
        var tv = timeval(tv_sec: seconds, tv_usec: 0)
        if receiving { setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size)) }
        if sending { setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size)) }
    }

    package static func fill(_ address: inout sockaddr_un, _ path: String) -> Bool {
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.initializeMemory(as: UInt8.self, repeating: 0)
            raw.copyBytes(from: bytes)
        }
        return true
    }

    /// The peer's user and process ids (`SO_PEERCRED`), as the kernel saw them at connect.
    package static func peerCredentials(_ fd: Int32) -> (uid: uid_t, pid: pid_t)? {
        guard let peer = try? SystemCall.peerCredentials(fd) else { return nil }
        return (peer.uid, peer.pid)
    }

    /// Creates the 0700 directory (refusing one another user owns or others can enter), removes
    /// a stale socket (refusing to start when a live server answers there), binds with mode 0600.
    package static func listen(on path: String, backlog: Int32 = 64) throws -> Int32 {
        let directory = (path as NSString).deletingLastPathComponent
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw IPCError("cannot create \(directory): \(String(cString: strerror(errno)))")
        }
        var info = stat()
        guard lstat(directory, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            throw IPCError("\(directory) is not a directory")
        }
        guard info.st_uid == getuid() else {
            throw IPCError("\(directory) belongs to uid \(info.st_uid), not to this user")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw IPCError(
                "\(directory) is open to other users (mode \(String(info.st_mode & 0o777, radix: 8))); it must be 0700")
        }
        if let fd = connect(path, timeout: 1) {
            close(fd)
            throw IPCError("another server already listens on \(path)")
        }
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw IPCError("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_un()
        guard fill(&address, path) else { close(fd); throw IPCError("socket path too long: \(path)") }
        let previous = umask(0o177)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        umask(previous)
        guard bound == 0 else { close(fd); throw IPCError("bind \(path): \(String(cString: strerror(errno)))") }
        chmod(path, 0o600)
        guard Glibc.listen(fd, backlog) == 0 else {
            close(fd); throw IPCError("listen: \(String(cString: strerror(errno)))")
        }
        return fd
    }

    /// The listening socket systemd passed (the `sd_listen_fds` protocol: `LISTEN_PID` is this
    /// process, `LISTEN_FDS` is 1, the socket is fd 3), after checking it is a Unix stream
    /// socket bound to `expected` in a 0700 directory of this user; `nil` without one.
    package static func activatedSocket(expected path: String) throws -> Int32? {
        let environment = ProcessInfo.processInfo.environment
        guard let pid = environment["LISTEN_PID"], pid == String(getpid()), let count = environment["LISTEN_FDS"] else {
            return nil
        }
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDS")
        unsetenv("LISTEN_FDNAMES")
        guard count == "1" else {
            throw IPCError("systemd passed \(count) sockets; exactly one is taken (ListenStream=\(path))")
        }
        let fd: Int32 = 3
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        var type: Int32 = 0
        var typeLength = socklen_t(MemoryLayout<Int32>.size)
        guard named == 0, address.sun_family == sa_family_t(AF_UNIX),
            getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &typeLength) == 0, type == Int32(SOCK_STREAM.rawValue)
        else {
            throw IPCError("the socket systemd passed is not a Unix stream socket")
        }
        let bound = withUnsafeBytes(of: address.sun_path) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        guard bound == path else {
            throw IPCError(
                "systemd passed a socket on \(bound), but this server's socket is \(path); fix ListenStream=")
        }
        let directory = (path as NSString).deletingLastPathComponent
        var info = stat()
        guard lstat(directory, &info) == 0, info.st_uid == getuid(), info.st_mode & 0o077 == 0 else {
            throw IPCError("\(directory) must be a 0700 directory of this user (DirectoryMode=0700)")
        }
        chmod(path, 0o600)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return fd
    }

    /// Sends `descriptor` with one byte of `message` data (`SCM_RIGHTS`): the peer gets its own
    /// descriptor for the same open file, with the same access mode — a read-only descriptor
    /// stays read-only, whatever the peer asks of it.
    package static func send(descriptor: Int32, over socket: Int32, message: [UInt8] = [0]) throws {
        precondition(!message.isEmpty)
        let sent = message.withUnsafeBytes { bytes -> Result<Int, Errno> in
            do throws(Errno) { return .success(try SystemCall.sendmsg(socket, bytes, descriptor: descriptor)) } catch {
                return .failure(error)
            }
        }
        let n = try sent.mapError { IPCError("sendmsg: \($0.description)") }.get()
        guard n == message.count else { throw IPCError("sendmsg: sent \(n) of \(message.count) bytes") }
    }

    /// Receives a message of at most `capacity` bytes and the descriptor sent with it (`nil`
    /// when none was); the descriptor is close-on-exec. End of stream is an error.
    package static func receiveDescriptor(
        from socket: Int32, capacity: Int = 1
    ) throws -> (message: [UInt8], descriptor: Int32?) {
        var buffer = [UInt8](repeating: 0, count: max(1, capacity))
        let received = buffer.withUnsafeMutableBytes { bytes -> Result<(count: Int, descriptor: Int32?), Errno> in
            do throws(Errno) { return .success(try SystemCall.recvmsg(socket, bytes)) } catch { return .failure(error) }
        }
        let (n, fd) = try received.mapError { IPCError("recvmsg: \($0.description)") }.get()
        guard n > 0 else { throw IPCError("connection closed") }
        return (Array(buffer[0..<n]), fd)
    }
}
