import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// What everyday tools expect of a file system, asked of the mount beside the kernel's tmpfs:
/// modes for every caller's umask, times set right after a close, and copies with `rsync -aAX`,
/// `cp -a` and `tar --xattrs` that exit 0 both ways and carry no class onto plain files.
@Suite(.enabled(if: MountedDirectory.canMount && DifferentialTests.tmpfs != nil, "needs /dev/fuse, fusermount3 (fuse3) and /dev/shm on tmpfs"))
struct DailyToolsOnTheMountTests {
    /// A mount whose server runs with umask 077 (the worst a shell could hand it), its
    /// directory's default class A, and a fresh directory on tmpfs to compare with.
    func mounted() throws -> (AppWorld, MountedDirectory, reference: String) {
        let world = try AppWorld.make()
        let data = world.cli.file("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        #expect(try ChildProcess.run("/usr/bin/setfattr", ["-n", "user.dataprotection.class", "-v", "complete", data]).status == 0)
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode, data: data, serverUmask: "077")
        let reference = try #require(DifferentialTests.tmpfs) + "/dp-daily-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: reference, withIntermediateDirectories: true)
        return (world, mount, reference)
    }

    /// The kernel applies the caller's umask before the server sees a mode: the server's own
    /// umask (077 here) must change nothing. Files, directories, FIFOs, `mknod` regular files,
    /// set-user-ID and sticky modes, under the caller's umask 0, 002, 022 and 077.
    @Test func modesAreTheCallersUnderEveryUmask() throws {
        let (_, mount, reference) = try mounted()
        defer { try? FileManager.default.removeItem(atPath: reference) }
        let script = """
            import os, stat, sys
            os.chdir(sys.argv[1])
            for mask in (0o000, 0o002, 0o022, 0o077):
                os.umask(mask)
                d = "u%03o" % mask
                os.mkdir(d, 0o777)
                os.close(os.open(d + "/file", os.O_CREAT | os.O_WRONLY, 0o666))
                os.close(os.open(d + "/setuid", os.O_CREAT | os.O_WRONLY, 0o4777))
                os.mkdir(d + "/sticky", 0o1777)
                os.mkdir(d + "/dir", 0o750)
                os.mkfifo(d + "/fifo", 0o666)
                os.mknod(d + "/node", 0o666 | stat.S_IFREG)
                with open(d + "/written", "w") as f: f.write("x" * 5000)
                os.chmod(d + "/written", 0o4777)
                for name in sorted(os.listdir(d)):
                    print(d, name, oct(os.lstat(d + "/" + name).st_mode & 0o7777))
            """
        let onMount = try ChildProcess.run("/usr/bin/python3", ["-c", script, mount.mountPoint])
        let onTmpfs = try ChildProcess.run("/usr/bin/python3", ["-c", script, reference])
        #expect(onMount.status == 0 && onTmpfs.status == 0, "\(onMount.err) \(onTmpfs.err)")
        #expect(onMount.out.split(separator: "\n").count == 28)
        #expect(onMount.out == onTmpfs.out, "mount:\n\(onMount.out)\ntmpfs:\n\(onTmpfs.out)")
        try mount.unmount()
        // On disk too: the backing items carry the caller's modes.
        var st = stat()
        #expect(lstat(mount.data + "/u000/file", &st) == 0 && st.st_mode & 0o7777 == 0o666)
        #expect(lstat(mount.data + "/u002/dir", &st) == 0 && st.st_mode & 0o7777 == 0o750)
    }

