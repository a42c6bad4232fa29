import DataProtectionSystem
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The accept loop of a Unix-socket server, with the bounds a server used by every process of a
/// user needs (as ssh-agent and gpg-agent have them): a thread per connection, at most
/// `maxConnections` at once (one more gets `busyFrame` and is closed), a send timeout on every
/// connection, and a back-off — not a spin — when `accept` runs out of descriptors or memory.
///
/// ```swift
/// let server = IPCServer(listener: try UnixSocket.listen(on: path), maxConnections: 256, busyFrame: frame, logger: logger)
/// server.serve { fd in handle(fd) }      // never returns; `handle` closes `fd`
/// ```
package final class IPCServer: Sendable {
    package let listener: Int32
    package let maxConnections: Int
    /// Seconds a reply may wait for a peer to read before that connection is closed.
    package let sendTimeout: Int
    /// The frame payload a connection over the bound receives before it is closed.
    private let busyFrame: [UInt8]
    private let logger: Logger
    private let connections = Mutex(0)

    package init(listener: Int32, maxConnections: Int, sendTimeout: Int = 5, busyFrame: [UInt8], logger: Logger) {
        self.listener = listener
        self.maxConnections = maxConnections
        self.sendTimeout = sendTimeout
        self.busyFrame = busyFrame
        self.logger = logger
    }

    /// Accepts connections until the process ends; `handle` runs on the connection's own thread
    /// and must close the descriptor it is given.
    package func serve(_ handle: @escaping @Sendable (Int32) -> Void) -> Never {
        var backoff: UInt32 = 10_000   // µs, doubled up to 1 s while accept cannot get a descriptor
        var lastComplaint: ContinuousClock.Instant?
        while true {
            let client: Int32
            do throws(Errno) { client = try SystemCall.accept4CloseOnExec(listener) } catch {
                let err = error.rawValue
                if err == EINTR || err == ECONNABORTED { continue }
                // Out of descriptors or memory: say so once a minute, wait, try again — never spin.
                if lastComplaint.map({ ContinuousClock.now - $0 > .seconds(60) }) ?? true {
                    logger.error("accept: \(String(cString: strerror(err))); backing off (said once a minute)")
                    lastComplaint = .now
                }
                usleep(backoff)
                backoff = min(backoff * 2, 1_000_000)
                continue
            }
            backoff = 10_000
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            UnixSocket.setTimeouts(client, seconds: sendTimeout, receiving: false)
            let admitted = connections.withLock { count in
                guard count < maxConnections else { return false }
                count += 1
                return true
            }
            guard admitted else {
                refuse(client, payload: busyFrame)
                continue
            }
            let thread = Thread { [self] in
                handle(client)
                connections.withLock { $0 -= 1 }
            }
            thread.name = "ipc connection"
            thread.stackSize = 256 * 1024
            thread.start()
        }
    }

    /// One frame, then close. Closing with the peer's request unread would reset the
    /// connection and could drop the frame, so with `waitForPeer` (on a connection's own
    /// thread) the request is drained first, for a second at most; the accept loop never waits.
    package static func refuse(_ fd: Int32, payload: [UInt8], waitForPeer: Bool = false) {
        let frame = IPCFrame.header(payload.count) + payload
        _ = frame.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
        shutdown(fd, Int32(SHUT_WR))
        if waitForPeer {
            UnixSocket.setTimeouts(fd, seconds: 1, sending: false)
            var sink = [UInt8](repeating: 0, count: 4096)
            var total = 0
            while total < 70_000 {
                let n = sink.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                total += n
            }
        }
        close(fd)
    }

    private func refuse(_ fd: Int32, payload: [UInt8]) { Self.refuse(fd, payload: payload) }
}
