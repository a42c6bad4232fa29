@testable import DataProtectionContainers
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The supervisor tells a sandbox to go on through a pipe: a sandbox already gone (its reader
/// closed) is a `false`, never a `SIGPIPE` that kills the supervisor (`dpctl app run`, which
/// does not ignore the signal).
struct PipeSendTests {
    @Test func aWriteToAPipeWhoseReaderIsGoneIsRefusedNotFatal() throws {
        let pipe = try Pipe2()
        #expect(pipe.send(Array("go".utf8)))
        // The reader goes (the descriptor number is kept, on /dev/null, for the pipe's own close).
        let null = open("/dev/null", O_RDONLY)
        #expect(dup2(null, pipe.read) == pipe.read)
        close(null)
        // Refused: at once, unless a child another test spawns meanwhile holds a copy of the
        // read end for the moment between its fork and its exec (then the bytes go to the
        // pipe's buffer, and a later try is refused).
        var refused = 0
        for _ in 0..<10_000 where refused < 3 { if !pipe.send(Array("go".utf8)) { refused += 1 } }
        #expect(refused == 3)
        var pending = sigset_t()
        sigpending(&pending)
        #expect(sigismember(&pending, SIGPIPE) == 0, "no signal left pending either")
        #expect(kill(getpid(), 0) == 0, "still here")
    }
}
