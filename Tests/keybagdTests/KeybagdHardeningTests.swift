import Crypto
import DataProtection
@_spi(Testing) @testable import DataProtectionKeybag
import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing

/// keybagd attacked as the hardening review did: a subscriber that never reads, thousands of
/// idle connections, a daemon out of descriptors, and a scan of its memory after lock + grace.
@Suite(.serialized) struct KeybagdHardeningTests {
    /// A root with a fast KDF (hundreds of unlocks) and a daemon serving it.
    static func device(passcode: String = "123456", daemonArguments: [String] = [], captureErrors: Bool = false) async throws
        -> (CLI, KeybagdTests.Daemon, Keybag) {
        let cli = CLI.make()
        _ = try await Keybag.create(root: cli.root, passcode: passcode, kdf: .insecureFastForTesting)
        let daemon = try KeybagdTests.Daemon(cli: cli, captureErrors: captureErrors, arguments: daemonArguments)
        let keybag = try Keybag.open(root: cli.root, daemonSocket: daemon.socket)
        #expect(keybag.daemonSocket != nil)
        return (cli, daemon, keybag)
    }

    static func rawConnection(_ daemon: KeybagdTests.Daemon) throws -> Int32 {
        let fd = try #require(try KeybagSocket.connect(daemon.socket))
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    static func sendFrame(_ fd: Int32, _ payload: [UInt8]) {
        let frame = [UInt8(0), 0, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)] + payload
        _ = frame.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    }

