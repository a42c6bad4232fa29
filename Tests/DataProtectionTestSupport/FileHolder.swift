import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A program holding files open (Python), driven one command per line on its standard input,
/// one answer per line: `open NAME` (read-write), `create NAME TEXT` (new, then written),
/// `read NAME`, `write NAME TEXT` (at offset 0), `map NAME`, `mapwrite NAME TEXT` (no msync),
/// `mapread NAME` (in a child: SIGBUS shows as such), `reopen NAME` (a new open, closed at once),
/// `cat NAME`. An error answers its errno's name.
public final class FileHolder {
    public static let script = """
        import errno, mmap, os, sys
        fds, maps = {}, {}
        def answer(text): print(text, flush=True)
        def err(e): return errno.errorcode.get(e.errno, str(e.errno))
        for line in sys.stdin:
            parts = line.rstrip("\\n").split(" ", 2)
            op, name = parts[0], parts[1]
            try:
                if op == "open": fds[name] = os.open(name, os.O_RDWR); answer("ok")
                elif op == "create":
                    fds[name] = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600); os.write(fds[name], parts[2].encode()); answer("ok")
                elif op == "read": answer(os.pread(fds[name], 64, 0).decode())
                elif op == "write": os.pwrite(fds[name], parts[2].encode(), 0); answer("ok")
                elif op == "map": maps[name] = mmap.mmap(fds[name], 0); answer("ok")
                elif op == "mapwrite": maps[name][0:len(parts[2])] = parts[2].encode(); answer("ok")
                elif op == "mapread":
                    pid = os.fork()
                    if pid == 0:
                        os.write(1, bytes(maps[name][0:5]) + b"\\n"); os._exit(0)
                    _, status = os.waitpid(pid, 0)
                    if os.WIFSIGNALED(status): answer("signal %d" % os.WTERMSIG(status))
                elif op == "reopen": os.close(os.open(name, os.O_RDONLY)); answer("ok")
                elif op == "cat": answer(open(name).read())
            except OSError as e:
                answer(err(e))
        """

    public let process = Process()
    let input = Pipe(), output = Pipe()

    /// Runs the program in `directory` (`python3` itself), or as `launcher` + `python3 -c SCRIPT`
    /// (as an app: `dpctl app run ID --`).
    /// A program that holds one SQLite database (`db.sqlite`, WAL) open, in Python's `sqlite3`:
    /// `open` (WAL, a table), `insert` (one row of 3,000 bytes in its own transaction), `count`,
    /// `check` (`integrity_check`); a failure answers `error` (its message on standard error).
    public static let databaseScript = """
        import sqlite3, sys
        c = sqlite3.connect("db.sqlite", isolation_level=None, timeout=0)
        def answer(text): print(text, flush=True)
        for line in sys.stdin:
            op = line.strip()
            try:
                if op == "open":
                    c.execute("pragma journal_mode=wal"); c.execute("create table if not exists t(x)"); answer("ok")
                elif op == "insert":
                    c.execute("begin immediate"); c.execute("insert into t values (randomblob(3000))"); c.execute("commit"); answer("ok")
                elif op == "count": answer(str(c.execute("select count(*) from t").fetchone()[0]))
                elif op == "check": answer(c.execute("pragma integrity_check").fetchone()[0])
            except sqlite3.Error as e:
                print("sqlite3: %s" % e, file=sys.stderr, flush=True)
                try: c.execute("rollback")
                except sqlite3.Error: pass
                answer("error")
        """

    public init(in directory: String, launcher: [String] = [], environment: [String: String]? = nil, script: String = FileHolder.script) throws {
        if launcher.isEmpty {
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", script]
        } else {
            process.executableURL = URL(fileURLWithPath: launcher[0])
            process.arguments = Array(launcher.dropFirst()) + ["/usr/bin/python3", "-c", script]
        }
        if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        (process.standardInput, process.standardOutput) = (input, output)
        try process.run()
    }

    public func send(_ command: String) throws -> String {
        try input.fileHandleForWriting.write(contentsOf: Data((command + "\n").utf8))
        return try readLine(output.fileHandleForReading.fileDescriptor, timeout: 60)
    }

    /// Asks `command` until it answers `expected` (a mount applies a lock a moment after the
    /// keybag discards the key): at most `attempts` times.
    public func await(_ command: String, _ expected: String, attempts: Int = 2000) throws -> String {
        var last = ""
        for _ in 0..<attempts {
            last = try send(command)
            if last == expected { return last }
            usleep(1000)
        }
        return last
    }

    /// Ends the program (its descriptors and maps close: a lazily unmounted file system ends then).
    public func close() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }

    deinit { close() }
}
