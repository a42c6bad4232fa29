import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Programs that try to break the server: odd names, a directory swapped for a link on disk,
/// huge directories, a reader that stops in the middle, the server killed mid-write; and a mount
/// made by an ordinary user through fusermount3.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct HostileProgramTests {
    func mounted() throws -> (AppWorld, MountedDirectory) {
        let world = try AppWorld.make()
        return (world, try MountedDirectory(cli: world.cli, passcodeFile: world.passcode))
    }

    @Test func namesAreBytesAndNeverPaths() throws {
        let (world, mount) = try mounted()
        let result = try mount.shell("""
            /usr/bin/python3 - <<'EOF'
            import errno, os
            names = [b"new\\nline", b"\\xff\\xfeinvalid utf-8", b"x" * 255, b" leading space", b"-dash", b"..x", b"tab\\there"]
            for name in names:
                with open(name, "wb") as f: f.write(b"named " + name)
            listed = sorted(os.listdir(b"."))
            print(listed == sorted(names), all(open(n, "rb").read() == b"named " + n for n in names))
            for bad in [b"y" * 256]:
                try: open(bad, "wb"); print("made", bad[:8])
                except OSError as e: print(errno.errorcode[e.errno])
            EOF
            """)
        #expect(result.out == "True True\nENAMETOOLONG\n", "\(result.out) \(result.err)")
        try mount.unmount()
        let onDisk = try FileManager.default.contentsOfDirectory(atPath: mount.data)
        #expect(onDisk.count == 7, "\(onDisk)")
        #expect(MountedDirectory.regularFiles(below: mount.data).allSatisfy(MountedDirectory.isProtected))
        let cat = try world.dpctl(["cat", mount.data + "/-dash", "--passcode-file", world.passcode])
        #expect(cat.out == "named -dash", "\(cat.stderr)")
    }

    /// A directory the kernel holds is replaced on disk by a link to a directory outside: the
    /// server keeps working on the directory it holds (by descriptor), and never writes
    /// through the link.
    @Test func aDirectorySwappedForALinkOnDiskIsNeverFollowed() throws {
        let (world, mount) = try mounted()
        let outside = world.cli.file("outside")
        try FileManager.default.createDirectory(atPath: outside, withIntermediateDirectories: true)
        // The program holds the directory open (its cwd) while the data directory changes under it.
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/bin/sh")
        holder.arguments = ["-c", "mkdir d && cd d && read line && echo inside > made.txt && ls ../ && cat made.txt"]
        holder.currentDirectoryURL = URL(fileURLWithPath: mount.mountPoint)
        let input = Pipe(), output = Pipe()
        (holder.standardInput, holder.standardOutput) = (input, output)
        try holder.run()
        // Wait until the directory exists on disk, then swap it for a link (as a hostile process with access to the data could).
        var st = stat()
        for _ in 0..<5000 where lstat(mount.data + "/d", &st) != 0 { usleep(1000) }
        #expect(rename(mount.data + "/d", mount.data + "/moved") == 0)
        #expect(symlink(outside, mount.data + "/d") == 0)
        try input.fileHandleForWriting.write(contentsOf: Data("go\n".utf8))
        try input.fileHandleForWriting.close()
        holder.waitUntilExit()
        let out = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(holder.terminationStatus == 0, "\(out)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: outside).isEmpty, "nothing was written through the link")
        #expect(MountedDirectory.isProtected(mount.data + "/moved/made.txt"), "the file went where the directory really is")
        try mount.unmount()
    }

    /// 100,000 entries in one directory: listed whole through the mount while the server's memory
    /// stays bounded (it reads the directory in pieces, from the offsets the kernel asks).
    @Test func aHugeDirectoryIsListedWithBoundedMemory() throws {
        let (_, mount) = try mounted()
        let count = 100_000
        try FileManager.default.createDirectory(atPath: mount.data + "/big", withIntermediateDirectories: true)
        let fill = try ChildProcess.run("/usr/bin/python3", ["-c", "import os\nfor i in range(\(count)): os.close(os.open('\(mount.data)/big/f%06d' % i, os.O_CREAT | os.O_WRONLY))"])
        #expect(fill.status == 0, "\(fill.err)")
        let listed = try mount.shell("ls -f big | grep -c '^f'")
        #expect(listed.out == "\(count)\n", "\(listed.out) \(listed.err)")
        let resident = SupervisorMemory.residentKiB(mount.process.processIdentifier)
        #expect(resident < 256 * 1024, "the server holds \(resident) KiB after listing")
        try mount.unmount()
    }

    /// A program stopped in the middle of reading (SIGSTOP, its read of a big file pending) and
    /// another holding a thousand descriptors open: the others are served as before.
    @Test func aStalledReaderStallsNobodyElse() throws {
        let (_, mount) = try mounted()
        #expect(try mount.shell("head -c 64000000 /dev/zero > big && echo small > small").status == 0)
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        reader.arguments = ["-c", "import os\nfds = [os.open('small', os.O_RDONLY) for _ in range(1000)]\nf = open('big', 'rb')\nwhile True: f.seek(0); f.read()"]
        reader.currentDirectoryURL = URL(fileURLWithPath: mount.mountPoint)
        try reader.run()
        usleep(0)
        kill(reader.processIdentifier, SIGSTOP)
        defer { kill(reader.processIdentifier, SIGKILL); kill(reader.processIdentifier, SIGCONT); reader.waitUntilExit() }
        for round in 0..<20 {
            let other = try mount.shell("echo round \(round) > r\(round) && cat r\(round) small")
            #expect(other.out == "round \(round)\nsmall\n", "\(other.err)")
        }
        kill(reader.processIdentifier, SIGKILL)
        kill(reader.processIdentifier, SIGCONT)
        reader.waitUntilExit()
        try mount.unmount()
    }

    /// `kill -9` of the server while a program appends and syncs: the program gets an error, the
    /// mount point is released, and every file on disk authenticates and holds what was written
    /// in order — at least what was synced, the write after it perhaps in part.
    @Test func theServerKilledMidWriteTearsNothing() throws {
        let (world, mount) = try mounted()
        let writer = Process()
        writer.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        writer.arguments = ["-c", """
            import errno, os, sys
            synced = {}
            try:
                for n in range(100000):
                    name = "f%d" % (n % 4)
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                    os.write(fd, (b"%08d" % n) * 700)
                    os.fsync(fd)
                    os.close(fd)
                    synced[name] = synced.get(name, 0) + 5600
                    if n == 200: print("writing", flush=True)
            except OSError as e:
                print("stopped", errno.errorcode[e.errno], flush=True)
                for name, size in synced.items(): print(name, size, flush=True)
            """]
        writer.currentDirectoryURL = URL(fileURLWithPath: mount.mountPoint)
        let output = Pipe()
        writer.standardOutput = output
        try writer.run()
        #expect(try readLine(output.fileHandleForReading.fileDescriptor, timeout: 60) == "writing")
        kill(mount.process.processIdentifier, SIGKILL)
        writer.waitUntilExit()
        mount.process.waitUntilExit()
        let lines = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
        // The call in flight is aborted (ECONNABORTED); any later one finds no connection (ENOTCONN).
        #expect(lines.first == "stopped ENOTCONN" || lines.first == "stopped ECONNABORTED", "\(lines.prefix(3))")
        // The mount point is released (fusermount3's auto_unmount), and empty again.
        var released = false
        for _ in 0..<5000 {
            let mounts = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
            if !mounts.contains(" " + mount.mountPoint + " ") { released = true; break }
            usleep(1000)
        }
        #expect(released, "the mount point is still mounted")
        for line in lines.dropFirst() {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let synced = Int(parts[1]) else { continue }
            let cat = try world.dpctl(["cat", mount.data + "/" + parts[0], "--passcode-file", world.passcode])
            #expect(cat.status == 0, "\(parts[0]) does not authenticate: \(cat.stderr)")
            #expect(cat.stdout.count >= synced, "\(parts[0]): \(cat.stdout.count) bytes, \(synced) synced")
            // What is there is what was written, in order: every append the writer made to this file,
            // the last perhaps in part (a write not yet synced may be cut anywhere, as on any file system).
            let which = Int(parts[0].dropFirst())!
            var expected = Data()
            var n = which
            while expected.count < cat.stdout.count {
                expected += Data(String(repeating: String(format: "%08d", n), count: 700).utf8)
                n += 4
            }
            #expect(cat.stdout == expected.prefix(cat.stdout.count), "\(parts[0]) holds bytes that were never written")
        }
    }

    /// An ordinary user mounts through fusermount3 (setuid), and what it writes is protected.
    @Test(.enabled(if: getuid() == 0, "needs root to become nobody"))
    func anOrdinaryUserMountsThroughFusermount() throws {
        let cli = CLI.make()
        let passcode = cli.writeFile("passcode", "123456")
        for path in [cli.work.path, passcode] { #expect(chown(path, 65534, 65534) == 0) }
        #expect(try cli.run(["init", "--passcode-file", passcode], asUser: "nobody").status == 0)
        let data = cli.file("data"), mountPoint = cli.file("mnt")
        for path in [data, mountPoint] {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            #expect(chown(path, 65534, 65534) == 0)
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--reuid=nobody", "--regid=nogroup", "--clear-groups", CLI.executable.path, "--root", cli.root, "mount", data, mountPoint, "--passcode-file", passcode]
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        // First perhaps that it started a keybagd for the root, then that it serves.
        let line = try readUntilMountServes(errors.fileHandleForReading.fileDescriptor).last ?? ""
        #expect(line.hasPrefix("dpctl: serving"), "\(line)")
        let write = try ChildProcess.run("/usr/bin/setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/bin/sh", "-c",
                                                               "echo 'nobody marker' > '\(mountPoint)/n.txt' && cat '\(mountPoint)/n.txt'"])
        #expect(write.out == "nobody marker\n", "\(write.err)")
        // Permissions as the kernel's own file system gives them to the user (the mount has no
        // `default_permissions`: the backing file system decides): the same script on the mount
        // and in a plain directory of the user's says the same. (A name already looked up below a
        // directory whose search bit was just taken stays reachable until its entry expires, 1 s,
        // as on gocryptfs: FORMAT.md §14.)
        let plain = cli.file("plain")
        try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true)
        #expect(chown(plain, 65534, 65534) == 0)
        let script = """
            cd "$1"
            r() { if "$@" 2>/dev/null; then echo "ok: $*"; else echo "refused: $*"; fi; }
            echo x > ro; chmod 444 ro
            r sh -c 'echo y > ro'; r sh -c 'echo y >> ro'; r test -w ro; r test -r ro; r cat ro; r truncate -s 0 ro
            r python3 -c 'import os; os.open("ro", os.O_RDWR)'
            r python3 -c 'import os,sys; sys.exit(0 if os.access("ro", os.W_OK) else 1)'
            chmod 644 ro; r sh -c 'echo z >> ro'; r cat ro
            chmod 000 ro; r cat ro; r test -r ro; chmod 600 ro
            mkdir d; touch d/in; chmod 500 d
            r touch d/new; r rm -f d/in; r ls d; r test -w d
            chmod 000 d; r ls d; r cd d; r stat d/unseen; r test -x d
            chmod 700 d
            printf '#!/bin/sh\necho ran\n' > s; chmod 644 s; r ./s; r test -x s; chmod 755 s; r ./s
            mkdir -m 1777 sticky; r touch sticky/mine; r rm sticky/mine
            """
        let asNobody = { (dir: String) throws -> String in
            try ChildProcess.run("/usr/bin/setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/bin/sh", "-c", script, "sh", dir]).out
        }
        let onMount = try asNobody(mountPoint), onPlain = try asNobody(plain)
        #expect(onMount == onPlain)
        #expect(onMount.contains("refused: sh -c echo y > ro") && onMount.contains("refused: ls d") && onMount.contains("ok: ./s"), "\(onMount)")
        // Root is not let in (no allow_other): the mount is the user's.
        #expect(access(mountPoint + "/n.txt", R_OK) != 0)
        let unmounted = try ChildProcess.run("/usr/bin/setpriv", ["--reuid=nobody", "--regid=nogroup", "--clear-groups", CLI.executable.path, "umount", mountPoint])
        #expect(unmounted.status == 0, "\(unmounted.err)")
        process.waitUntilExit()
        #expect(MountedDirectory.isProtected(data + "/n.txt"))
        #expect(MountedDirectory.files(below: data, containing: "nobody marker").isEmpty)
    }
}

