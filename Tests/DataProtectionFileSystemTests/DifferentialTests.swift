import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The kernel's own tmpfs as the judge: Hypothesis applies the same random sequences of
/// operations to the mount and to tmpfs (Tests/oracle/fs_differential.py) and requires the same
/// results, errors and contents after every step — thousands of operations per run, the seed
/// printed (and in the failure) so that a failing run can be replayed.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct DifferentialTests {
    /// A directory on tmpfs (`/dev/shm`, when it is one).
    static var tmpfs: String? {
        guard (try? ChildProcess.run("/usr/bin/stat", ["-f", "-c", "%T", "/dev/shm"]))?.out == "tmpfs\n" else { return nil }
        return "/dev/shm"
    }

    @Test(.enabled(if: tmpfs != nil, "needs /dev/shm on tmpfs"))
    func randomOperationsGiveWhatTmpfsGives() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode, serverUmask: "077")   // the callers' umasks vary; the server's must never apply
        let reference = try #require(Self.tmpfs) + "/dp-differential-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: reference, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: reference) }
        let seed = Int.random(in: 1...1_000_000)
        print("DifferentialTests: seed \(seed)")
        let script = packageRoot.appendingPathComponent("Tests/oracle/fs_differential.py").path
        let run = try ChildProcess.run(oraclePython, [script, mount.mountPoint, reference, String(seed), "120", "60"])
        #expect(run.status == 0 && run.out.contains("same as tmpfs"), "seed \(seed):\n\(run.out.suffix(4000))\n\(run.err.suffix(2000))")
        if let count = run.out.split(separator: " ").dropLast(3).last.flatMap({ Int($0) }) {
            #expect(count > 2000, "thousands of operations: \(count)")
        }
        try mount.unmount()
        let plain = MountedDirectory.regularFiles(below: mount.data).filter { !MountedDirectory.isProtected($0) }
        #expect(plain.isEmpty, "\(plain.prefix(5))")
    }
}
