import DataProtectionSystem
import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

enum FUSEAvailability {
    static var canMount: Bool { access("/dev/fuse", R_OK | W_OK) == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/fusermount3") }
}

/// Apps on the protected file system (`dpctl app run` serving the containers through FUSE):
/// every program an app runs writes protected files of the container's class, the app cannot
/// lower that class nor make set-ID files, and the apps of a group share one file system.
@Suite(.enabled(if: FUSEAvailability.canMount, "needs /dev/fuse and fusermount3 (fuse3)"))
struct AppFileSystemTests {
    func served(_ world: AppWorld) -> [String] { ["--passcode-file", world.passcode] }

    /// Regular files below `directory`, by path — but the container's metadata and the
    /// `CACHEDIR.TAG`s the container was made with, plain by design (tar, restic and borg read them).
    func regularFiles(below directory: String) -> [String] {
        guard let walker = FileManager.default.enumerator(atPath: directory) else { return [] }
        var found: [String] = []
        while let relative = walker.nextObject() as? String {
            var st = stat()
            let path = directory + "/" + relative
            if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFREG, !relative.hasSuffix(".dataprotection-container.plist"),
               !relative.hasSuffix("CACHEDIR.TAG") { found.append(path) }
        }
        return found
    }

    func isProtected(_ path: String) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path), let prefix = try? handle.read(upToCount: 4) else { return false }
        return Array(prefix) == [0x89, 0x44, 0x50, 0x46]
    }

    @Test func everyProgramAnAppRunsWritesProtectedFilesOfItsClass() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.notes", ["--default-protection", "complete"])
        let run = try world.shell("com.example.notes", """
            set -e
            echo "diary: marker-shell" > Documents/diary.txt && echo "more" >> Documents/diary.txt
            /usr/bin/python3 - <<'EOF'
            import mmap, os, sqlite3
            with open("Documents/mapped.bin", "wb") as f: f.write(b"\\0" * 8192)
            with open("Documents/mapped.bin", "r+b") as f:
                m = mmap.mmap(f.fileno(), 8192); m[100:117] = b"marker-python-map"; m.flush(); m.close()
            c = sqlite3.connect("Library/app.db"); c.execute("pragma journal_mode=wal"); c.execute("create table cards(number text)")
            for n in range(200): c.execute("insert into cards values (?)", ("marker-card-%d" % n,))
            c.commit(); print(c.execute("pragma integrity_check").fetchone()[0]); c.close()
            EOF
            /usr/bin/sqlite3 Library/app.db "pragma journal_mode=wal; insert into cards values ('marker-cli'); select count(*) from cards;"
            cd Documents && git init -q repo && cd repo && echo "marker-git" > readme && git add readme \
              && git -c user.name=a -c user.email=a@b commit -qm first && git gc -q && git fsck --strict 2>&1 | tail -1
            echo done
            """, extra: served(world))
        #expect(run.status == 0, "\(run.stderr)")
        #expect(run.out.hasPrefix("ok\nwal\n201\n"), "\(run.out)")
        #expect(run.out.hasSuffix("done\n"), "\(run.out)")
        // On disk: every regular file is a protected file of class A, with no plaintext anywhere.
        let files = regularFiles(below: container)
        #expect(files.count > 10)
        #expect(files.filter { !isProtected($0) }.isEmpty, "not protected: \(files.filter { !isProtected($0) }.prefix(5))")
        let grep = try ChildProcess.run("/bin/grep", ["-rl", "-e", "marker-", world.cli.root])
        #expect(grep.out.isEmpty, "plaintext under the data root: \(grep.out)")
        let classes = try world.shell("com.example.notes", "find . -type f ! -name '.dataprotection-container.plist' ! -name CACHEDIR.TAG -exec getfattr --only-values -n user.dataprotection.class {} \\; -exec echo \\; | sort | uniq -c",
                                      extra: served(world))
        #expect(classes.out.trimmingCharacters(in: .whitespacesAndNewlines).hasSuffix("complete"), "\(classes.out)")
        #expect(classes.out.split(separator: "\n").count == 1, "\(classes.out)")
        // Outside, the same files read through the library, and the audit finds nothing unprotected.
        let cat = try world.dpctl(["cat", container + "/Documents/diary.txt", "--passcode-file", world.passcode])
        #expect(cat.out == "diary: marker-shell\nmore\n", "\(cat.stderr)")
        let audit = try world.dpctl(["audit", "--app", "com.example.notes"])
        #expect(!audit.out.contains("DP101"), "\(audit.out)")
        #expect(!audit.out.contains("DP201"), "\(audit.out)")
    }

    @Test func anAppCannotLowerItsClassNorMakeSetIDFiles() throws {
        let world = try AppWorld.make()
        try world.install("com.example.notes", ["--default-protection", "complete"])
        let run = try world.shell("com.example.notes", [
            "echo secret > Documents/f && mkdir Documents/sub && cp /bin/true Documents/t",
            attempt("lower-file", "setfattr -n user.dataprotection.class -v none Documents/f"),
            attempt("lower-documents", "setfattr -n user.dataprotection.class -v until-first-unlock Documents"),
            attempt("lower-root", "setfattr -n user.dataprotection.class -v none ."),
            attempt("lower-new-directory", "setfattr -n user.dataprotection.class -v complete-unless-open Documents/sub"),
            attempt("keep-file", "setfattr -n user.dataprotection.class -v complete Documents/f"),
            attempt("setuid", "chmod u+s Documents/t"),
            attempt("setgid", "chmod g+s Documents/t"),
            attempt("device", "mknod Documents/d c 1 3"),
            "echo new > Documents/sub/g && getfattr --only-values -n user.dataprotection.class Documents/sub/g && echo",
        ].joined(separator: "\n"), extra: served(world))
        let seen = outcomes(run.out)
        for name in ["lower-file", "lower-documents", "lower-root", "lower-new-directory", "setuid", "setgid", "device"] {
            #expect(seen[name] == "denied", "\(name): \(run.out) \(run.stderr)")
        }
        #expect(seen["keep-file"] == "ok")
        #expect(run.out.hasSuffix("complete\n"), "\(run.out)")

        // The floor is fixed when an item is found, never by walking up: neither a file whose
        // old directory is gone (swapped away with RENAME_EXCHANGE, then removed) nor a directory
        // 4,200 levels down escapes it.
        let escapes = try world.dpctl(["app", "run", "com.example.notes", "--passcode-file", world.passcode, "--", "/usr/bin/python3", "-c", """
            import ctypes, errno, os
            libc = ctypes.CDLL(None, use_errno=True)
            def code(call):
                try: call(); return "ok"
                except OSError as e: return errno.errorcode[e.errno]
            os.makedirs("Documents/P1"); os.makedirs("Documents/P2")
            open("Documents/P1/a", "w").write("a"); open("Documents/P2/b", "w").write("b")
            held = os.open("Documents/P2/b", os.O_RDONLY)
            assert libc.renameat2(-100, b"Documents/P1/a", -100, b"Documents/P2/b", 2) == 0
            os.unlink("Documents/P2/b"); os.rmdir("Documents/P2")
            print("exchanged", code(lambda: os.setxattr("/proc/self/fd/%d" % held, "user.dataprotection.class", b"none")))
            os.chdir("Documents"); os.mkdir("deep"); os.chdir("deep")
            for _ in range(4200): os.mkdir("d"); os.chdir("d")
            open("f", "w").write("deep")
            print("deep", os.getxattr("f", "user.dataprotection.class").decode(), code(lambda: os.setxattr(".", "user.dataprotection.class", b"none")))
            """])
        #expect(escapes.out == "exchanged EPERM\ndeep complete EPERM\n", "\(escapes.out) \(escapes.stderr)")
    }

    /// Two apps of a group, each in its own sandbox, on one SQLite database in WAL mode at once
    /// (an app and its extension sharing a store): no row lost, integrity ok. The same workload
    /// through two separate mounts of the same directory breaks — the reason there is one mount.
    @Test func aGroupsAppsShareOneDatabaseAndTwoMountsWouldNot() throws {
        let world = try AppWorld.make()
        try world.install("com.example.app", ["--group", "group.com.example.shared", "--default-protection", "complete"])
        try world.install("com.example.extension", ["--group", "group.com.example.shared"])
        let group = try world.groupContainer(of: "com.example.app", "group.com.example.shared")
        func workload(_ database: String, _ name: String) -> String {
            """
            import sqlite3
            c = sqlite3.connect(\(pythonString(database)), timeout=120, isolation_level=None)
            for n in range(1000):
                c.execute("begin immediate"); c.execute("insert into t values (?, ?)", (\(pythonString(name)), n)); c.execute("commit")
            print("inserted")
            """
        }
        func run(_ arguments: [String]) throws -> (Process, Pipe, Pipe) {
            let process = Process()
            process.executableURL = CLI.executable
            process.arguments = arguments
            let out = Pipe(), errors = Pipe()
            process.standardOutput = out
            process.standardError = errors
            try process.run()
            return (process, out, errors)
        }
        // The database made first, in WAL mode (which it keeps), as the app would at its first launch.
        let creation = "import sqlite3; c = sqlite3.connect(\(pythonString(group + "/shared.db"))); c.execute('pragma journal_mode=wal'); c.execute('create table t(who text, n integer)'); c.commit()"
        #expect(try world.dpctl(["app", "run", "com.example.app"] + served(world) + ["--", "/usr/bin/python3", "-c", creation]).status == 0)
        let apps = try ["com.example.app", "com.example.extension"].map { id in
            try run(["--root", world.cli.root, "app", "run", id] + served(world) + ["--", "/usr/bin/python3", "-c", workload(group + "/shared.db", id)])
        }
        for (process, out, errors) in apps {
            process.waitUntilExit()
            #expect(String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "inserted\n",
                    "\(String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))")
        }
        let check = try world.shell("com.example.app", "/usr/bin/sqlite3 '\(group)/shared.db' 'pragma integrity_check; select who, count(*) from t group by who;'",
                                    extra: served(world))
        #expect(check.out == "ok\ncom.example.app|1000\ncom.example.extension|1000\n", "\(check.out) \(check.stderr)")

        // The control: two mounts of one directory, one program through each.
        let data = world.cli.file("control")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        var mounts: [(Process, String)] = []
        for index in 0..<2 {
            let mountPoint = world.cli.file("control-mount-\(index)")
            try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
            let process = Process()
            process.executableURL = CLI.executable
            process.arguments = ["--root", world.cli.root, "mount", data, mountPoint, "--passcode-file", world.passcode]
            let errors = Pipe()
            process.standardError = errors
            try process.run()
            _ = try readUntilMountServes(errors.fileHandleForReading.fileDescriptor)
            mounts.append((process, mountPoint))
        }
        let made = try ChildProcess.run("/usr/bin/python3", ["-c", "import sqlite3; c = sqlite3.connect('\(mounts[0].1)/shared.db'); c.execute('pragma journal_mode=wal'); c.execute('create table t(who text, n integer)'); c.commit()"])
        #expect(made.status == 0, "\(made.err)")
        let writers = try mounts.enumerated().map { index, mount in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", workload(mount.1 + "/shared.db", "writer\(index)")]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            return process
        }
        for writer in writers { writer.waitUntilExit() }
        let outcome = try ChildProcess.run("/usr/bin/sqlite3", [mounts[0].1 + "/shared.db", "pragma integrity_check; select count(*) from t;"])
        let intact = writers.allSatisfy { $0.terminationStatus == 0 } && outcome.out == "ok\n2000\n"
        #expect(!intact, "two mounts of one directory kept one WAL database consistent: \(outcome.out)")
        for (process, mountPoint) in mounts {
            _ = try world.dpctl(["umount", mountPoint])
            process.waitUntilExit()
        }
    }

    /// The Swift API inside a served app writes through the file system — one protected file on
    /// disk, never one inside another — and the app gets no key: every key request on its
    /// channel is refused, a wrapping copied from another app's file included.
    @Test func theSwiftAPIWritesThroughTheFileSystemAndTheAppGetsNoKey() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.notes", ["--default-protection", "complete", "--group", "group.com.example.notes"])
        let other = try world.install("com.example.other")
        #expect(try world.testApp("com.example.other", ["write", other + "/Documents/private.txt", "the other app's secret"], extra: served(world)).status == 0)
        let wrote = try world.testApp("com.example.notes", ["write", container + "/Documents/api.txt", "written by the API"], extra: served(world))
        #expect(wrote.out == "wrote \(container)/Documents/api.txt class complete\n", "\(wrote.stderr)")
        let read = try world.testApp("com.example.notes", ["read", container + "/Documents/api.txt"], extra: served(world))
        #expect(read.out == "written by the API\n", "\(read.stderr)")
        let cat = try world.dpctl(["cat", container + "/Documents/api.txt", "--passcode-file", world.passcode])
        #expect(cat.out == "written by the API", "one protected file on disk: \(cat.stderr)")
        let defaults = try world.testApp("com.example.notes", ["defaults-set", "group.com.example.notes", "greeting", "marker-defaults"], extra: served(world))
        #expect(defaults.status == 0, "\(defaults.stderr)")
        let grep = try ChildProcess.run("/bin/grep", ["-rl", "-e", "marker-defaults", "-e", "written by the API", world.cli.root])
        #expect(grep.out.isEmpty, "plaintext under the data root: \(grep.out)")
        // The other app's file, as an attacker who copied its bytes would have them.
        let stolen = try Data(contentsOf: URL(fileURLWithPath: other + "/Documents/private.txt")).prefix(160).map { String(format: "%02x", $0) }.joined()
        for (name, op) in [("wrapNewFileKey", 8), ("unwrapFileKey", 9), ("rewrapFileKey", 10), ("wrap", 11)] {
            let answer = try world.testApp("com.example.notes", ["raw-op", String(op), stolen], extra: served(world)).out
            // Version 1, status error, and the refusal itself (not a body that failed to parse).
            #expect(answer.count >= 12 && answer.dropFirst(8).prefix(4) == "0101", "\(name): \(answer)")
            #expect(answer.contains(Array("an app cannot ask for".utf8).map { String(format: "%02x", $0) }.joined()), "\(name): \(answer)")
        }
    }

    /// A database inside an app (a Core Data store's shape): plain SQLite pages through the file
    /// system, never encrypted twice; the database and its WAL files of the class asked for; no
    /// plaintext under the data root; readable inside the app by the sqlite3 CLI.
    @Test func aDatabaseInsideAnAppIsPlainSQLiteOnTheFileSystem() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.store")   // class C by default: the database asks for A
        let db = container + "/Library/Application Support/store.db"
        // Another program made the database and its WAL files first, empty, at the directory's
        // class C: opening the database gives all three the class it asks for before any page.
        let early = try world.shell("com.example.store", "cd 'Library/Application Support' && : > store.db && : > store.db-wal && : > store.db-shm && getfattr --only-values -n user.dataprotection.class store.db-wal")
        #expect(early.out == "until-first-unlock", "\(early.out) \(early.stderr)")
        let made = try world.testApp("com.example.store", ["database", db, "marker-row"])
        #expect(made.out == "rows 100 served yes class complete\n", "\(made.out) \(made.stderr)")
        let again = try world.testApp("com.example.store", ["database", db, "marker-row"])
        #expect(again.out == "rows 200 served yes class complete\n", "\(again.out) \(again.stderr)")
        // Another program on the same database (Python's sqlite3, in a class-C container): the
        // WAL it makes gets the database's class, not the directory's; the WAL index (-shm) is
        // class C, never A (FORMAT.md §14: SQLite maps it, and class A's lock would revoke it).
        let inside = try world.shell("com.example.store", """
            cd 'Library/Application Support' && /usr/bin/sqlite3 store.db 'pragma integrity_check; select count(*) from t;' && /usr/bin/python3 -c "
            import os, sqlite3
            c = sqlite3.connect('store.db'); c.execute('insert into t values (1)'); c.commit()
            print(' '.join(os.getxattr(f, 'user.dataprotection.class').decode() for f in ('store.db', 'store.db-wal', 'store.db-shm')))"
            """)
        #expect(inside.out == "ok\n200\ncomplete complete until-first-unlock\n", "\(inside.out) \(inside.stderr)")
        let grep = try ChildProcess.run("/bin/grep", ["-rl", "marker-row", world.cli.root])
        #expect(grep.out.isEmpty, "plaintext under the data root: \(grep.out)")
        #expect(!FileManager.default.fileExists(atPath: db + "-dpkey"), "no key file: the database has no key of its own")
        // A WAL file planted as a link to another file is refused, and the file it leads to is
        // left as it was.
        let planted = try world.shell("com.example.store", "cd 'Library/Application Support' && echo other > other.txt && ln -s other.txt trap.db-wal && getfattr --only-values -n user.dataprotection.class other.txt")
        #expect(planted.out == "until-first-unlock", "\(planted.out) \(planted.stderr)")
        let trapped = try world.testApp("com.example.store", ["database", container + "/Library/Application Support/trap.db", "marker-row"])
        #expect(trapped.status != 0 && trapped.stderr.contains("symbolic link"), "\(trapped.out) \(trapped.stderr)")
        let untouched = try world.shell("com.example.store", "getfattr --only-values -n user.dataprotection.class 'Library/Application Support/other.txt'")
        #expect(untouched.out == "until-first-unlock")
    }

    /// A device from before the file system: a plaintext file in a container (as a shell in an
    /// app wrote them then). The app reads it, read-only; the audit reports it; `app set-protection
    /// --reprotect` converts it, after which the app reads and writes it as any other file.
    @Test func plaintextLeftByAnEarlierVersionIsReportedAndConverted() throws {
        let world = try AppWorld.make()
        let container = try world.install("com.example.old", ["--default-protection", "complete"])
        try Data("old plaintext".utf8).write(to: URL(fileURLWithPath: container + "/Documents/old.txt"))
        let before = try world.shell("com.example.old", "cat Documents/old.txt && echo && (echo more >> Documents/old.txt && echo appended || echo read-only)")
        #expect(before.out == "old plaintext\nread-only\n", "\(before.out) \(before.stderr)")
        #expect(try world.dpctl(["audit", "--app", "com.example.old"]).out.contains("DP101"))
        let converted = try world.dpctl(["app", "set-protection", "com.example.old", "complete", "--reprotect", "--passcode-file", world.passcode])
        #expect(converted.status == 0, "\(converted.stderr)")
        #expect(isProtected(container + "/Documents/old.txt"))
        let after = try world.shell("com.example.old", """
            cat Documents/old.txt && echo more >> Documents/old.txt && echo && cat Documents/old.txt && getfattr --only-values -n user.dataprotection.class Documents/old.txt
            """)
        #expect(after.out == "old plaintext\nold plaintextmore\ncomplete", "\(after.out) \(after.stderr)")
        #expect(!(try world.dpctl(["audit", "--app", "com.example.old"]).out.contains("DP101")))
    }

    /// One app making files by the thousand does not leave the others without the server's
    /// descriptors: past half of what it may hold, the inodes nobody uses are given back to the
    /// kernel (here a server allowed 400, while an app makes 3,000 files and another works).
    @Test func aFloodOfFilesFromOneAppLeavesTheOthersServed() throws {
        let world = try AppWorld.make()
        try world.install("com.example.flood")
        try world.install("com.example.victim")
        func start(_ id: String, _ script: String, input: Pipe? = nil) throws -> (Process, Pipe) {
            try startOnSmallServer(world, id, script, input: input, capturingErrors: true)
        }
        // The victim is in its container before the flood, and looks again after it: what the
        // sandbox mounted (its container, its metadata) and its working directory are still there.
        let go = Pipe()
        let (victim, victimOut) = try start("com.example.victim", """
            before=$(grep -c dataprotection-container.plist /proc/self/mountinfo); echo ready; read line
            for i in $(seq 1 300); do echo $i > Documents/v$i || exit 1; done
            after=$(grep -c dataprotection-container.plist /proc/self/mountinfo)
            /bin/pwd -P > /dev/null && echo "mounts $before $after cwd ok" && cat Documents/v300
            """, input: go)
        #expect(try readLine(victimOut.fileHandleForReading) == "ready")
        // The flood itself may be refused a few files (ENFILE) when it makes them faster than the
        // kernel forgets those given back (a table of 400 here; 2^20 × 3/8 as root): never many.
        let (flood, floodOut) = try start("com.example.flood", """
            failed=0; for i in $(seq 1 3000); do { printf '' > Library/Caches/f$i; } 2>/dev/null || failed=$((failed + 1)); done; echo failed $failed
            """)
        flood.waitUntilExit()
        let floodSaid = String(decoding: floodOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let floodFailed = Int(floodSaid.split(separator: " ").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? -1
        #expect(floodFailed >= 0 && floodFailed <= 300, "\(floodSaid) \(String(decoding: (flood.standardError as? Pipe)?.fileHandleForReading.readDataToEndOfFile() ?? Data(), as: UTF8.self).prefix(300))")
        go.fileHandleForWriting.write(Data("go\n".utf8))
        victim.waitUntilExit()
        #expect(String(decoding: victimOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "mounts 1 1 cwd ok\n300\n")
        // The metadata's name is reserved: no app removes one or plants one.
        let reserved = try world.shell("com.example.victim", [attempt("remove", "rm -f .dataprotection-container.plist"),
                                                              attempt("plant", "touch Documents/.dataprotection-container.plist")].joined(separator: "\n"))
        #expect(outcomes(reserved.out) == ["remove": "denied", "plant": "denied"], "\(reserved.out)")
    }

    /// Directories are never given back to the kernel (it would detach what sandboxes mounted
    /// below them), so the server shares its table out among apps: one app making directories
    /// by the thousand is refused (ENFILE) past its share (two thirds, alone), and another app
    /// — in the middle of its own work — still makes its files and directories in the third
    /// left (a server allowed 400 nodes: 133, of which the victim keeps 60 directories).
    @Test func aFloodOfDirectoriesFromOneAppLeavesTheOthersTheirShare() throws {
        let world = try AppWorld.make()
        try world.install("com.example.flood")
        try world.install("com.example.victim")
        func start(_ id: String, _ script: String, input: Pipe? = nil) throws -> (Process, Pipe) {
            try startOnSmallServer(world, id, script, input: input)
        }
        let go = Pipe()
        let (victim, victimOut) = try start("com.example.victim", """
            echo ready; read line
            failed=0
            for i in $(seq 1 60); do mkdir Documents/d$i && echo $i > Documents/d$i/f || failed=$((failed + 1)); done
            for i in $(seq 1 200); do echo $i > Documents/v$i || failed=$((failed + 1)); done
            echo victim failed $failed
            """, input: go)
        #expect(try readLine(victimOut.fileHandleForReading) == "ready")
        let (flood, floodOut) = try start("com.example.flood", """
            made=0; for i in $(seq 1 1000); do mkdir Library/Caches/d$i 2>/dev/null && made=$((made + 1)); done; echo flood made $made
            """)
        flood.waitUntilExit()
        let floodSaid = String(decoding: floodOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let made = Int(floodSaid.split(separator: " ").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? -1
        #expect(made > 100 && made < 400, "the flood is held to its share: \(floodSaid)")
        go.fileHandleForWriting.write(Data("go\n".utf8))
        victim.waitUntilExit()
        #expect(String(decoding: victimOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "victim failed 0\n")
    }

    /// What one app holds — files it keeps pinned by `O_PATH` descriptors, which the kernel
    /// never forgets while they are held — stays within its share of the server's table, so
    /// another app still makes its files and directories (a server allowed 400 nodes).
    @Test func filesOneAppPinsLeaveTheOthersTheirShare() throws {
        let world = try AppWorld.make()
        try world.install("com.example.pinner")
        try world.install("com.example.victim")
        let release = Pipe()
        let (pinner, pinnerOut) = try startOnSmallServer(world, "com.example.pinner", """
            exec python3 -c '
            import os, sys
            held = []
            for i in range(380):
                path = "Library/Caches/p%d" % i
                try:
                    open(path, "w").close()
                    held.append(os.open(path, os.O_PATH))
                except OSError:
                    pass
            print("pinned", len(held), flush=True)
            sys.stdin.readline()
            '
            """, input: release)
        let said = try readLine(pinnerOut.fileHandleForReading)
        let pinned = Int(said.split(separator: " ").last ?? "") ?? -1
        #expect(pinned > 100 && pinned <= 400 * 2 / 3, "held to its share: \(said)")
        let (victim, victimOut) = try startOnSmallServer(world, "com.example.victim", """
            failed=0
            for i in $(seq 1 200); do echo $i > Documents/v$i || failed=$((failed + 1)); done
            for i in $(seq 1 20); do mkdir Documents/d$i || failed=$((failed + 1)); done
            echo victim failed $failed
            """)
        victim.waitUntilExit()
        #expect(String(decoding: victimOut.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self) == "victim failed 0\n")
        release.fileHandleForWriting.write(Data("done\n".utf8))
        pinner.waitUntilExit()
    }

    /// Modes hold inside an app as on the kernel's own file system for the same process (its
    /// user's ID, no capability: `bwrap --cap-drop ALL` on a plain directory), though the server
    /// runs as root: a file made read-only is not written by a new open — even while a
    /// descriptor of it opened for writing before is still open, which still writes — nor
    /// truncated, nor has its class set; its owner may change the mode.
    @Test func modesHoldInsideAnAppAsOnTheKernelsOwnFileSystem() throws {
        let world = try AppWorld.make()
        try world.install("com.example.modes")
        let check = """
            check() {
              cd "$1" || exit 1
              echo one > ro && chmod 444 ro
              echo one > held && exec 3>>held && chmod 444 held
              \(attempt("write", "echo two >> ro"))
              \(attempt("truncate", "truncate -s 0 ro"))
              \(attempt("reopen", "echo two >> held"))
              \(attempt("held", "echo three >&3"))
              \(attempt("class", "setfattr -n user.dataprotection.class -v complete ro"))
              \(attempt("chmod", "chmod 644 ro"))
              exec 3>&-
              echo "content $(cat ro held | tr '\\n' ' ')"
            }
            """
        let plain = temporaryDirectory().path
        let oracle = try ChildProcess.run("bwrap", ["--dev-bind", "/", "/", "--cap-drop", "ALL", "/bin/sh", "-c", check + "\ncheck " + plain])
        #expect(outcomes(oracle.out) == ["write": "denied", "truncate": "denied", "reopen": "denied", "held": "ok", "class": "denied",
                                         "chmod": "ok"], "plain: \(oracle.out) \(oracle.err)")
        let app = try world.shell("com.example.modes", check + "\ncheck Documents")
        #expect(app.out == oracle.out, "the protected file system answers as the kernel's own does: \(app.stderr)")
    }

    /// Inside an app, following the device's lock (keybagd, its clock moved by the test): a
    /// class-A file opened and mapped before the lock is unreadable after lock + grace — the
    /// descriptor gets EACCES, the mapped page SIGBUS, a new open EACCES — and after the next
    /// unlock it reads again, with what the map wrote before the lock.
    @Test func classAHoldsInsideTheAppAcrossTheDevicesLock() throws {
        let world = try AppWorld.make()
        try world.install("com.example.notes", ["--default-protection", "complete"])
        let daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode], environment: daemon.environment).status == 0)
        let holder = try FileHolder(in: world.cli.root, launcher: [CLI.executable.path, "--root", world.cli.root, "app", "run", "com.example.notes",
                                                                    "--"], environment: daemon.environment)
        #expect(try holder.send("create Documents/secret.txt class A secret") == "ok")
        #expect(try holder.send("map Documents/secret.txt") == "ok")
        #expect(try holder.send("mapwrite Documents/secret.txt DIRTY") == "ok")
        #expect(try world.dpctl(["lock"], environment: daemon.environment).status == 0)
        try daemon.advance(3600, root: world.cli.root)
        #expect(try holder.await("read Documents/secret.txt", "EACCES") == "EACCES", "a descriptor opened before the lock")
        #expect(try holder.send("mapread Documents/secret.txt") == "signal \(SIGBUS)", "a page mapped before the lock")
        #expect(try holder.send("reopen Documents/secret.txt") == "EACCES")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode], environment: daemon.environment).status == 0)
        #expect(try holder.await("read Documents/secret.txt", "DIRTY A secret") == "DIRTY A secret")
        holder.close()
        #expect(holder.process.terminationStatus == 0)
    }

    /// keybagd killed and started again under a running app: its supervisor, the apps' file
    /// system server and the app follow the new daemon — classes A and C unavailable before its
    /// first unlock, back after it, class A gone again at its next lock + grace.
    @Test func aRunningAppFollowsKeybagdThroughARestart() throws {
        var world = try AppWorld.make()
        try world.install("com.example.restart", ["--default-protection", "until-first-unlock"])
        var daemon = try KeybagdProcess(cli: world.cli)
        defer { daemon.stop() }
        world.environment = daemon.environment
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        let made = try world.shell("com.example.restart", "printf 'class C' > Documents/c.txt && printf 'class A' > Documents/a.txt"
                                   + " && setfattr -n user.dataprotection.class -v complete Documents/a.txt")
        #expect(made.status == 0, "\(made.stderr)")
        let holder = try FileHolder(in: world.cli.root, launcher: [CLI.executable.path, "--root", world.cli.root, "app", "run", "com.example.restart",
                                                                    "--"], environment: daemon.environment)
        #expect(try holder.send("cat Documents/a.txt") == "class A")
        daemon.kill()
        daemon = try KeybagdProcess(cli: world.cli)
        #expect(try holder.await("cat Documents/a.txt", "EACCES") == "EACCES", "class A before the new daemon's first unlock")
        #expect(try holder.send("cat Documents/c.txt") == "EACCES", "class C before the new daemon's first unlock")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        #expect(try holder.await("cat Documents/a.txt", "class A") == "class A", "class A after the unlock")
        #expect(try holder.send("cat Documents/c.txt") == "class C", "class C after the unlock")
        #expect(try world.dpctl(["lock"]).status == 0)
        try daemon.advance(3600, root: world.cli.root)
        #expect(try holder.await("cat Documents/a.txt", "EACCES") == "EACCES", "class A after the next lock + grace")
        #expect(try holder.send("cat Documents/c.txt") == "class C", "class C stays after the first unlock")
        #expect(try world.dpctl(["unlock", "--passcode-file", world.passcode]).status == 0)
        holder.close()
        #expect(holder.process.terminationStatus == 0)
    }

    /// `sh -c script` running as app `id`, its containers served by a server allowed 400 nodes;
    /// its standard output (and, if asked, its standard error, as `standardError`) in pipes.
    private func startOnSmallServer(_ world: AppWorld, _ id: String, _ script: String, input: Pipe? = nil,
                                    capturingErrors: Bool = false) throws -> (Process, Pipe) {
        let process = Process()
        process.executableURL = CLI.executable
        process.arguments = ["--root", world.cli.root, "app", "run", id, "--passcode-file", world.passcode, "--", "/bin/sh", "-c", script]
        process.environment = ProcessInfo.processInfo.environment.merging(["DATAPROTECTION_FS_MAX_NODES": "400"]) { $1 }
        let out = Pipe()
        process.standardOutput = out
        if capturingErrors { process.standardError = Pipe() }
        if let input { process.standardInput = input }
        try process.run()
        return (process, out)
    }

    private func pythonString(_ text: String) -> String { "'" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'" }
}