enum SupervisorMemory {
    static func residentKiB(_ pid: Int32) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }
}

/// A machine without what FUSE needs: `dpctl mount` says what is missing in one line, and mounts
/// nothing.
@Suite struct MissingFUSETests {
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap") && getuid() == 0))
    func withoutDevFuseOrFusermountTheMountSaysWhatIsMissing() throws {
        let world = try AppWorld.make()
        let data = world.cli.file("data"), mountPoint = world.cli.file("mnt")
        for path in [data, mountPoint] { try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true) }
        let dpctl = [CLI.executable.path, "--root", world.cli.root, "mount", data, mountPoint, "--passcode-file", world.passcode]
        // No /dev/fuse: a /dev of bubblewrap's own, without it.
        let noDevice = try ChildProcess.run("bwrap", ["--bind", "/", "/", "--dev", "/dev", "--"] + dpctl)
        #expect(noDevice.status != 0 && noDevice.err.contains("/dev/fuse is missing"), "\(noDevice.err)")
        #expect(noDevice.err.split(separator: "\n").filter { $0.hasPrefix("dpctl:") }.count == 1, "one line: \(noDevice.err)")
        // No fusermount3, as an ordinary user: the package to install.
        let home = world.cli.work.path
        #expect(chown(home, 65534, 65534) == 0 && chown(data, 65534, 65534) == 0 && chown(mountPoint, 65534, 65534) == 0)
        let noHelper = try ChildProcess.run("bwrap", ["--dev-bind", "/", "/", "--ro-bind", "/dev/null", "/usr/bin/fusermount3",
                                                      "/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
                                                      CLI.executable.path, "--root", world.cli.root + "-nobody", "mount", data, mountPoint])
        #expect(noHelper.status != 0 && noHelper.err.contains("apt-get install fuse3"), "\(noHelper.err)")
        let mounts = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        #expect(!mounts.contains(mountPoint), "nothing was mounted")
    }
}

