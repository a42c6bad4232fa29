import DataProtection
@_spi(Testing) import DataProtectionKeybag
import Foundation

// What every test target shares (the swift-argument-parser `ArgumentParserTestHelpers` idea):
// temporary directories, random data, a virtual device, child processes, the oracle's Python.

/// The package's root directory (for `Tests/oracle`, `docs/FORMAT.md`, the venv).
public let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// A fresh directory under the system's temporary directory.
public func temporaryDirectory() -> URL {
    let url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("dp-tests-" + UUID().uuidString)
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// `count` random bytes.
public func randomData(_ count: Int) -> Data { Data((0..<count).map { _ in UInt8.random(in: 0...255) }) }

/// The bytes of every regular file under `url` (a repository's size, a tree's).
public func regularFileBytes(under url: URL) -> Int64 {
    var total: Int64 = 0
    let walker = FileManager.default.enumerator(at: url, includingPropertiesForKeys: [.fileSizeKey, .isRegularFileKey])
    while let item = walker?.nextObject() as? URL {
        let values = try? item.resourceValues(forKeys: [.fileSizeKey, .isRegularFileKey])
        if values?.isRegularFile == true { total += Int64(values?.fileSize ?? 0) }
    }
    return total
}

/// Whether one of `pid`'s threads waits writing into a full pipe (`pipe_write`, or
/// `anon_pipe_write` on newer kernels): a process held at a known point by a reader that stops.
public func isBlockedWritingAPipe(_ pid: pid_t) -> Bool {
    let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return threads.contains { (try? String(contentsOfFile: "/proc/\(pid)/task/\($0)/wchan", encoding: .utf8))?.hasSuffix("pipe_write") == true }
}

/// The Python that runs the oracles: `DP_PYTHON`, else the venv `scripts/test` makes, else `python3`.
public var oraclePython: String {
    if let explicit = ProcessInfo.processInfo.environment["DP_PYTHON"] { return explicit }
    let venv = packageRoot.appendingPathComponent(".venv-oracle/bin/python").path
    return FileManager.default.isExecutableFile(atPath: venv) ? venv : "python3"
}

/// A device with passcode "123456", weak scrypt parameters and a virtual clock, plus a directory
/// for its files.
public struct TestDevice: Sendable {
    public let keybag: Keybag
    public let clock: ManualClock
    public let root: String
    public let files: ProtectedFileManager
    public let dir: URL

    public static func make(grace: TimeInterval = 10, passcode: String? = "123456") async throws -> TestDevice {
        let base = temporaryDirectory()
        let clock = ManualClock()
        let root = base.appendingPathComponent("root").path
        let keybag = try await Keybag.create(root: root, passcode: passcode, kdf: .insecureFastForTesting, gracePeriod: grace, clock: clock)
        let dir = base.appendingPathComponent("files")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return TestDevice(keybag: keybag, clock: clock, root: root, files: ProtectedFileManager(keybag: keybag), dir: dir)
    }

    /// The same device after a restart: before first unlock.
    public func restarted() async throws -> TestDevice {
        let keybag = try await Keybag.open(root: root, clock: clock)
        return TestDevice(keybag: keybag, clock: clock, root: root, files: ProtectedFileManager(keybag: keybag), dir: dir)
    }

    /// Locks and lets the grace period pass; returns once the keybag has discarded the keys.
    public func lockPastGrace() async {
        await keybag.lock()
        clock.advance(by: await keybag.gracePeriod + 1)
        _ = await keybag.isProtectedDataAvailable   // the keybag expires the grace on any query
    }

    public func url(_ name: String) -> URL { dir.appendingPathComponent(name) }
}

/// A child process run to its end: status and both outputs.
public struct ChildProcess: Sendable {
    public let status: Int32
    public let out: String
    public let err: String

    /// Runs `executable` (a path, or a name looked up on `PATH`) with `stdin` as its input.
    public static func run(_ executable: String, _ arguments: [String], stdin: Data? = nil, environment: [String: String] = [:]) throws -> ChildProcess {
        let process = Process()
        if executable.hasPrefix("/") {
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = arguments
        } else {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = [executable] + arguments
        }
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { $1 }
        process.environment = env
        let out = Pipe(), err = Pipe(), input = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        try process.run()
        // Both outputs drain while the input is written: no deadlock on a full pipe.
        let errData = PipeReader(err.fileHandleForReading)
        if let stdin { try? input.fileHandleForWriting.write(contentsOf: stdin) }
        try? input.fileHandleForWriting.close()
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return ChildProcess(status: process.terminationStatus, out: String(decoding: outData, as: UTF8.self),
                            err: String(decoding: errData.result(), as: UTF8.self))
    }
}

/// Reads a pipe to its end on a thread of its own.
public final class PipeReader: @unchecked Sendable {
    private var data = Data()
    private let done = DispatchSemaphore(value: 0)
    public init(_ handle: FileHandle) {
        Thread { [self] in
            data = handle.readDataToEndOfFile()
            done.signal()
        }.start()
    }
    public func result() -> Data {
        done.wait()
        return data
    }
}

/// One line from `handle` (without its newline), read a byte at a time so that nothing after it
/// is consumed: the rest stays for the next reader. "" at end of file.
public func readLine(_ handle: FileHandle) throws -> String {
    var line = Data()
    while let byte = try handle.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) { line += byte }
    return String(decoding: line, as: UTF8.self)
}

/// One line from the descriptor `fd`, waiting at most `timeout` seconds for each byte (a test's
/// bound on a process that should have answered, not a wait for something to happen).
public func readLine(_ fd: Int32, timeout: Int32 = 30) throws -> String {
    var line: [UInt8] = []
    while true {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&poller, 1, timeout * 1000)
        if ready < 0 && errno == EINTR { continue }
        guard ready > 0 else { throw TestFailure("no line within \(timeout) s (so far: \(String(decoding: line, as: UTF8.self)))") }
        var byte: UInt8 = 0
        let n = read(fd, &byte, 1)
        if n < 0 && errno == EINTR { continue }
        if n <= 0 || byte == 0x0A { return String(decoding: line, as: UTF8.self) }
        line.append(byte)
    }
}

/// Whether `fd` stays silent for `milliseconds` (a bounded check that something does *not*
/// happen — a suspended process printing — never a wait for something to happen).
public func staysSilent(_ fd: Int32, milliseconds: Int32) -> Bool {
    var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    return poll(&poller, 1, milliseconds) == 0
}

/// A private D-Bus bus (`dbus-daemon --session`), standing in for the session or the system bus.
public final class PrivateBus: @unchecked Sendable {
    public let address: String
    public let pid: pid_t
    public init() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
        process.arguments = ["--session", "--nofork", "--print-address=1"]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        var line = Data()
        while let byte = try out.fileHandleForReading.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) { line += byte }
        address = String(decoding: line, as: UTF8.self)
        pid = process.processIdentifier
    }
    deinit { kill(pid, SIGKILL) }
}

/// What `dpctl mount` says on its standard error (`fd`) until it serves: its lines up to and
/// including `dpctl: serving …` (before it, perhaps that it started a keybagd for the root). The
/// last line is something else when it ended first (an empty line) or said more than 20 lines.
public func readUntilMountServes(_ fd: Int32) throws -> [String] {
    var said: [String] = []
    while said.last.map({ !$0.hasPrefix("dpctl: serving ") && !$0.isEmpty }) ?? true, said.count <= 20 {
        said.append(try readLine(fd, timeout: 60))
    }
    return said
}
