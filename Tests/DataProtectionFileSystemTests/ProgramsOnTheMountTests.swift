import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Unmodified programs on a `dpctl mount`: everything they write lands on disk as protected
/// files of the directory's class, with no plaintext, and reads back the same through the
/// mount and through `dpctl cat`.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct ProgramsOnTheMountTests {
    func mounted() throws -> (AppWorld, MountedDirectory) {
        let world = try AppWorld.make()
        let data = world.cli.file("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        // The served directory's default: class A (complete), as an app's container could have.
        #expect(try ChildProcess.run("/usr/bin/setfattr", ["-n", "user.dataprotection.class", "-v", "complete", data]).status == 0)
        return (world, try MountedDirectory(cli: world.cli, passcodeFile: world.passcode, data: data))
    }

    func expectAllProtected(_ mount: MountedDirectory, markers: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        let files = MountedDirectory.regularFiles(below: mount.data)
        #expect(!files.isEmpty, sourceLocation: sourceLocation)
        let plain = files.filter { !MountedDirectory.isProtected($0) }
        #expect(plain.isEmpty, "not protected on disk: \(plain.prefix(5))", sourceLocation: sourceLocation)
        for marker in markers {
            let leaked = MountedDirectory.files(below: mount.data, containing: marker)
            #expect(leaked.isEmpty, "plaintext \(marker) on disk in \(leaked.prefix(3))", sourceLocation: sourceLocation)
        }
    }

    @Test func shellPythonAndSQLiteWriteProtectedFiles() throws {
        let (world, mount) = try mounted()
        let shell = try mount.shell("echo 'top secret diary' > diary.txt && echo 'second line' >> diary.txt && cat diary.txt")
        #expect(shell.status == 0 && shell.out == "top secret diary\nsecond line\n", "\(shell.err)")
        let python = try mount.shell("""
            /usr/bin/python3 - <<'EOF'
            import mmap, os, sqlite3, tempfile
            with open("notes.txt", "w") as f: f.write("python marker\\n" * 2000)
            with open("notes.txt", "r+b") as f:
                m = mmap.mmap(f.fileno(), 0); m[0:6] = b"MAPPED"; m.flush(); m.close()
            fd, tmp = tempfile.mkstemp(dir="."); os.write(fd, b"replaced marker"); os.fsync(fd); os.close(fd); os.replace(tmp, "atomic.txt")
            c = sqlite3.connect("cards.db"); c.execute("pragma journal_mode=wal"); c.execute("create table cards(number)")
            for i in range(300):
                with c: c.execute("insert into cards values (?)", ("4111 1111 1111 %04d" % i,))
            print(c.execute("pragma integrity_check").fetchone()[0], c.execute("select count(*) from cards").fetchone()[0])
            c.close()
            print(open("notes.txt").read(13))
            EOF
            """)
        #expect(python.status == 0 && python.out == "ok 300\nMAPPED marker\n", "\(python.out) \(python.err)")
        let sqlite = try mount.shell("sqlite3 cards.db 'pragma journal_mode=wal; pragma integrity_check; select count(*) from cards;'")
        #expect(sqlite.out == "wal\nok\n300\n", "\(sqlite.out) \(sqlite.err)")
        // The classes: the directory's default, seen through the attribute and on disk.
        let attribute = try mount.shell("getfattr --only-values -n user.dataprotection.class diary.txt")
        #expect(attribute.out == "complete", "\(attribute.out) \(attribute.err)")
        try mount.unmount()
        expectAllProtected(mount, markers: ["top secret", "python marker", "replaced marker", "4111 1111"])
        let cat = try world.dpctl(["cat", mount.data + "/diary.txt", "--passcode-file", world.passcode])
        #expect(cat.out == "top secret diary\nsecond line\n", "\(cat.stderr)")
        let header = try Data(contentsOf: URL(fileURLWithPath: mount.data + "/diary.txt"))
        #expect(header[12] == 1, "class A in the header")
        let integrity = try ChildProcess.run("/bin/sh", ["-c", "cd '\(mount.data)' && sqlite3 cards.db 'pragma integrity_check' 2>&1"])
        #expect(integrity.out != "ok\n", "on disk the database is not readable as plain SQLite")
    }

    @Test func gitTarCopiesAndRsyncWorkAndLeaveNoPlaintext() throws {
        let (_, mount) = try mounted()
        let git = try mount.shell("""
            mkdir repo && cd repo && git init -q && echo 'git marker' > a.txt && git add a.txt \
            && git -c user.email=t@example.com -c user.name=T commit -qm one && echo more >> a.txt \
            && git -c user.email=t@example.com -c user.name=T commit -qam two && git gc -q && git fsck --strict 2>&1 && git log --oneline | wc -l
            """)
        #expect(git.status == 0 && git.out.hasSuffix("2\n"), "\(git.out) \(git.err)")
        let source = "/usr/share/doc/git"
        let tree = try mount.shell("""
            tar -C \(source) -cf - . | (mkdir untarred && tar -C untarred -xf -) && diff -r --no-dereference \(source) untarred \
            && cp -a \(source) copied && diff -r --no-dereference \(source) copied \
            && rsync -a \(source)/ synced/ && diff -r --no-dereference \(source) synced && echo same
            """)
        #expect(tree.status == 0 && tree.out == "same\n", "\(tree.out) \(tree.err)")
        let removed = try mount.shell("rm -rf untarred copied && ls")
        #expect(removed.out == "repo\nsynced\n", "\(removed.out) \(removed.err)")
        try mount.unmount()
        expectAllProtected(mount, markers: ["git marker"])
    }

    /// Locks (the kernel's, shared by every program on the mount), other extended attributes,
    /// `O_TMPFILE`'s fallback, and a plain file already in the directory, served as it is.
    @Test func locksAttributesTemporaryFilesAndPlainFiles() throws {
        let (world, mount) = try mounted()
        try Data("left plain".utf8).write(to: URL(fileURLWithPath: mount.data + "/plain.txt"))
        #expect(try mount.shell("touch locked").status == 0)
        if geteuid() == 0 {   // an attribute of another namespace on the backing file stays unseen
            #expect(try ChildProcess.run("/usr/bin/setfattr", ["-n", "trusted.hidden", "-v", "1", mount.data + "/locked"]).status == 0)
        }
        let result = try mount.shell("""
            /usr/bin/python3 - <<'EOF'
            import fcntl, os, subprocess, tempfile
            f = open("locked", "w"); fcntl.flock(f, fcntl.LOCK_EX); fcntl.lockf(f, fcntl.LOCK_EX)
            other = subprocess.run(["/usr/bin/python3", "-c", "import fcntl, sys\\nf = open('locked', 'a')\\n"
                                    "try:\\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('flock taken')\\nexcept BlockingIOError: print('flock held')\\n"
                                    "try:\\n    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('lockf taken')\\nexcept OSError: print('lockf held')"],
                                   capture_output=True, text=True)
            print(other.stdout.strip().replace("\\n", ", "))
            os.setxattr("locked", "user.comment", b"kept as it is"); print(os.getxattr("locked", "user.comment").decode())
            print(sorted(os.listxattr("locked")))
            import errno
            def code(call):
                try: call(); return "ok"
                except OSError as e: return errno.errorcode[e.errno]
            # Only user. attributes are served: ACLs (which the kernel would not enforce here),
            # security. and trusted. read as absent and cannot be set.
            import struct
            acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xffffffff) for tag, perm in ((1, 6), (4, 4), (0x20, 0)))
            print([code(lambda: os.getxattr("locked", n)) for n in ("security.selinux", "system.posix_acl_access", "trusted.hidden")],
                  [code(lambda: os.setxattr("locked", n, v)) for n, v in (("security.x", b"1"), ("trusted.x", b"1"), ("system.posix_acl_access", acl))])
            t = tempfile.TemporaryFile(dir="."); t.write(b"temporary"); t.seek(0); print(t.read().decode()); t.close()
            print(open("plain.txt").read())
            EOF
            """)
        #expect(result.out == "flock held, lockf held\nkept as it is\n['user.comment']\n"
                + "['ENODATA', 'ENODATA', 'ENODATA'] ['ENOTSUP', 'ENOTSUP', 'ENOTSUP']\ntemporary\nleft plain\n",
                "\(result.out) \(result.err)")
        try mount.unmount()
        let listed = try world.dpctl(["ls", mount.data + "/plain.txt"])
        #expect(listed.out.contains("plain"), "\(listed.out)")
    }

    /// `mknod` of a regular file makes a protected file (and holds nothing open); FIFOs work;
    /// device files are refused among data.
    @Test func specialFilesThroughMknod() throws {
        let (_, mount) = try mounted()
        let result = try mount.shell("""
            /usr/bin/python3 -c "
            import os, stat
            os.mknod('regular', 0o644 | stat.S_IFREG); open('regular', 'a').write('via mknod'); print(open('regular').read())
            os.mkfifo('fifo'); print(stat.S_ISFIFO(os.lstat('fifo').st_mode))
            try: os.mknod('device', 0o644 | stat.S_IFCHR, os.makedev(1, 3)); print('device made')
            except OSError as e: print(e.strerror)
            "
            """)
        #expect(result.out == "via mknod\nTrue\nOperation not permitted\n", "\(result.out) \(result.err)")
        try mount.unmount()
        #expect(MountedDirectory.isProtected(mount.data + "/regular"))
    }

    @Test func linksRenamesTruncationAndSparseFiles() throws {
        let (_, mount) = try mounted()
        let result = try mount.shell("""
            printf 'abcdefgh' > f && ln -s f soft && ln f hard && cat soft hard && echo \
            && stat -c '%h %s' f && truncate -s 1000000 f && stat -c %s hard \
            && dd if=/dev/zero of=f bs=1 count=0 seek=20000000 2>/dev/null && stat -c %s f \
            && head -c 8 f && echo && tail -c 4 f | od -An -tx1 | tr -d ' ' \
            && truncate -s 3 f && cat f && echo && mv f g && ls && readlink soft \
            && /usr/bin/python3 -c "import os; os.rename('g', 'h'); os.link('h', 'i'); print(os.stat('i').st_nlink)"
            """)
        #expect(result.status == 0, "\(result.err)")
        #expect(result.out == "abcdefghabcdefgh\n2 8\n1000000\n20000000\nabcdefgh\n00000000\nabc\ng\nhard\nsoft\nf\n3\n", "\(result.out)")
        try mount.unmount()
        expectAllProtected(mount, markers: ["abcdefgh"])
    }

    /// What the server remembers of a file (protected, its class) holds only while the file's
    /// length and change time stay the same: a file rewritten beside the mount is served as it
    /// is now (seen through a new name, which the kernel looks up again).
    @Test func aFileRewrittenBesideTheMountIsServedAsItIsNow() throws {
        let (_, mount) = try mounted()
        #expect(try mount.shell("printf 'through the mount' > f && stat -c %s f && getfattr --only-values -n user.dataprotection.class f").out
                == "17\ncomplete")
        // Beside the mount, in place (the same inode): plain bytes, then a second name.
        let fd = open(mount.data + "/f", O_WRONLY | O_TRUNC)
        #expect(fd >= 0)
        #expect(write(fd, "plain, 22 bytes long!!", 22) == 22)
        close(fd)
        #expect(link(mount.data + "/f", mount.data + "/g") == 0)
        let result = try mount.shell("stat -c %s g && cat g && echo && getfattr -n user.dataprotection.class g 2>&1 | grep -c 'No such attribute'")
        #expect(result.out == "22\nplain, 22 bytes long!!\n1\n", "\(result.out) \(result.err)")
        try mount.unmount()
    }
}

/// An app's container mounted by its owner: the files the app made read through the mount, and
/// what a program writes there gets the app's class.
@Suite(.enabled(if: MountedDirectory.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct ContainerOnTheMountTests {
    @Test func anAppsContainerServedByItsOwner() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.notes", ["--default-protection", "complete"])
        let written = try world.dpctl(["write", container + "/Documents/from-app.txt", "--passcode-file", world.passcode], input: Data("the app's note".utf8))
        #expect(written.status == 0, "\(written.stderr)")
        let mount = try MountedDirectory(cli: world.cli, passcodeFile: world.passcode, data: container)
        let result = try mount.shell("""
            cat Documents/from-app.txt && echo && echo 'diary marker' > Documents/diary.txt \
            && getfattr --only-values -n user.dataprotection.class Documents/diary.txt
            """)
        #expect(result.out == "the app's note\ncomplete", "\(result.out) \(result.err)")
        try mount.unmount()
        #expect(MountedDirectory.files(below: container, containing: "diary marker").isEmpty)
        let listed = try world.dpctl(["ls", container + "/Documents/diary.txt"])
        #expect(listed.out.contains("complete") || listed.out.contains("A"), "\(listed.out)")
    }
}