/// What an adversarial review found: each case, and the server still serving after it.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct ReviewFindingsTests {
    @Test func timesBefore1970NeitherCrashNorChange() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode)
        #expect(FileManager.default.createFile(atPath: mount.data + "/old-on-disk", contents: Data()))
        #expect(try ChildProcess.run("/usr/bin/touch", ["-d", "@-1", mount.data + "/old-on-disk"]).status == 0)
        let result = try mount.shell("touch t && touch -d @-100 t && stat -c %Y t old-on-disk")
        #expect(result.status == 0 && result.out == "-100\n-1\n", "\(result.out) \(result.err)")
        try mount.unmount()
    }

    /// An open directory costs the server no descriptor (a program holding thousands open leaves
    /// the others theirs), listings through them still work, and a file unlinked while open is
    /// reopened through /proc/self/fd and given attributes (no ESTALE).
    @Test func openDirectoriesHoldNoDescriptorsAndUnlinkedOpenFilesReopen() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode)
        let server = mount.process.processIdentifier
        let script = """
            import os, sys
            def served(): return len(os.listdir(f"/proc/{sys.argv[1]}/fd"))
            for d in range(10):
                os.mkdir(f"d{d}")
                for f in range(30): open(f"d{d}/f{f}", "w").close()
            before = served()
            held = [os.open(f"d{i % 10}", os.O_RDONLY | os.O_DIRECTORY) for i in range(2000)]
            names = sum(len(os.listdir(fd)) for fd in held[:20])
            after = served()
            fd = os.open("gone", os.O_RDWR | os.O_CREAT, 0o600)
            os.write(fd, b"still here")
            os.unlink("gone")
            again = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
            os.setxattr(fd, "user.note", b"kept")
            print(before, after, names, os.pread(again, 100, 0).decode(), os.getxattr(fd, "user.note").decode())
            """
        let result = try mount.shell("python3 -c '\(script)' \(server)")
        let fields = result.out.split(separator: " ").map(String.init)
        #expect(result.status == 0 && fields.count == 6, "\(result.out) \(result.err)")
        if fields.count == 6, let before = Int(fields[0]), let after = Int(fields[1]) {
            #expect(after - before < 100, "2,000 open directories cost the server \(after - before) descriptors")
            #expect(fields[2] == "600" && fields[3] == "still" && fields[4] == "here" && fields[5] == "kept\n")
        }
        try mount.unmount()
    }

    @Test func nothingPlainIsWrittenAndDamagedFilesAreErrors() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode)
        // An empty file made on disk, then written through the mount: protected.
        #expect(FileManager.default.createFile(atPath: mount.data + "/empty", contents: Data()))
        #expect(try mount.shell("echo 'MARKER one' > empty && cat empty").out == "MARKER one\n")
        // A protected file emptied on disk behind the mount's back, then appended to.
        #expect(try mount.shell("echo hello > b").status == 0)
        #expect(truncate(mount.data + "/b", 0) == 0)
        #expect(try mount.shell("echo 'MARKER two' >> b").status == 0)
        // A plain file: read as it is, never written through the mount.
        try Data("plain text".utf8).write(to: URL(fileURLWithPath: mount.data + "/plain"))
        let plain = try mount.shell("cat plain; echo; echo 'MARKER three' >> plain")
        #expect(plain.out == "plain text\n" && plain.err.contains("Permission denied"), "\(plain.out) \(plain.err)")
        // A protected file whose header was altered on disk: an error, never its ciphertext.
        #expect(try mount.shell("echo 'fourth' > damaged").status == 0)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: mount.data + "/damaged"))
        bytes[5] ^= 0xFF
        try bytes.write(to: URL(fileURLWithPath: mount.data + "/damaged"))
        let damaged = try mount.shell("cat damaged; echo 'MARKER four' > damaged")
        #expect(damaged.out.isEmpty && damaged.err.contains("Input/output error"), "\(damaged.out) \(damaged.err)")
        try mount.unmount()
        for marker in ["MARKER one", "MARKER two", "MARKER three", "MARKER four"] {
            #expect(MountedDirectory.files(below: mount.data, containing: marker).isEmpty, "\(marker) is on disk")
        }
        #expect(MountedDirectory.isProtected(mount.data + "/empty") && MountedDirectory.isProtected(mount.data + "/b"))
    }

    @Test func zerosFarPastTheEndAreRefusedNotWritten() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode)
        let result = try mount.shell("""
            /usr/bin/python3 -c "
            import errno, os
            fd = os.open('huge', os.O_RDWR | os.O_CREAT)
            for attempt in (lambda: os.pwrite(fd, b'XY', 2**40), lambda: os.ftruncate(fd, 2**40)):
                try: attempt(); print('done')
                except OSError as e: print(errno.errorcode[e.errno])
            os.ftruncate(fd, 10**6); print(os.fstat(fd).st_size)
            "
            """)
        #expect(result.out == "EFBIG\nEFBIG\n1000000\n", "\(result.out) \(result.err)")
        var st = stat()
        #expect(stat(mount.data + "/huge", &st) == 0 && st.st_size < 2_000_000)
        try mount.unmount()
    }
}

