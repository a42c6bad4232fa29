@testable import DataProtectionIPC
import Foundation
import Testing

/// The IPC layer on real socket pairs: frames, peer credentials, and descriptors passed with
/// SCM_RIGHTS keeping their access mode.
@Suite struct IPCTests {
    static func pair() throws -> (Int32, Int32) {
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        return (fds[0], fds[1])
    }

    @Test func framesRoundTripAndOversizedOnesAreRefused() throws {
        let (a, b) = try Self.pair()
        defer { close(a); close(b) }
        let payload = (0..<1000).map { UInt8(truncatingIfNeeded: $0) }
        try IPCFrame.write(a, payload)
        #expect(try IPCFrame.read(b) == payload)
        #expect(throws: IPCError.self) { try IPCFrame.write(a, [UInt8](repeating: 0, count: IPCFrame.maxLength + 1)) }
        // A header announcing too much closes the connection: an error, never an allocation of it.
        _ = [UInt8(0xFF), 0xFF, 0xFF, 0xFF].withUnsafeBytes { send(a, $0.baseAddress, 4, 0) }
        #expect(throws: IPCError.self) { _ = try IPCFrame.read(b) }
        close(a)
        #expect(try IPCFrame.read(b) == nil, "a clean end of stream")
    }

    @Test func peerCredentialsAreTheKernels() throws {
        let (a, b) = try Self.pair()
        defer { close(a); close(b) }
        let peer = try #require(UnixSocket.peerCredentials(b))
        #expect(peer.uid == getuid())
        #expect(peer.pid == getpid())
    }

    /// A read-only descriptor handed over stays read-only: the receiver cannot write through it.
    @Test func aPassedReadOnlyDescriptorCannotWrite() throws {
        let path = NSTemporaryDirectory() + "ipc-" + UUID().uuidString
        try Data("granted".utf8).write(to: URL(fileURLWithPath: path))
        let readOnly = open(path, O_RDONLY)
        try #require(readOnly >= 0)
        let (a, b) = try Self.pair()
        defer { close(a); close(b) }
        try UnixSocket.send(descriptor: readOnly, over: a, message: Array("grant".utf8))
        close(readOnly)
        let (message, received) = try UnixSocket.receiveDescriptor(from: b, capacity: 16)
        #expect(message == Array("grant".utf8))
        let fd = try #require(received)
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 16)
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        #expect(Array(buffer[0..<max(n, 0)]) == Array("granted".utf8))
        let written = "x".withCString { write(fd, $0, 1) }
        #expect(written == -1 && errno == EBADF)
        #expect(fcntl(fd, F_GETFD) & FD_CLOEXEC != 0, "received descriptors are close-on-exec")
        // Without a descriptor, none is made up.
        try IPCFrame.write(a, [1, 2, 3])
        #expect(try UnixSocket.receiveDescriptor(from: b, capacity: 64).descriptor == nil)
    }

    /// Answers and a descriptor sent in one message (one wake-up for the reader): the frame
    /// reader returns both answers, then the descriptor — which a plain `recv` of the first
    /// bytes would have dropped.
    @Test func theFrameReaderKeepsADescriptorThatCameWithTheAnswers() throws {
        let path = NSTemporaryDirectory() + "ipc-" + UUID().uuidString
        try Data("granted".utf8).write(to: URL(fileURLWithPath: path))
        defer { unlink(path) }
        let item = open(path, O_RDONLY)
        try #require(item >= 0)
        let (a, b) = try Self.pair()
        defer { close(a); close(b) }
        let answers = IPCFrame.header(2) + [1, 0] + IPCFrame.header(3) + [1, 0, 7]
        try UnixSocket.send(descriptor: item, over: a, message: answers + [0])
        close(item)
        try IPCFrame.write(a, [1, 0, 9])                        // a later answer, read on the next call
        var reader = IPCFrameReader(fd: b)
        #expect(try reader.frame() == [1, 0])
        #expect(try reader.frame() == [1, 0, 7])
        let fd = try reader.descriptor()
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 16)
        let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        #expect(Array(buffer[0..<max(n, 0)]) == Array("granted".utf8))
        #expect(try reader.frame() == [1, 0, 9])
        #expect(!reader.hasBufferedBytes)
        // A frame split across writes is joined; a byte that is not a descriptor's is an error.
        let split = IPCFrame.header(4) + [1, 2, 3, 4]
        _ = split.withUnsafeBytes { send(a, $0.baseAddress, 3, 0) }
        _ = split.withUnsafeBytes { send(a, $0.baseAddress! + 3, split.count - 3, 0) }
        #expect(try reader.frame() == [1, 2, 3, 4])
        _ = [UInt8(5)].withUnsafeBytes { send(a, $0.baseAddress, 1, 0) }
        #expect(throws: IPCError.self) { _ = try reader.descriptor() }
        close(a)
        #expect(throws: IPCError.self, "the stray byte is the start of a frame the stream ends in") { _ = try reader.frame() }
    }

    /// A reader of requests closes descriptors a peer pushes at it: they never pile up.
    @Test func aRequestReaderClosesDescriptorsAPeerSends() throws {
        let path = NSTemporaryDirectory() + "ipc-pushed-" + UUID().uuidString
        try Data().write(to: URL(fileURLWithPath: path))
        defer { unlink(path) }
        let (a, b) = try Self.pair()
        defer { close(a); close(b) }
        let pushed = open(path, O_RDONLY)
        try #require(pushed >= 0)
        try UnixSocket.send(descriptor: pushed, over: a, message: IPCFrame.header(2) + [1, 6])
        close(pushed)
        var reader = IPCFrameReader(fd: b, acceptsDescriptors: false)
        #expect(try reader.frame() == [1, 6])
        let open = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")
            .compactMap { try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0) }
        #expect(!open.contains(path), "the pushed descriptor was closed")
        close(a)
        #expect(throws: IPCError.self) { _ = try reader.descriptor() }
    }

    @Test func listenRefusesADirectoryOthersCanEnter() throws {
        let directory = NSTemporaryDirectory() + "ipc-dir-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        #expect(throws: IPCError.self) { _ = try UnixSocket.listen(on: directory + "/s.sock") }
        chmod(directory, 0o700)
        let fd = try UnixSocket.listen(on: directory + "/s.sock")
        defer { close(fd) }
        var st = stat()
        #expect(stat(directory + "/s.sock", &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(throws: IPCError.self, "a second server on a live socket is refused") { _ = try UnixSocket.listen(on: directory + "/s.sock") }
    }
}