    /// A time set right after `close()` is the time read back, whichever comes first to the
    /// server: the close's RELEASE (sent after close() returned) or the time's SETATTR. Files
    /// past one page, so that each close has a file to settle (FORMAT.md §3).
    @Test func aTimeSetRightAfterCloseIsKept() throws {
        let (_, mount, reference) = try mounted()
        defer { try? FileManager.default.removeItem(atPath: reference) }
        let script = """
            import os, sys
            os.chdir(sys.argv[1])
            expected = {}
            for i in range(300):
                name = "closed-%03d" % i
                with open(name, "wb") as f: f.write(os.urandom(4096 + 37 * i))
                t = 1_000_000_000_000_000_000 + i * 1_000_000_007   # 2001 onwards, nanoseconds set
                os.utime(name, ns=(t, t))
                expected[name] = t
            for i in range(100):
                # SETATTR before RELEASE, forced: the time is set while a descriptor is open.
                name = "open-%03d" % i
                fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644)
                os.pwrite(fd, os.urandom(9000), 0)
                t = 1_100_000_000_000_000_000 + i * 999_999_937
                os.utime(name, ns=(t, t))
                os.close(fd)
                expected[name] = t
            lost = sorted(name for name, t in expected.items() if os.stat(name).st_mtime_ns != t)
            print(len(expected), "set,", len(lost), "lost", lost[:5])
            """
        let onMount = try ChildProcess.run("/usr/bin/python3", ["-c", script, mount.mountPoint])
        let onTmpfs = try ChildProcess.run("/usr/bin/python3", ["-c", script, reference])
        #expect(onTmpfs.out == "400 set, 0 lost []\n", "\(onTmpfs.out) \(onTmpfs.err)")
        #expect(onMount.out == "400 set, 0 lost []\n", "\(onMount.out) \(onMount.err)")
        // Once unmounted, every RELEASE has been served: the backing files keep the times.
        try mount.unmount()
        var lost: [String] = []
        for i in 0..<300 {
            var st = stat()
            let name = String(format: "closed-%03d", i)
            let t = Int64(1_000_000_000_000_000_000) + Int64(i) * 1_000_000_007
            if lstat(mount.data + "/" + name, &st) != 0 || Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec) != t { lost.append(name) }
        }
        for i in 0..<100 {
            var st = stat()
            let name = String(format: "open-%03d", i)
            let t = Int64(1_100_000_000_000_000_000) + Int64(i) * 999_999_937
            if lstat(mount.data + "/" + name, &st) != 0 || Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec) != t { lost.append(name) }
        }
        #expect(lost.isEmpty, "times lost after the releases: \(lost.prefix(5)) of \(lost.count)")
    }

    /// `rsync -aAX`, `cp -a --preserve=all` and `tar --xattrs`, into the mount and out of it:
    /// exit 0, the same tree and `user.` attributes, nothing left to copy on a second `rsync`
    /// (times kept), and no `user.dataprotection.class` on any copy outside. The class stays
    /// readable by name on the mount, and removing it from a file leaves the file's class.
    @Test func copyingToolsExitZeroBothWaysAndStampNoClass() throws {
        let (world, mount, reference) = try mounted()
        defer { try? FileManager.default.removeItem(atPath: reference) }
        let outside = world.cli.file("outside")
        let source = outside + "/source"
        let made = try ChildProcess.run("/bin/sh", ["-c", """
            set -e
            mkdir -p '\(source)/sub/deeper' && cd '\(source)'
            printf 'first file\\n' > a.txt && head -c 70000 /dev/urandom > sub/big.bin && : > sub/empty
            printf 'deep\\n' > sub/deeper/c.txt && ln -s a.txt link && chmod 640 a.txt && chmod 750 sub
            setfattr -n user.comment -v 'from curl --xattr' a.txt
            setfattr -n user.xdg.origin.url -v 'https://example.com/big.bin' sub/big.bin
            setfattr -n user.note -v 'a directory note' sub
            touch -d '2020-01-02 03:04:05.123456789' a.txt sub/big.bin sub/deeper/c.txt
            """])
        #expect(made.status == 0, "\(made.err)")
        let mnt = mount.mountPoint
        let attributes = "getfattr -R -d -m '^user\\.' --absolute-names . 2>/dev/null | sed 's/^# file: //'"
        let copies = try ChildProcess.run("/bin/sh", ["-c", """
            fail() { echo "FAILED: $*"; exit 1; }
            same() { diff -r --no-dereference "$1" "$2" >/dev/null || fail "diff $1 $2"
                     [ "$(cd "$1" && \(attributes))" = "$(cd "$2" && \(attributes))" ] || fail "attributes $1 $2"; }
            rsync -aAX '\(source)/' '\(mnt)/rsynced/' || fail "rsync into the mount: $?"
            same '\(source)' '\(mnt)/rsynced'
            [ -z "$(rsync -aAXni '\(source)/' '\(mnt)/rsynced/')" ] || fail "rsync finds changes again: $(rsync -aAXni '\(source)/' '\(mnt)/rsynced/')"
            printf 'changed\\n' >> '\(source)/a.txt' && setfattr -x user.comment '\(source)/a.txt'
            rsync -aAX '\(source)/' '\(mnt)/rsynced/' || fail "rsync again into the mount: $?"
            same '\(source)' '\(mnt)/rsynced'
            rsync -aAX '\(mnt)/rsynced/' '\(outside)/rsynced-out/' || fail "rsync out of the mount: $?"
            same '\(source)' '\(outside)/rsynced-out'
            cp -a --preserve=all '\(source)' '\(mnt)/copied' || fail "cp into the mount"
            same '\(source)' '\(mnt)/copied'
            cp -a --preserve=all '\(mnt)/copied' '\(outside)/copied-out' || fail "cp out of the mount"
            same '\(source)' '\(outside)/copied-out'
            mkdir '\(mnt)/untarred' '\(outside)/untarred-out'
            tar --xattrs --xattrs-include='user.*' -C '\(source)' -cf - . | tar --xattrs --xattrs-include='user.*' -C '\(mnt)/untarred' -xf - || fail "tar into the mount"
            same '\(source)' '\(mnt)/untarred'
            tar --xattrs --xattrs-include='user.*' -C '\(mnt)/untarred' -cf - . | tar --xattrs --xattrs-include='user.*' -C '\(outside)/untarred-out' -xf - || fail "tar out of the mount"
            same '\(source)' '\(outside)/untarred-out'
            stamped=$(getfattr -R -d -m - --absolute-names '\(outside)' 2>/dev/null | grep -c dataprotection)
            [ "$stamped" = 0 ] || fail "$stamped copies outside carry a class"
            getfattr --only-values -n user.dataprotection.class '\(mnt)/rsynced/a.txt' && echo
            setfattr -x user.dataprotection.class '\(mnt)/rsynced/a.txt' || fail "removing the class"
            getfattr --only-values -n user.dataprotection.class '\(mnt)/rsynced/a.txt' && echo
            echo done
            """])
        #expect(copies.status == 0 && copies.out == "complete\ncomplete\ndone\n", "\(copies.out) \(copies.err)")
        try mount.unmount()
        let plain = MountedDirectory.regularFiles(below: mount.data).filter { !MountedDirectory.isProtected($0) }
        #expect(plain.isEmpty, "\(plain.prefix(5))")
        #expect(MountedDirectory.files(below: mount.data, containing: "first file").isEmpty)
    }
}
