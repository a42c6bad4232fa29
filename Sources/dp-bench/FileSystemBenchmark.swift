import ArgumentParser
import DataProtection
import DataProtectionContainers
import DataProtectionFileSystem
@_spi(Testing) import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dp-bench fs`: the protected file system beside gocryptfs (its ciphertext in the same place,
/// same run) and the plain directory, on the workloads of docs/BENCHMARKS.md: sequential write and
/// read, random 4 KiB reads with a cold page cache, untar of 10,000 small files, `ls -lR`,
/// `rm -rf`, SQLite WAL inserts and point selects. Medians of interleaved runs.
struct FileSystemBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fs",
        abstract: "The protected file system vs gocryptfs and plain.",
        usage: "dp-bench fs [<options>]",
        discussion:
            "Needs fuse3; gocryptfs (apt-get install gocryptfs) for the peer. As root the page cache is dropped before cold reads."
    )

    @Option(help: "Size of the sequential file, in MiB.") var megabytes = 512
    @Option(help: "Files in the tree that is untarred, listed and removed.") var files = 10_000
    @Option(help: "Interleaved runs (the median is kept).") var runs = 3
    @Option(help: "SQLite rows inserted (in transactions of 1,000).") var rows = 100_000
    @Option(
        help:
            "Where every place keeps its files (default, as root: a tmpfs mounted for the run — as the reference figures were measured, so that what is timed is each file system's own cost; else the temporary directory). Give a directory on a disk to time the disk too."
    )
    var dir: String?

    struct Place {
        let name: String
        let directory: String
        /// For a place inside an app: how to run a command as the app (`dpctl app run ID --`).
        var app: [String]? = nil
    }

    func run() async throws {
        let base = URL(fileURLWithPath: dir ?? NSTemporaryDirectory()).appendingPathComponent(
            "dp-bench-fs-\(UUID().uuidString.prefix(8))"
        ).path
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        // A tmpfs of the run's own (not /dev/shm: apps may not keep their containers below /dev).
        let ownTmpfs =
            dir == nil && geteuid() == 0
            && runTool(
                "/bin/mount", ["-t", "tmpfs", "-o", "size=16g,mode=0755", "dp-bench-fs", base], discardOutput: true)
                != nil
        defer { if ownTmpfs { _ = runTool("/bin/umount", ["-l", base], discardOutput: true) } }
        for name in ["plain", "data", "mnt", "gocryptfs-cipher", "gocryptfs-mnt"] {
            try FileManager.default.createDirectory(atPath: base + "/" + name, withIntermediateDirectories: true)
        }
        // Ours, served by this process.
        let keybag = try await Keybag.create(root: base + "/root", passcode: nil, kdf: .insecureFastForTesting)
        let fileSystem = try ProtectedFileSystem(directory: base + "/data", files: ProtectedFileManager(keybag: keybag))
        let mounted = try fileSystem.mount(at: base + "/mnt")
        let serving = Task { await mounted.serve() }
        defer { try? mounted.unmount() }
        // gocryptfs, its ciphertext beside ours.
        var places = [
            Place(name: "plain directory", directory: base + "/plain"), Place(name: "ours", directory: base + "/mnt"),
        ]
        // Inside an app: its container, served by the containers' file system (`dpctl app run`).
        let dpctl = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("dpctl").path
        if FileManager.default.isExecutableFile(atPath: dpctl) {
            let manager = ContainerManager(files: ProtectedFileManager(keybag: keybag))
            let app = try await manager.install(try AppIdentifier("com.example.fsbench"))
            places.append(
                Place(
                    name: "inside an app", directory: app.documents.path,
                    app: [dpctl, "--root", keybag.root, "app", "run", "com.example.fsbench", "--"]))
        } else {
            print("dp-bench fs: no dpctl beside dp-bench: no figures inside an app")
        }
        let gocryptfs = ["/usr/bin/gocryptfs", "/usr/local/bin/gocryptfs"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
        if let gocryptfs {
            try Data("benchmark password\n".utf8).write(to: URL(fileURLWithPath: base + "/gocryptfs-pass"))
            guard
                runTool(
                    gocryptfs, ["-init", "-q", "-passfile", base + "/gocryptfs-pass", base + "/gocryptfs-cipher"],
                    discardOutput: true) != nil,
                runTool(
                    gocryptfs,
                    ["-q", "-passfile", base + "/gocryptfs-pass", base + "/gocryptfs-cipher", base + "/gocryptfs-mnt"],
                    discardOutput: true) != nil
            else {
                throw ValidationError("gocryptfs could not mount its directory")
            }
            places.append(Place(name: "gocryptfs", directory: base + "/gocryptfs-mnt"))
        } else {
            print("dp-bench fs: gocryptfs is not installed (apt-get install gocryptfs): no peer figures")
        }
        defer {
            if gocryptfs != nil { _ = runTool("fusermount3", ["-u", base + "/gocryptfs-mnt"], discardOutput: true) }
        }
        let cold = geteuid() == 0
        print(
            "dp-bench fs: files in \(base) (\(fileSystemName(base))); \(megabytes) MiB sequential, \(files) small files, \(rows) SQLite rows; median of \(runs) interleaved runs; page cache \(cold ? "dropped before cold reads" : "not dropped (not root)")"
        )

        // A tree to untar: `files` files of 0–8 KiB in 100 directories.
        let tree = base + "/tree.tar"
        try makeTree(at: base + "/tree-source", tar: tree)
        // The app reads the tree from its own container (a plain file there: served read-only).
        for place in places where place.app != nil {
            try FileManager.default.copyItem(atPath: tree, toPath: place.directory + "/tree.tar")
        }

        var figures: [String: [String: [Double]]] = [:]
        func record(_ place: Place, _ metric: String, _ value: Double) {
            figures[metric, default: [:]][place.name, default: []].append(value)
        }
        for _ in 0..<runs {
            for place in places {
                let d = place.directory
                let tar = place.app == nil ? tree : d + "/tree.tar"
                record(
                    place, "write",
                    try time(
                        "dd if=/dev/zero of='\(d)/seq' bs=128k count=\(megabytes * 8) conv=fsync status=none",
                        as: place.app))
                dropCaches(cold)
                record(place, "read", try time("dd if='\(d)/seq' of=/dev/null bs=128k status=none", as: place.app))
                dropCaches(cold)
                let (p50, p99) = try randomReads(d + "/seq", as: place.app)
                record(place, "p50", p50)
                record(place, "p99", p99)
                try FileManager.default.removeItem(atPath: d + "/seq")
                record(place, "untar", try time("mkdir '\(d)/t' && tar -C '\(d)/t' -xf '\(tar)'", as: place.app))
                dropCaches(cold)
                record(place, "ls", try time("ls -lR '\(d)/t' > /dev/null", as: place.app))
                record(place, "rm", try time("rm -rf '\(d)/t'", as: place.app))
                let (inserts, selects) = try sqlite(d + "/bench.db", as: place.app)
                record(place, "inserts", inserts)
                record(place, "selects", selects)
                for suffix in ["", "-wal", "-shm"] {
                    try? FileManager.default.removeItem(atPath: d + "/bench.db" + suffix)
                }
            }
        }
        func median(_ metric: String, _ place: String) -> Double? { figures[metric]?[place].map { percentile($0, 50) } }
        let mib = Double(megabytes)
        func rowsFor(
            _ metric: String, _ label: String, _ unit: String, higher: Bool, transform: (Double) -> Double = { $0 }
        ) -> [Row] {
            guard let ours = median(metric, "ours") else { return [] }
            return places.filter { $0.name != "ours" }.map { peer in
                Row(
                    metric: label, ours: transform(ours), peerName: peer.name,
                    peer: median(metric, peer.name).map(transform), unit: unit, higherIsBetter: higher)
            }
        }
        var table: [Row] = []
        table += rowsFor("write", "sequential write \(megabytes) MiB (dd, fsync)", "MiB/s", higher: true) { mib / $0 }
        table += rowsFor("read", "sequential read \(megabytes) MiB\(cold ? ", cold" : "")", "MiB/s", higher: true) {
            mib / $0
        }
        table += rowsFor("p50", "random 4 KiB pread p50\(cold ? ", cold" : "")", "µs", higher: false)
        table += rowsFor("p99", "random 4 KiB pread p99\(cold ? ", cold" : "")", "µs", higher: false)
        table += rowsFor("untar", "untar \(files) files", "s", higher: false)
        table += rowsFor("ls", "ls -lR of that tree\(cold ? ", cold" : "")", "s", higher: false)
        table += rowsFor("rm", "rm -rf of that tree", "s", higher: false)
        table += rowsFor("inserts", "SQLite WAL, \(rows) inserts in \(rows / 1000) transactions", "s", higher: false)
        table += rowsFor("selects", "SQLite, 10,000 point selects", "s", higher: false)
        printTable(table)
        print("")
        let versus = { (metric: String, higher: Bool) -> String in
            guard let ours = median(metric, "ours"), let peer = median(metric, "gocryptfs") else { return "n/a" }
            return String(format: "%.2f", higher ? peer / ours : peer / ours)
        }
        // Every figure is a time here but the two throughputs (times too, before the transform):
        // gocryptfs's time / ours is "× gocryptfs's speed".
        // Inside an app, beside gocryptfs (the same workloads through `dpctl app run`).
        let appVersus = { (metric: String) -> String in
            guard let inApp = median(metric, "inside an app"), let peer = median(metric, "gocryptfs") else {
                return "n/a"
            }
            return String(format: "%.2f", peer / inApp)
        }
        if places.contains(where: { $0.app != nil }) {
            print(
                "inside an app vs gocryptfs (speed): "
                    + ["write", "read", "p50", "p99", "untar", "ls", "rm", "inserts", "selects"]
                    .map { "\($0) \(appVersus($0))×" }.joined(separator: ", "))
        }
        print("targets: at least gocryptfs's speed on every line; 1.5× on untar, ls -lR and SQLite inserts")
        print(
            "summary: "
                + ["write", "read", "p50", "p99", "untar", "ls", "rm", "inserts", "selects"].map {
                    "\($0)_vs_gocryptfs=\(versus($0, false))"
                }.joined(separator: " ")
                + String(
                    format: " write_mib_s=%.0f read_mib_s=%.0f p99_us=%.1f untar_s=%.2f ls_s=%.2f inserts_s=%.2f",
                    mib / (median("write", "ours") ?? .nan), mib / (median("read", "ours") ?? .nan),
                    median("p99", "ours") ?? .nan,
                    median("untar", "ours") ?? .nan, median("ls", "ours") ?? .nan, median("inserts", "ours") ?? .nan)
                + " "
                + ["untar", "ls", "rm", "inserts"].map { "app_\($0)_vs_gocryptfs=\(appVersus($0))" }.joined(
                    separator: " "))
        try mounted.unmount()
        await serving.value
    }

    /// Runs `script` with `sh -c` (as the app, with `app`: timed inside it, the launch left
    /// out); its wall time in seconds.
    private func time(_ script: String, as app: [String]? = nil) throws -> Double {
        guard let app else {
            guard let run = runTool("/bin/sh", ["-c", script], discardOutput: true) else {
                throw ValidationError("failed: \(script)")
            }
            return run.seconds
        }
        let timed = "s=$(date +%s%N); \(script) || exit 1; e=$(date +%s%N); echo $((e - s))"
        guard let run = runTool(app[0], Array(app.dropFirst()) + ["/bin/sh", "-c", timed]),
            let ns = Double(run.output.trimmingCharacters(in: .whitespacesAndNewlines))
        else { throw ValidationError("failed in the app: \(script)") }
        return ns / 1e9
    }

    /// Runs a Python script (as the app, with `app`) and returns its output.
    private func python(_ script: String, as app: [String]?) -> String? {
        runTool(
            app?[0] ?? "/usr/bin/python3",
            (app.map { Array($0.dropFirst()) + ["/usr/bin/python3"] } ?? []) + ["-c", script])?.output
    }

    private func dropCaches(_ cold: Bool) {
        guard cold else { return }
        sync()
        if let handle = FileHandle(forWritingAtPath: "/proc/sys/vm/drop_caches") {
            handle.write(Data("3\n".utf8))
            try? handle.close()
        }
    }

    /// p50 and p99 of 2,000 random 4 KiB `pread`s, in µs (Python's clock around each call).
    private func randomReads(_ path: String, as app: [String]? = nil) throws -> (Double, Double) {
        let script = """
            import os, random, time
            fd = os.open(\(pythonString(path)), os.O_RDONLY); size = os.fstat(fd).st_size; random.seed(7); times = []
            for _ in range(2000):
                offset = random.randrange(0, size // 4096) * 4096
                start = time.perf_counter_ns(); os.pread(fd, 4096, offset); times.append((time.perf_counter_ns() - start) / 1000)
            times.sort(); print(times[len(times) // 2], times[int(len(times) * 0.99)])
            """
        guard let output = python(script, as: app) else { throw ValidationError("random reads failed") }
        let parts = output.split(separator: " ").compactMap {
            Double($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        guard parts.count == 2 else { throw ValidationError("random reads: \(output)") }
        return (parts[0], parts[1])
    }

    /// Seconds for `rows` inserts in transactions of 1,000 (WAL), and for 10,000 point selects.
    private func sqlite(_ path: String, as app: [String]? = nil) throws -> (Double, Double) {
        let script = """
            import sqlite3, time, random
            c = sqlite3.connect(\(pythonString(path)), isolation_level=None); c.execute("pragma journal_mode=wal"); c.execute("create table t(id integer primary key, v text)")
            start = time.perf_counter()
            for b in range(\(rows) // 1000):
                c.execute("begin"); c.executemany("insert into t(v) values (?)", (("row %d" % (b * 1000 + i),) for i in range(1000))); c.execute("commit")
            inserts = time.perf_counter() - start
            random.seed(3); start = time.perf_counter()
            for _ in range(10000): c.execute("select v from t where id = ?", (random.randrange(1, \(rows)),)).fetchone()
            print(inserts, time.perf_counter() - start)
            """
        guard let output = python(script, as: app) else { throw ValidationError("SQLite failed") }
        let parts = output.split(separator: " ").compactMap {
            Double($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        guard parts.count == 2 else { throw ValidationError("SQLite: \(output)") }
        return (parts[0], parts[1])
    }

    private func makeTree(at directory: String, tar: String) throws {
        var generator = SystemRandomNumberGenerator()
        for index in 0..<files {
            let folder = directory + "/d\(index % 100)"
            if index < 100 {
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            }
            let size = Int.random(in: 0...8192, using: &generator)
            try Data((0..<size).map { _ in UInt8.random(in: 32...126, using: &generator) }).write(
                to: URL(fileURLWithPath: folder + "/f\(index)"))
        }
        guard runTool("/bin/tar", ["-C", directory, "-cf", tar, "."], discardOutput: true) != nil else {
            throw ValidationError("tar failed")
        }
        try FileManager.default.removeItem(atPath: directory)
    }

    private func pythonString(_ text: String) -> String {
        "'" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'"
    }
}

/// The kind of file system holding `path` (`tmpfs`, `ext4`, …), as /proc/mounts names it.
private func fileSystemName(_ path: String) -> String {
    guard let mounts = try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8) else { return "unknown" }
    let resolved = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
    var best: (point: String, type: String) = ("", "unknown")
    for line in mounts.split(separator: "\n") {
        let fields = line.split(separator: " ")
        guard fields.count > 2 else { continue }
        let point = String(fields[1])
        if (resolved == point || resolved.hasPrefix(point == "/" ? "/" : point + "/")), point.count >= best.point.count
        {
            best = (point, String(fields[2]))
        }
    }
    return best.type
}
