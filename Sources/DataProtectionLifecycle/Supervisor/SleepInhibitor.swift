import DataProtectionContainers
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Holds back the machine's sleep while an app has background tasks: a logind *delay* inhibitor
/// (`org.freedesktop.login1.Manager.Inhibit("sleep", who, why, "delay")`), taken the way
/// `systemd-inhibit --what=sleep --mode=delay` takes it — by running that tool, which keeps the
/// inhibitor's descriptor for as long as its command runs. The command is `cat` on a socket this
/// process holds (a socket, not a pipe: the byte sent is `MSG_NOSIGNAL`, so a tool that already
/// gave up never kills this process with `SIGPIPE`): a byte echoed back says the inhibitor is
/// held; closing the socket (or this process dying) ends `cat`, and logind sees the descriptor
/// close. Suspending the laptop then
/// waits for the tasks, up to logind's `InhibitDelayMaxSec`.
///
/// Without `systemd-inhibit` or logind (no system bus, a container), this says so once per
/// process and does nothing.
final class SleepInhibitor: Sendable {
    private let environment: [String: String]
    private let logger: Logger
    private let held = Mutex<Holder?>(nil)
    private static let warned = Mutex(false)

    private final class Holder: Sendable {
        let process: Process
        let input: FileHandle
        init(process: Process, input: FileHandle) {
            self.process = process
            self.input = input
        }
    }

    /// - Parameter environment: where `systemd-inhibit` finds the system bus
    ///   (`DBUS_SYSTEM_BUS_ADDRESS`; tests point it at a private bus).
    init(environment: [String: String], logger: Logger) {
        self.environment = environment
        self.logger = logger
    }

    /// Whether an inhibitor is being held (asked for and not released).
    var isHeld: Bool { held.withLock { $0 != nil } }

    /// Takes the inhibitor, if not held already. Returns at once; the tool runs on its own.
    func acquire(who: String, why: String) {
        held.withLock { holder in
            guard holder == nil else { return }
            guard let tool = SandboxRequirements.findInPath("systemd-inhibit", environment: environment) else {
                say("systemd-inhibit (systemd) is not installed: background tasks do not hold back sleep")
                return
            }
            guard let cat = SandboxRequirements.findInPath("cat", environment: environment) else { return }
            let process = Process()
            process.executableURL = URL(fileURLWithPath: tool)
            process.arguments = ["--what=sleep", "--mode=delay", "--who=\(who)", "--why=\(why)", cat]
            process.environment = environment
            var pair: [Int32] = [-1, -1]
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
                say(
                    "cannot make a socket for systemd-inhibit: \(String(cString: strerror(errno))); background tasks do not hold back sleep"
                )
                return
            }
            let input = FileHandle(fileDescriptor: pair[0], closeOnDealloc: true)
            let theirs = FileHandle(fileDescriptor: pair[1], closeOnDealloc: true)
            let output = Pipe(), errors = Pipe()
            process.standardInput = theirs
            process.standardOutput = output
            process.standardError = errors
            do { try process.run() } catch {
                say("cannot run systemd-inhibit: \(error); background tasks do not hold back sleep")
                return
            }
            try? theirs.close()   // the tool has its own copy
            holder = Holder(process: process, input: input)
            // One byte through cat means logind granted the inhibitor; the tool ending first
            // means it did not (the byte is then refused with EPIPE, never a SIGPIPE).
            var newline: UInt8 = 0x0A
            _ = send(pair[0], &newline, 1, Int32(MSG_NOSIGNAL))
            let logger = self.logger
            let thread = Thread { [weak self] in
                let echoed = output.fileHandleForReading.availableData
                if echoed.isEmpty {
                    process.waitUntilExit()
                    let why =
                        String(decoding: errors.fileHandleForReading.availableData, as: UTF8.self)
                        .split(separator: "\n").first.map(String.init) ?? "exit status \(process.terminationStatus)"
                    self?.say(
                        "logind did not grant a sleep inhibitor (\(why)): background tasks do not hold back sleep")
                } else {
                    logger.debug("holding a sleep delay inhibitor for \(who): \(why)")
                }
            }
            thread.start()
        }
    }

    /// Lets the inhibitor go (closing `cat`'s input ends it, and logind drops the inhibitor).
    func release() {
        guard
            let holder = held.withLock({ holder -> Holder? in
                defer { holder = nil }; return holder
            })
        else { return }
        try? holder.input.close()
        let process = holder.process
        Thread { process.waitUntilExit() }.start()
    }

    private func say(_ message: String) {
        let first = Self.warned.withLock { warned -> Bool in
            defer { warned = true }; return !warned
        }
        if first { logger.notice("\(message)") }
    }
}
