import ArgumentParser
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#endif

@main
struct Keybagd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keybagd",
        abstract: "Hold a data root's class keys, so one lock state governs every process.",
        usage: "keybagd [--root <dir>] [<options>]",
        discussion: """
            keybagd plays the part of iOS's Secure Enclave and keybagd for one user and one data root. \
            It starts before first unlock (a restart is a reboot). Processes of the same user that open \
            the root find it through its socket and use it instead of their own keybag:

              keybagd --root ~/.local/share/dataprotection &
              dpctl unlock     # the passcode from the terminal, or --passcode-file FILE
              dpctl lock       # every process loses class A after the grace period

            The socket is $XDG_RUNTIME_DIR/dataprotection/keybagd-<root hash>.sock (mode 0600 in a 0700 \
            directory); connections from other users are refused. Key pages are locked in memory and \
            the process cannot be dumped or traced by other processes of the user.
            """,
        version: DataProtectionVersion.string)

    @Option(
        name: .long,
        help: ArgumentHelp("The data root (default: $DP_ROOT, else $XDG_DATA_HOME/dataprotection).", valueName: "dir"))
    var root: String?

    @Option(name: .long, help: ArgumentHelp("Lock after this many seconds without a request.", valueName: "seconds"))
    var idleLock: Double?

    @Option(
        name: .long,
        help: ArgumentHelp("Connections served at once; one more is told \"busy\" and closed.", valueName: "n"))
    var maxConnections = 256

    @Flag(
        name: .long,
        help: ArgumentHelp("Tests only: time stands still until a client advances it.", visibility: .hidden))
    var manualClock = false

    @Flag(name: .long, help: "Log each connection and lock change to standard error.")
    var verbose = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Stop when process PID ends (a keybagd started for one `dpctl mount`).", valueName: "pid",
            visibility: .hidden))
    var stopWithProcess: Int32?

    func validate() throws {
        if let idleLock, !(idleLock.isFinite && idleLock > 0 && idleLock <= 1e9) {
            throw ValidationError("--idle-lock takes a number of seconds greater than 0")
        }
        guard (1...65_536).contains(maxConnections) else { throw ValidationError("--max-connections takes 1 to 65536") }
    }

    func run() async throws {
        HeapHygiene.reexecIfNeeded()
        let level: Logger.Level = verbose ? .info : .notice
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "keybagd")
        signal(SIGPIPE, SIG_IGN)
        // Memory hygiene: no core dumps or ptrace by the user's other processes. Class keys are
        // mlock'ed one by one where they live (EmbeddedKeybag); with an unlimited RLIMIT_MEMLOCK
        // every page is locked as well.
        if (try? SystemCall.setNotDumpable()) == nil { logger.warning("could not make the process non-dumpable") }
        do { _ = try SystemCall.lockAllMemory() } catch { logger.warning("mlockall failed: \(error)") }
        let clock: any KeybagClock = manualClock ? ManualClock(start: Date()) : SystemClock()
        let keybag: EmbeddedKeybag
        let resolved: String
        do {
            resolved = try DataRoot.resolve(root)
            keybag = try await EmbeddedKeybag.open(root: resolved, clock: clock)
        } catch {
            FileHandle.standardError.write(Data("keybagd: \(error)\n".utf8))
            throw ExitCode(1)
        }
        let daemon: KeybagdServer
        do {
            let socketPath = KeybagSocket.path(forRoot: resolved)
            Self.rootLock = try KeybagDaemonLock.acquire(root: resolved, socketPath: socketPath)
            daemon = try KeybagdServer(
                keybag: keybag, socketPath: KeybagSocket.path(forRoot: resolved),
                manualClock: clock as? ManualClock, maxConnections: maxConnections)
        } catch {
            FileHandle.standardError.write(Data("keybagd: \(error)\n".utf8))
            throw ExitCode(1)
        }
        for sig in [SIGTERM, SIGINT, SIGHUP] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig)
            source.setEventHandler { Self.stop(daemon, logger) }
            source.resume()
            Self.signalSources.append(source)
        }
        if let stopWithProcess {
            // A process descriptor: readable once that process has ended, whatever ended it (a
            // SIGKILL included), and never another process that later gets its number — checked
            // to be the parent that started this daemon, not a process that took its number.
            guard let process = try? SystemCall.pidfdOpen(stopWithProcess), getppid() == stopWithProcess else {
                FileHandle.standardError.write(
                    Data("keybagd: process \(stopWithProcess) is not running (--stop-with-process)\n".utf8))
                throw ExitCode(1)
            }
            let thread = Thread {
                var ended = pollfd(fd: process, events: Int16(POLLIN), revents: 0)
                while poll(&ended, 1, -1) < 0 && errno == EINTR {}
                logger.notice("process \(stopWithProcess) ended")
                Self.stop(daemon, logger)
            }
            thread.start()
        }
        let watcher = DesktopLockWatcher()
        Self.watcher = watcher
        watcher.start { signal in
            Task {
                switch signal {
                case .screenSaverActive(true), .sessionLocked(true), .prepareForSleep(true):
                    logger.notice("\(signal): locking")
                    await keybag.lock()
                case .screenSaverActive(false), .sessionLocked(false):
                    if await keybag.resumeWithinGrace() {
                        logger.notice("\(signal) within the grace period: unlocked again")
                    } else {
                        logger.notice("\(signal): the keybag stays as it is until `dpctl unlock`")
                    }
                case .prepareForSleep(false):
                    break
                }
            }
        }
        if let idleLock { Task { await daemon.lockWhenIdle(after: idleLock) } }
        try await daemon.serve()
    }

    /// Stops serving, drops the class keys and exits.
    static func stop(_ daemon: KeybagdServer, _ logger: Logger) -> Never {
        Self.watcher?.stop()
        daemon.stop()
        logger.notice("stopped; class keys dropped")
        Glibc.exit(0)
    }

    nonisolated(unsafe) static var signalSources: [any DispatchSourceSignal] = []
    nonisolated(unsafe) static var watcher: DesktopLockWatcher?
    /// The root's daemon lock (`ROOT/keybagd.lock`), held open for the daemon's life.
    nonisolated(unsafe) static var rootLock: Int32 = -1
}
