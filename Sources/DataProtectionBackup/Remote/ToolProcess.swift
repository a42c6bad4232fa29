import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

/// One run of an outside tool (rclone), spawned so that it can be stopped: it starts with every
/// signal at its default action (a Ctrl-C at the terminal reaches it as it reaches dpctl, which
/// ignores SIGINT while it stops cleanly) in this process's group, and a cancelled task sends
/// it SIGTERM. Waiting blocks a thread of its own, never one of the cooperative pool.
struct ToolProcess {
    /// How a run ended.
    struct Ending {
        /// The exit status, or 128 + the signal that ended it.
        var status: Int32
        var signalled: Bool
    }

    let pid: pid_t

    /// Starts `path ARGUMENTS` with standard input, output and error on the descriptors given
    /// (the caller closes its copies).
    /// - Throws: an `NSError` in the POSIX domain when it could not be started.
    init(_ path: String, _ arguments: [String], input: Int32, output: Int32, error: Int32) throws {
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        // An inherited "ignore SIGCHLD" would let the kernel reap the tool before it is waited for.
        var action = sigaction()
        if sigaction(SIGCHLD, nil, &action) == 0,
            action.__sigaction_handler.sa_handler.map({ unsafeBitCast($0, to: Int.self) == 1 }) == true
        {
            signal(SIGCHLD, SIG_DFL)   // SIG_IGN is handler 1
        }
        let sources = [input, output, error]
        do throws(Errno) { pid = try SystemCall.spawn(path, argv, environ, descriptors: sources) } catch {
            throw NSError(domain: NSPOSIXErrorDomain, code: Int(error.rawValue))
        }
    }

    /// Waits for the tool to end; a cancelled task sends it SIGTERM first.
    /// - Throws: `CancellationError` when the task was cancelled and the tool was stopped (one
    ///   that had ended by itself keeps its ending); an `NSError` when it cannot be waited for.
    func wait() async throws -> Ending {
        let child = pid
        // `state.ended` is set once the child has exited, before it is reaped: no signal ever
        // goes to a pid the kernel may have handed to another process.
        let state = Mutex((ended: false, stopped: false))
        let ending = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Result<Ending, NSError>, Never>) in
                Thread.detachNewThread {
                    var info = siginfo_t()
                    var result: Int32
                    repeat {
                        result = waitid(P_PID, id_t(child), &info, WEXITED | WNOWAIT)
                    } while result != 0 && errno == EINTR
                    guard result == 0 else {
                        continuation.resume(returning: .failure(NSError(domain: NSPOSIXErrorDomain, code: Int(errno))))
                        return
                    }
                    state.withLock { $0.ended = true }
                    var status: Int32 = 0
                    var reaped: pid_t
                    repeat { reaped = waitpid(child, &status, 0) } while reaped < 0 && errno == EINTR
                    guard reaped == child else {
                        continuation.resume(returning: .failure(NSError(domain: NSPOSIXErrorDomain, code: Int(errno))))
                        return
                    }
                    let signalled = (status & 0x7f) != 0
                    continuation.resume(
                        returning: .success(
                            Ending(
                                status: signalled ? 128 + (status & 0x7f) : (status >> 8) & 0xff, signalled: signalled))
                    )
                }
            }
        } onCancel: {
            state.withLock { state in
                if !state.ended {
                    kill(child, SIGTERM)
                    state.stopped = true
                }
            }
        }
        if state.withLock({ $0.stopped }) { throw CancellationError() }
        return try ending.get()
    }
}
