@testable import DataProtectionLifecycle
import DataProtectionTestSupport
import Foundation
import Logging
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The sleep inhibitor's tool may give up at once (no system bus, logind refusing): the byte
/// this process sends it then meets a closed end, and must come back as an error — never a
/// `SIGPIPE` that kills the supervisor (and every app it runs) on the spot.
struct SleepInhibitorTests {
    @Test func aToolThatGivesUpAtOnceNeverKillsThisProcess() throws {
        let bin = temporaryDirectory().path
        let tool = bin + "/systemd-inhibit"
        // Gone at once, as on a machine without logind: its input closed, then it exits.
        try "#!/bin/sh\nexec 0<&-\nexit 1\n".write(toFile: tool, atomically: true, encoding: .utf8)
        #expect(chmod(tool, 0o755) == 0)
        let environment = ["PATH": bin + ":/usr/bin:/bin"]
        for _ in 0..<500 {
            let inhibitor = SleepInhibitor(environment: environment, logger: Logger(label: "test"))
            inhibitor.acquire(who: "test", why: "a tool that gives up")
            inhibitor.release()
        }
        #expect(kill(getpid(), 0) == 0, "still here")
    }
}
