import ArgumentParser
import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `dp-bench apps`: what the sandbox costs — launching, opening files inside it — and
/// preferences beside Foundation's own `UserDefaults`.
struct AppsBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apps",
        abstract: "Sandboxed launches, opens and preferences vs peers.",
        usage: "dp-bench apps [<options>]",
        discussion:
            "Sandboxed launch latency beside bubblewrap alone and an unconfined start; opens inside vs outside, alone and beside another app's flood; preferences vs UserDefaults."
    )

    @Option(help: "Launches of /bin/true measured per way of launching.") var launches = 100
    @Option(help: "File opens + 4 KiB reads measured inside and outside the sandbox.") var opens = 50_000
    @Option(help: "Preferences set + synchronize rounds.") var preferences = 1_000
    @Option(
        help: ArgumentHelp(
            "The dpctl whose `app run` is measured (default: the one beside dp-bench; `scripts/install` builds a static one).",
            valueName: "path"))
    var dpctl: String?

    func validate() throws {
        if let dpctl, !FileManager.default.isExecutableFile(atPath: dpctl) {
            throw ValidationError("--dpctl \(dpctl): not an executable file")
        }
    }

    func run() async throws {
        let workspace = try Workspace("apps")
        defer { workspace.remove() }
        let base = workspace.base
        let keybag = try await workspace.keybag()
        let files = ProtectedFileManager(keybag: keybag)
        let manager = ContainerManager(files: files)
        let id = try AppIdentifier("com.example.bench")
        let app = try await manager.install(id)
        let requirements = try SandboxRequirements.probe()
        let supervisor = AppSupervisor(manager: manager)
        // The containers' file system served for the whole run, as keybagd's linger keeps it for
        // `dpctl app run`: every launch below takes a lease on a server already running.
        let served = try ContainerFileSystem.lease(manager.layout, launch: supervisor.fileSystem)
        defer { withExtendedLifetime(served) {} }
        print(
            "dp-bench apps: \(launches) launches of /bin/true each way, \(opens) opens of a 4 KiB file, \(preferences) preference rounds; Landlock ABI \(requirements.landlockABI)"
        )

        // Launch latency, median of `launches`.
        func median(_ body: () async throws -> Double) async throws -> Double {
            var samples: [Double] = []
            for _ in 0..<launches { samples.append(try await body() * 1000) }
            return percentile(samples, 50)
        }
        let unconfined = try await median {
            guard let run = runTool("/bin/true", [], discardOutput: true) else {
                throw ValidationError("/bin/true failed")
            }; return run.seconds
        }
        let profile = SandboxProfile(
            requirements: requirements, app: app, groups: [], executable: "/usr/bin/true", arguments: [],
            environment: AppSupervisor.appEnvironment(app, passing: [:]),
            limits: AppResourceLimits(metadata: app.metadata))
        let bwrapArguments = profile.bubblewrapArguments(landlock: false)
        let bwrapAlone = try await median {
            guard let run = runTool(requirements.bubblewrap, bwrapArguments, discardOutput: true) else {
                throw ValidationError("bubblewrap failed")
            }
            return run.seconds
        }
        let supervised = try await median {
            try await seconds {
                guard try await supervisor.run(id, command: ["/bin/true"]) == 0 else {
                    throw ValidationError("app run failed")
                }
            }
        }
        let dpctl =
            self.dpctl
            ?? URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent(
                "dpctl"
            ).path
        let viaCLI: Double? =
            FileManager.default.isExecutableFile(atPath: dpctl)
            ? try await median {
                guard
                    let run = runTool(
                        dpctl, ["--root", keybag.root, "app", "run", id.rawValue, "--", "/bin/true"],
                        discardOutput: true)
                else {
                    throw ValidationError("dpctl app run failed")
                }
                return run.seconds
            } : nil

        // Opens + 4 KiB reads of a protected file, by this executable run as a probe: outside (on
        // the mount, unconfined), then inside (the sandbox, the same mount).
        let file = app.documents.appendingPathComponent("probe.bin")
        try await files.write(Data(repeating: 7, count: 4096), to: file)
        let me =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let result = app.temporaryDirectory.appendingPathComponent("probe-result")
        let servedResult = served.served(result.path, layout: manager.layout)   // read and written through the mount
        func probe(_ sandboxed: Bool) async throws -> Double {
            let command = [me, "apps-probe", file.path, String(opens), result.path]
            if sandboxed {
                guard try await supervisor.run(id, command: command) == 0 else {
                    throw ValidationError("the sandboxed probe failed")
                }
            } else {
                let outside = [
                    "apps-probe", served.served(file.path, layout: manager.layout), String(opens), servedResult,
                ]
                guard runTool(me, outside, discardOutput: true) != nil else {
                    throw ValidationError("the probe failed")
                }
            }
            guard let text = try? String(contentsOfFile: servedResult, encoding: .utf8), let ns = Double(text) else {
                throw ValidationError("no probe result")
            }
            return ns
        }
        let outsideNs = try await probe(false)
        let insideNs = try await probe(true)

        // The same probe while another app floods the file system with creates and removes: what
        // one app's load costs another (on two cores, the flood also takes one of them).
        let flooder = try AppIdentifier("com.example.flood")
        let flood = try await manager.install(flooder)
        let stop = flood.temporaryDirectory.appendingPathComponent("stop")
        let flooding = Task {
            try await supervisor.run(
                flooder,
                command: [
                    "/bin/sh", "-c",
                    """
                    i=0; while [ ! -e tmp/stop ]; do i=$((i + 1)); printf x > Library/Caches/f$i; mkdir Library/Caches/d$i; done
                    """,
                ])
        }
        let besideFloodNs = try await probe(true)
        _ = FileManager.default.createFile(atPath: stop.path, contents: nil)
        _ = try await flooding.value

        // Preferences: set + synchronize, ours (a protected property list) and Foundation's, in
        // blocks of rounds taking turns at going first, each block after a `sync()` off the clock
        // (nothing one side left unwritten is timed on the other's clock). Foundation's rounds
        // each end with an `fsync`; ours defer it (as cfprefsd does): each of our blocks ends
        // with a `sync()` on our clock, so what we deferred is paid for by us.
        sync()
        let defaults = ProtectedUserDefaults(
            url: app.preferences.appendingPathComponent("com.example.bench.plist"), files: files)
        let suite = "dp-bench-\(UUID().uuidString.prefix(8))"
        let foundation = UserDefaults(suiteName: suite)!
        func oursRounds(_ range: Range<Int>) throws {
            for i in range {
                defaults.set(i, forKey: "counter");
                guard defaults.synchronize() else { throw ValidationError("synchronize failed") }
            }
        }
        func foundationRounds(_ range: Range<Int>) {
            for i in range { foundation.set(i, forKey: "counter"); foundation.synchronize() }
        }
        try oursRounds(0..<50)
        foundationRounds(0..<50)
        var oursElapsed = 0.0, foundationElapsed = 0.0
        let block = max(1, preferences / 10)
        for (index, start) in stride(from: 0, to: preferences, by: block).enumerated() {
            let range = start..<min(preferences, start + block)
            for oursNow in index % 2 == 0 ? [true, false] : [false, true] {
                sync()
                if oursNow {
                    oursElapsed += try await seconds {
                        try oursRounds(range); sync()
                    }
                } else {
                    foundationElapsed += await seconds { foundationRounds(range) }
                }
            }
        }
        foundation.removePersistentDomain(forName: suite)
        let oursRate = Double(preferences) / oursElapsed, foundationRate = Double(preferences) / foundationElapsed

        let rows = [
            Row(
                metric: "launch /bin/true, sandboxed (AppSupervisor)", ours: supervised,
                peerName: "bubblewrap alone, same mounts", peer: bwrapAlone, unit: "ms", higherIsBetter: false),
            Row(
                metric: "  the same, through `dpctl app run`", ours: viaCLI ?? .nan,
                peerName: "bubblewrap alone, same mounts", peer: bwrapAlone, unit: "ms", higherIsBetter: false),
            Row(
                metric: "  bubblewrap alone", ours: bwrapAlone, peerName: "unconfined /bin/true", peer: unconfined,
                unit: "ms", higherIsBetter: false),
            Row(
                metric: "open + 4 KiB read, inside the sandbox", ours: insideNs / 1000,
                peerName: "outside (unconfined)", peer: outsideNs / 1000, unit: "µs", higherIsBetter: false),
            Row(
                metric: "  the same, beside another app's flood", ours: besideFloodNs / 1000, peerName: "alone",
                peer: insideNs / 1000, unit: "µs", higherIsBetter: false),
            Row(
                metric: "preferences set + synchronize", ours: oursRate, peerName: "Foundation UserDefaults",
                peer: foundationRate, unit: "/s"),
        ]
        printTable(rows)
        print("")
        print(
            "targets: launch ≤ 2× bubblewrap's (\(String(format: "%.2f", supervised / bwrapAlone))×; through dpctl \(String(format: "%.2f", (viaCLI ?? .nan) / bwrapAlone))×), opens ≤ 1.3× unconfined (\(String(format: "%.2f", insideNs / outsideNs))×), preferences ≥ 1.0× Foundation's (\(String(format: "%.2f", oursRate / foundationRate))×)"
        )
        print(
            String(
                format:
                    "summary: launch_ms=%.2f dpctl_launch_ms=%.2f bwrap_ms=%.2f unconfined_ms=%.2f launch_vs_bwrap=%.2f open_inside_us=%.2f open_outside_us=%.2f open_ratio=%.2f open_beside_flood_us=%.2f prefs_per_s=%.0f userdefaults_per_s=%.0f",
                supervised, viaCLI ?? -1, bwrapAlone, unconfined, supervised / bwrapAlone, insideNs / 1000,
                outsideNs / 1000, insideNs / outsideNs, besideFloodNs / 1000, oursRate, foundationRate))
    }
}

/// The probe `dp-bench apps` runs inside and outside the sandbox: COUNT opens + 4 KiB reads of
/// FILE, nanoseconds per round written to RESULT.
struct AppsProbe: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apps-probe", abstract: "(used by dp-bench apps)", shouldDisplay: false)
    @Argument var file: String
    @Argument var count: Int
    @Argument var result: String

    func run() throws {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let clock = ContinuousClock()
        let start = clock.now
        for _ in 0..<count {
            let fd = open(file, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw ValidationError("\(file): \(String(cString: strerror(errno)))") }
            guard read(fd, &buffer, 4096) == 4096 else { throw ValidationError("short read") }
            close(fd)
        }
        let elapsed = clock.now - start
        let ns =
            (Double(elapsed.components.seconds) * 1e9 + Double(elapsed.components.attoseconds) / 1e9) / Double(count)
        try String(ns).write(toFile: result, atomically: true, encoding: .utf8)
    }
}
