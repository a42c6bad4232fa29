import DataProtectionSystem
import Foundation
import Synchronization
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// A child started with exactly the descriptors it should have (``SystemCall/spawn(_:_:_:descriptors:)``: the listed
/// ones as 0, 1, 2…, every other closed — nothing of the supervisor leaks into the app), from a
/// thread that lives until it has been reaped: a parent-death signal set in the child
/// (bubblewrap's `--die-with-parent`) fires when the *thread* that started it ends.
final class ChildProcess: Sendable {
    let path: String
    let arguments: [String]
    let environment: [String: String]
    let descriptors: [Int32]
    private let state = Mutex<(status: Int32?, waiters: [CheckedContinuation<Int32, Never>])>((nil, []))
    private let started = Mutex<pid_t?>(nil)

    /// The child's process id, once started.
    var pid: pid_t? { started.withLock { $0 } }

    init(path: String, arguments: [String], environment: [String: String], descriptors: [Int32]) {
        self.path = path
        self.arguments = arguments
        self.environment = environment
        self.descriptors = descriptors
    }

    /// Starts the child, born in `birthplace` when given; returns once it runs the program (or
    /// throws why it could not), and whether it was born in every cgroup of `birthplace`.
    @discardableResult
    func start(in birthplace: SystemCall.Birthplace? = nil) throws -> Bool {
        let started = DispatchSemaphore(value: 0)
        let failure = Mutex<Int32>(0)
        let placed = Mutex(false)
        let thread = Thread { [self] in
            var pid: pid_t = 0
            var inside: Int32 = 0
            let error = spawn(&pid, in: birthplace, placed: &inside)
            placed.withLock { $0 = inside == 1 }
            if error != 0 {
                failure.withLock { $0 = error }
                started.signal()
                return
            }
            self.started.withLock { $0 = pid }
            started.signal()
            var raw: Int32 = 0
            while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
            let code: Int32 = (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
            let waiters = state.withLock { state -> [CheckedContinuation<Int32, Never>] in
                state.status = code
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume(returning: code) }
        }
        thread.name = "app child"
        thread.start()
        started.wait()
        let error = failure.withLock { $0 }
        guard error == 0 else { throw ContainerError.launchFailed("\(path): \(String(cString: strerror(error)))") }
        return placed.withLock { $0 }
    }

    private func spawn(_ pid: inout pid_t, in birthplace: SystemCall.Birthplace?, placed: inout Int32) -> Int32 {
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.sorted { $0.key < $1.key }.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        do throws(Errno) {
            if let birthplace {
                let spawned = try SystemCall.spawn(path, argv, envp, descriptors: descriptors, in: birthplace)
                (pid, placed) = (spawned.pid, spawned.placed ? 1 : 0)
            } else {
                pid = try SystemCall.spawn(path, argv, envp, descriptors: descriptors)
            }
            return 0
        } catch {
            return error.rawValue
        }
    }

    /// The child's exit status (128 + signal when killed), once it has ended.
    func exitStatus() async -> Int32 {
        await withCheckedContinuation { continuation in
            let done = state.withLock { state -> Int32? in
                if let status = state.status { return status }
                state.waiters.append(continuation)
                return nil
            }
            if let done { continuation.resume(returning: done) }
        }
    }
}

/// A connected pair of Unix stream sockets: the supervisor's end and the app's.
final class SocketPair: Sendable {
    let supervisor: Int32
    let app: Int32
    private let appOpen = Mutex(true)

    init() throws {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0 else {
            throw ContainerError.launchFailed("socketpair: \(String(cString: strerror(errno)))")
        }
        supervisor = fds[0]
        app = fds[1]
    }

    func closeAppEnd() { appOpen.withLock { if $0 { close(app); $0 = false } } }
    deinit { closeAppEnd() }
}

/// A pipe whose ends are close-on-exec (a child gets one only by being handed it).
final class Pipe2: Sendable {
    let read: Int32
    let write: Int32
    private let writeOpen = Mutex(true)

    init() throws {
        // Close-on-exec from the start: a child another thread spawns meanwhile (children of this
        // library are spawned with every other descriptor closed; not every program's are) never
        // holds an end, which would keep a reader alive that is gone.
        do throws(Errno) { (read, write) = try SystemCall.pipe2CloseOnExec() } catch {
            throw ContainerError.launchFailed("pipe: \(error.description)")
        }
    }

    func closeWriteEnd() { writeOpen.withLock { if $0 { close(write); $0 = false } } }

    /// Writes `bytes` to the write end; `false` if the reader is gone (`EPIPE`) — never a
    /// `SIGPIPE` that would kill this process: the signal is blocked on this thread for the
    /// call, and one the write raised is taken back before it is unblocked.
    func send(_ bytes: [UInt8]) -> Bool {
        var pipeSignal = sigset_t(), previous = sigset_t()
        sigemptyset(&pipeSignal)
        sigaddset(&pipeSignal, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &pipeSignal, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        var pendingBefore = sigset_t()
        sigpending(&pendingBefore)
        let n = bytes.withUnsafeBytes { Glibc.write(write, $0.baseAddress, $0.count) }
        if n < 0, errno == EPIPE, sigismember(&pendingBefore, SIGPIPE) == 0 {
            var now = timespec()
            _ = sigtimedwait(&pipeSignal, nil, &now)
        }
        return n == bytes.count
    }

    /// Everything until end of file (at most 64 KiB kept).
    func readAll() -> [UInt8] {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(read, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            if out.count < 65536 { out += buffer[0..<n] }
        }
        return out
    }

    /// Copies what arrives to `fd` on a background thread, until end of file.
    func forward(to fd: Int32) {
        let source = fcntl(read, F_DUPFD_CLOEXEC, 0)   // its own: the pipe may be released first
        guard source >= 0 else { return }
        let thread = Thread {
            defer { close(source) }
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = buffer.withUnsafeMutableBytes { Glibc.read(source, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                _ = buffer.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, n) }
            }
        }
        thread.start()
    }

    deinit {
        closeWriteEnd()
        close(read)
    }
}
