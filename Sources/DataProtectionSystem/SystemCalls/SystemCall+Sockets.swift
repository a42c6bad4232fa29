import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Pipes and Unix sockets.
extension SystemCall {
    /// `pipe2(O_CLOEXEC)`: both ends close-on-exec from the start.
    package static func pipe2CloseOnExec() throws(Errno) -> (read: Int32, write: Int32) {
        var ends: [Int32] = [-1, -1]
        _ = try checked(cshim_pipe_cloexec(&ends))
        return (ends[0], ends[1])
    }

    /// `accept4(SOCK_CLOEXEC)`: the connection, close-on-exec from the start.
    package static func accept4CloseOnExec(_ listener: Int32) throws(Errno) -> Int32 {
        try checked(cshim_accept_cloexec(listener))
    }

    /// `getsockopt(SO_PEERCRED)`: the peer's process and user.
    package static func peerCredentials(_ socket: Int32) throws(Errno) -> (pid: pid_t, uid: uid_t) {
        var pid: Int32 = 0, uid: UInt32 = 0
        _ = try checked(cshim_peer_credentials(socket, &pid, &uid))
        return (pid, uid)
    }

    /// `sendmsg` of `data` (at least one byte) with `descriptor` attached (`SCM_RIGHTS`): the
    /// bytes sent.
    package static func sendmsg(_ socket: Int32, _ data: UnsafeRawBufferPointer, descriptor: Int32) throws(Errno) -> Int
    {
        try checked(cshim_send_descriptor(socket, descriptor, data.baseAddress, UInt(data.count)))
    }

    /// `recvmsg(MSG_CMSG_CLOEXEC)` into `buffer`: the bytes received (0 at the end of the
    /// stream) and the one descriptor attached, if any (more are closed; descriptors that did
    /// not fit: `EMSGSIZE`, none kept).
    package static func recvmsg(
        _ socket: Int32, _ buffer: UnsafeMutableRawBufferPointer
    ) throws(Errno) -> (count: Int, descriptor: Int32?) {
        var fd: Int32 = -1
        let n = try checked(cshim_receive_descriptor(socket, buffer.baseAddress, UInt(buffer.count), &fd))
        return (n, fd >= 0 ? fd : nil)
    }
}