/// A long zero fill (a truncation far past the end) whose program is killed stops at its next
/// step: the kernel's INTERRUPT is honoured, and the server answers the others meanwhile.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct InterruptedFillTests {
    /// Whether the temporary directory has room for the 2 GiB fill the test would start.
    static var roomForTheFill: Bool {
        var space = statvfs()
        return statvfs(NSTemporaryDirectory(), &space) == 0 && Int64(space.f_bavail) * Int64(space.f_frsize) > 3 << 30
    }

    @Test(.enabled(if: roomForTheFill, "needs 3 GiB free in the temporary directory"))
    func aKilledProgramsZeroFillStops() throws {
        let world = try AppWorld.make()
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode)
        let filler = Process()
        filler.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        filler.arguments = ["-c", "import os\nfd = os.open('big', os.O_RDWR | os.O_CREAT)\nprint('start', flush=True)\nos.ftruncate(fd, 2 << 30)\nprint('finished', flush=True)"]
        filler.currentDirectoryURL = URL(fileURLWithPath: mount.mountPoint)
        let output = Pipe()
        filler.standardOutput = output
        try filler.run()
        #expect(try readLine(output.fileHandleForReading.fileDescriptor, timeout: 60) == "start")
        // Once the fill is under way on disk (past its first step), the program is killed.
        var st = stat()
        for _ in 0..<20_000 where !(stat(mount.data + "/big", &st) == 0 && st.st_size > 80 << 20) { usleep(500) }
        kill(filler.processIdentifier, SIGKILL)
        filler.waitUntilExit()   // the kernel lets it go once the server answered the interrupted request
        let reached = stat(mount.data + "/big", &st) == 0 ? Int64(st.st_size) : -1
        #expect(reached > 0 && reached < 2 << 30, "the fill went on to \(reached) bytes")
        let other = try mount.shell("echo still serving")
        #expect(other.out == "still serving\n")
        #expect(stat(mount.data + "/big", &st) == 0 && Int64(st.st_size) == reached, "the fill stopped")
        try mount.unmount()
    }
}