    /// Reads until end of stream: `(bytes read, rc of the last recv)`; 0 is a clean close.
    static func drain(_ fd: Int32) -> (bytes: [UInt8], rc: Int) {
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return (bytes, n) }
            bytes += buffer[0..<n]
        }
    }

    static func threads(of pid: Int32) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        return status.split(separator: "\n").first { $0.hasPrefix("Threads:") }.flatMap { Int($0.split(separator: "\t").last ?? "") } ?? -1
    }

    /// utime + stime of a process, in clock ticks.
    static func cpuTicks(of pid: Int32) -> Int {
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        let fields = stat[stat.index(after: stat.lastIndex(of: ")")!)...].split(separator: " ")
        return (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)
    }

    /// A subscriber that never reads (a suspended app using `events()`) loses its own connection
    /// once its buffer is full; every other client — new ones included — is served throughout.
    @Test func aSubscriberThatStopsReadingStallsNobody() async throws {
        let (_, daemon, keybag) = try await Self.device()
        defer { daemon.kill() }
        try await keybag.unlock(passcode: "123456")
        let stuck = try Self.rawConnection(daemon)
        defer { close(stuck) }
        Self.sendFrame(stuck, [KeybagWire.version, KeybagWire.Op.subscribe.rawValue])
        // 600 events: twice what the review saw stall the daemon (about 280).
        for _ in 0..<300 {
            await keybag.lock()
            try await keybag.unlock(passcode: "123456")
        }
        // A brand-new client is answered (the client gives up after 5 s: a stall fails here).
        let fresh = try #require(try KeybagdConnection.connect(root: keybag.root, socketPath: daemon.socket))
        var status = try fresh.call(.status)
        #expect(try KeybagWire.status(&status).lockState == .unlocked)
        // The stuck subscriber got what fitted in its buffer, then end of stream.
        let (bytes, rc) = Self.drain(stuck)
        #expect(rc == 0, "the daemon closed the stuck subscriber's connection")
        #expect(bytes.count < 600 * 7, "it did not get every event")
    }

    /// Idle connections beyond the bound are told "busy" and closed; threads stay bounded.
    @Test func connectionsAndThreadsAreBounded() async throws {
        let (cli, daemon, _) = try await Self.device(daemonArguments: ["--max-connections", "32"])
        defer { daemon.kill() }
        var idle: [Int32] = []
        defer { idle.forEach { close($0) } }
        var busy = 0
        for _ in 0..<200 {
            let fd = try Self.rawConnection(daemon)
            Self.sendFrame(fd, [KeybagWire.version, KeybagWire.Op.hello.rawValue])
            var header = [UInt8](repeating: 0, count: 4)
            _ = header.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 4, Int32(MSG_WAITALL)) }
            let (rest, _) = header == [0, 0, 0, 0] ? ([], 0) : (Self.peekAnswer(fd, length: Int(header[2]) << 8 | Int(header[3])), 0)
            if rest.count > 1, rest[1] == KeybagWire.Status.error.rawValue, String(decoding: rest, as: UTF8.self).contains("busy") {
                busy += 1
                close(fd)
            } else {
                idle.append(fd)
            }
        }
        #expect(idle.count == 32)
        #expect(busy == 168)
        // A client finding the daemon busy is told so; it never falls back to keys of its own
        // (which would report "locked" while the daemon holds the device unlocked).
        #expect { _ = try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket) } throws: { error in
            "\(error)".contains("busy")
        }
        #expect(Self.threads(of: daemon.process.processIdentifier) <= 32 + 24, "threads: \(Self.threads(of: daemon.process.processIdentifier))")
        // Once they go, new clients are served again.
        idle.forEach { close($0) }
        idle = []
        var served = false
        for _ in 0..<50 where !served {   // the daemon notices the closes as its threads end
            served = (try? KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket)).flatMap { $0 } != nil
        }
        #expect(served)
    }

    /// 1,000 random frames, each on its own connection: each is answered or closed, none
    /// takes the daemon down or changes what it serves to others.
    @Test func randomFramesNeverTakeTheDaemonDown() async throws {
        let (cli, daemon, keybag) = try await Self.device()
        defer { daemon.kill() }
        try await keybag.unlock(passcode: "123456")
        var generator = SystemRandomNumberGenerator()
        let harmless = (1...40).filter { ![KeybagWire.Op.lock.rawValue, KeybagWire.Op.erase.rawValue, KeybagWire.Op.subscribe.rawValue].contains(UInt8($0)) }
        for _ in 0..<1_000 {
            let fd = try Self.rawConnection(daemon)
            var payload = [UInt8.random(in: 0...3, using: &generator) == 0 ? UInt8.random(in: 0...255, using: &generator) : KeybagWire.version,
                           UInt8(harmless.randomElement(using: &generator)!)]
            payload += (0..<Int.random(in: 0...80, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let declared = Int.random(in: 0...9, using: &generator) == 0 ? Int.random(in: 0...70_000, using: &generator) : payload.count
            let frame = [UInt8(truncatingIfNeeded: declared >> 24), UInt8(truncatingIfNeeded: declared >> 16),
                         UInt8(truncatingIfNeeded: declared >> 8), UInt8(truncatingIfNeeded: declared)] + payload
            _ = frame.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            shutdown(fd, Int32(SHUT_WR))
            _ = Self.drain(fd)
            close(fd)
        }
        let fresh = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket))
        var state = try fresh.call(.lockState)
        #expect(try KeybagWire.lockState(&state) == .unlocked)
        #expect(daemon.process.isRunning)
    }

    static func peekAnswer(_ fd: Int32, length: Int) -> [UInt8] {
        var body = [UInt8](repeating: 0, count: length)
        let n = body.withUnsafeMutableBytes { recv(fd, $0.baseAddress, length, Int32(MSG_WAITALL)) }
        return n > 0 ? Array(body[0..<n]) : []
    }

    /// Out of file descriptors, `accept` backs off: no spinning, one log line, and service
    /// resumes when descriptors are free again.
    @Test func outOfDescriptorsTheDaemonBacksOffInsteadOfSpinning() async throws {
        let (cli, daemon, keybag) = try await Self.device(daemonArguments: ["--max-connections", "1000"], captureErrors: true)
        defer { daemon.kill() }
        let pid = daemon.process.processIdentifier
        let client = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket))
        let limit = Process()
        limit.executableURL = URL(fileURLWithPath: "/usr/bin/prlimit")
        limit.arguments = ["--pid", "\(pid)", "--nofile=48:48"]
        try limit.run()
        limit.waitUntilExit()
        try #require(limit.terminationStatus == 0)
        // The daemon's CPU for the same work — 1,500 requests on a connection it already has —
        // before and while it is out of descriptors: a spinning accept loop adds a core's worth.
        func cpuFor1500Requests() throws -> Double {
            let before = Self.cpuTicks(of: pid)
            for _ in 0..<1_500 { _ = try client.call(.lockState) }
            return Double(Self.cpuTicks(of: pid) - before) / Double(sysconf(Int32(_SC_CLK_TCK)))
        }
        let baseline = try cpuFor1500Requests()
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        for _ in 0..<80 { if let fd = try? KeybagSocket.connect(daemon.socket, timeout: 1) { held.append(fd) } }
        let exhausted = try cpuFor1500Requests()
        #expect(exhausted < baseline * 2 + 0.15, "daemon CPU \(exhausted) s while out of descriptors, \(baseline) s before")
        held.forEach { close($0) }
        held = []
        // Service resumes.
        var status = try #require(try KeybagdConnection.connect(root: cli.root, socketPath: daemon.socket)).call(.lockState)
        #expect(try KeybagWire.lockState(&status) == (await keybag.lockState))
        daemon.kill()
        let log = daemon.errors()
        #expect(log.components(separatedBy: "accept:").count - 1 <= 2, "\(log.prefix(2000))")
        #expect(log.utf8.count < 20_000)
    }

    /// After lock + grace, neither the passcode nor a class-A file key the daemon handed out is
    /// anywhere in its memory (scanned as root through /proc/PID/mem, as the review did).
    @Test func afterLockAndGraceNoPasscodeOrClassAKeyRemainsInTheDaemonsMemory() async throws {
        guard getuid() == 0 else { return }   // reading another process's memory needs CAP_SYS_PTRACE
        let passcode = "correct-horse-" + UUID().uuidString.replacingOccurrences(of: "-", with: "")
        let (_, daemon, keybag) = try await Self.device(passcode: passcode)
        defer { daemon.kill() }
        try await keybag.unlock(passcode: passcode)
        // A class-A file written and read back while unlocked (its key crossed the daemon twice).
        let files = ProtectedFileManager(keybag: keybag)
        let url = URL(fileURLWithPath: daemon.runtime).appendingPathComponent("secret.txt")
        try await files.write(Data("class A".utf8), to: url, protection: .complete)
        #expect(try await files.contents(of: url) == Data("class A".utf8))
        var fileKeys: [[UInt8]] = []
        for _ in 0..<4 {
            let (key, wrapped) = try await keybag.wrapNewFileKey(for: .complete)
            let unwrapped = try await keybag.unwrapFileKey(wrapped)
            #expect(unwrapped == key)
            fileKeys.append(key.withUnsafeBytes { Array($0) })
        }
        await keybag.lock()
        try daemon.advance(11, root: keybag.root)
        #expect(await keybag.isAvailable(.complete) == false)
        _ = await keybag.status

        let memory = try Self.readMemory(of: daemon.process.processIdentifier)
        // The scan can see: the socket path the daemon keeps is there.
        // (Booleans first: an expectation on the scan itself would print hundreds of MB.)
        let sawSocketPath = Self.contains(memory, Array(daemon.socket.utf8))
        let passcodeFound = Self.contains(memory, Array(passcode.utf8))
        let keysFound = fileKeys.indices.filter { Self.contains(memory, fileKeys[$0]) }
        #expect(sawSocketPath, "the scan read the daemon's memory (\(memory.count) bytes)")
        #expect(!passcodeFound, "the passcode is still in keybagd's memory")
        #expect(keysFound.isEmpty, "class-A file keys \(keysFound) are still in keybagd's memory")
    }

    static func readMemory(of pid: Int32) throws -> [UInt8] {
        let maps = try String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8)
        let fd = open("/proc/\(pid)/mem", O_RDONLY)
        try #require(fd >= 0, "cannot open /proc/\(pid)/mem: \(String(cString: strerror(errno)))")
        defer { close(fd) }
        var memory: [UInt8] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].hasPrefix("r"), !line.contains("[vvar]"), !line.contains("[vsyscall]") else { continue }
            let range = fields[0].split(separator: "-").compactMap { UInt64($0, radix: 16) }
            guard range.count == 2 else { continue }
            var offset = range[0]
            while offset < range[1] {
                let count = Int(min(range[1] - offset, 1 << 20))
                var chunk = [UInt8](repeating: 0, count: count)
                let n = chunk.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(Int64(bitPattern: offset))) }
                if n > 0 { memory += chunk[0..<n] }
                offset += UInt64(count)
            }
        }
        return memory
    }

    static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard let first = needle.first, needle.count <= haystack.count else { return false }
        return haystack.withUnsafeBufferPointer { (hay: UnsafeBufferPointer<UInt8>) -> Bool in
            needle.withUnsafeBufferPointer { (pattern: UnsafeBufferPointer<UInt8>) -> Bool in
                let base = UnsafeRawPointer(hay.baseAddress!)
                var offset = 0
                while offset <= hay.count - pattern.count {
                    guard let hit = memchr(base + offset, Int32(first), hay.count - offset) else { return false }
                    let at = UnsafeRawPointer(hit) - base
                    if at > hay.count - pattern.count { return false }
                    if memcmp(base + at, UnsafeRawPointer(pattern.baseAddress!), pattern.count) == 0 { return true }
                    offset = at + 1
                }
                return false
            }
        }
    }
}

/// Errors cross the daemon's socket as they were raised: a keybag in a newer format is named so
/// through keybagd too (FORMAT §8, error tag 24), and an unknown tag is a protocol error.
@Suite struct KeybagWireErrorTests {
    @Test func errorsRoundTripThroughTheWireFormat() throws {
        for error: KeybagError in [.newerKeybagFormat(version: 4, readable: [1, 2, 3]), .passcodeTooShort(minimumLength: 8), .wrongBackupPassword,
                                   .tpmLockout(failedTries: 4, recoveryInterval: 600), .corruptKeybag("x")] {
            var writer = ByteWriter()
            KeybagWire.error(&writer, error)
            var reader = ByteReader(writer.bytes)
            #expect(try KeybagWire.error(&reader) == error)
            #expect(reader.remaining == 0)
        }
        var unknown = ByteReader([200])
        #expect(throws: (any Error).self) { try KeybagWire.error(&unknown) }
    }
}
