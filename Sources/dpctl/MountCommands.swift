import ArgumentParser
import DataProtection
import DataProtectionFileSystem
import DataProtectionKeybag
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

struct Mount: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mount",
        abstract: "Serve protected files to every program (FUSE).",
        usage: "dpctl mount <directory> <mount-point> [--passcode-file F]",
        discussion: """
            Runs until the file system is unmounted (dpctl umount MOUNTPOINT, Ctrl-C, or the end of \
            this process). Through MOUNTPOINT any program reads and writes plaintext; in DIRECTORY \
            every new file is a protected file of its directory's default class, and the classes \
            hold at every call: after lock + grace class-A files refuse opens, reads and writes \
            (EACCES) and their cached pages are dropped; class-B files can be created while locked; \
            nothing of class C opens before the first unlock. The extended attribute \
            user.dataprotection.class is a file's class (setting it rewraps the key) and a \
            directory's default. The mount follows the device's lock state through keybagd: when \
            none serves the root, one is started for this mount (it stops when the mount ends), so \
            `dpctl lock` and the desktop's lock reach it; where keybagd cannot be found, classes A, \
            B and C are not served. Needs fuse3 (fusermount3) and /dev/fuse.
            """)

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The directory of protected files to serve.") var directory: String
    @Argument(help: "Where to mount it (an empty directory).") var mountPoint: String
    @OptionGroup var unlock: UnlockOptions

    func validate() throws { try requirePaths(directory, mountPoint) }

    func run() async throws {
        try MountedFileSystem.checkAvailability()   // what is missing, before any passcode is asked
        // No mount outlives a lock with keys in hand: its keys are keybagd's, whose lock every
        // process shares (`dpctl lock`, the desktop's screen lock). Without one, one is started.
        let root = try device.resolvedRoot
        var served = try KeybagdConnection.connect(root: root) != nil
        var started: StartedKeybagd?
        if !served {
            do {
                if let daemon = try StartedKeybagd.start(root: root) {
                    (served, started) = (true, daemon)
                    note(
                        "no keybagd served \(root): started one for this mount (pid \(daemon.process.processIdentifier)); `dpctl lock` locks it,"
                            + " and it stops when the mount ends (with it, for other programs using \(root) meanwhile: run keybagd yourself to share one)"
                    )
                }
            } catch {
                // Another command started one meanwhile (two mounts of one root at once): use it.
                guard try KeybagdConnection.connect(root: root) != nil else { throw error }
                served = true
            }
        }
        defer { started?.stop() }
        // Without keybagd the device's own keybag is never unlocked here: only class D is served.
        let keybag = try await device.openDevice(passcodeFile: served ? unlock.passcodeFile : nil)
        let fileSystem = try ProtectedFileSystem(directory: directory, files: ProtectedFileManager(keybag: keybag))
        let mounted = try fileSystem.mount(at: mountPoint)
        note(
            "serving \(fileSystem.directory) at \(mounted.mountPoint); Ctrl-C or `dpctl umount \(mounted.mountPoint)` ends it"
                + (keybag.daemonSocket == nil
                    ? " (keybagd was not found beside dpctl: classes A, B and C are not served; install keybagd, or start it for \(root))"
                    : ""))
        let signals = TerminationSignals { try? mounted.unmount() }
        defer { signals.cancel() }
        await mounted.serve()
    }
}

/// A keybagd started for one `dpctl mount` (`keybagd --root ROOT --stop-with-process PID`): in a
/// process group of its own (the terminal's Ctrl-C reaches the mount, which stops it), it stops
/// when this process ends, however it ends.
struct StartedKeybagd {
    let process: Process

    /// Stops it and waits until it has (its socket gone): a command run right after the mount
    /// ends never meets a daemon on its way out.
    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    /// keybagd beside this dpctl (installed together, or built together), if it is there.
    static var executable: String? {
        let path = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("keybagd").path
        return FileManager.default.isExecutableFile(atPath: path) ? path : nil
    }

    /// Starts keybagd for `root` and waits until it serves (its `ready SOCKET` line); `nil` when
    /// there is no keybagd beside dpctl.
    static func start(root: String) throws -> StartedKeybagd? {
        guard let executable else { return nil }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = ["--root", root, "--stop-with-process", String(getpid())]
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = FileHandle.nullDevice
        try process.run()
        try? output.fileHandleForWriting.close()
        try? errors.fileHandleForWriting.close()
        let said = Self.forwardWarnings(errors.fileHandleForReading)
        var line = Data()
        while let byte = try output.fileHandleForReading.read(upToCount: 1), !byte.isEmpty, byte != Data("\n".utf8) {
            line += byte
        }
        guard String(decoding: line, as: UTF8.self).hasPrefix("ready ") else {
            process.waitUntilExit()
            let last = said.lines.withLock { $0 }.last.map { $0.hasPrefix("keybagd: ") ? String($0.dropFirst(9)) : $0 }
            let why = last.map { ": " + $0 } ?? " (it exited with status \(process.terminationStatus))"
            throw CLIError(
                "keybagd could not be started for \(root)\(why); start it yourself: keybagd --root \(root) &")
        }
        return StartedKeybagd(process: process)
    }

    /// Passes on what the daemon says on its standard error that matters to the mount's user
    /// (warnings, errors: not its notices about desktop signals it cannot watch), on a thread of
    /// its own until the daemon ends; returns every line, for a daemon that fails to start.
    private static func forwardWarnings(_ handle: FileHandle) -> Said {
        let said = Said()
        let thread = Thread {
            var pending = Data()
            while let chunk = try? handle.read(upToCount: 4096), !chunk.isEmpty {
                pending += chunk
                while let end = pending.firstIndex(of: 0x0A) {
                    let text = String(decoding: pending[pending.startIndex..<end], as: UTF8.self)
                    pending = Data(pending[(end + 1)...])
                    said.lines.withLock { if $0.count < 64 { $0.append(text) } }
                    if !text.contains(" notice ") && !text.contains(" info ") && !text.contains(" debug ") {
                        FileHandle.standardError.write(Data((text + "\n").utf8))
                    }
                }
            }
        }
        thread.start()
        return said
    }

    /// What the daemon said on its standard error (at most 64 lines).
    final class Said: Sendable { let lines = Mutex<[String]>([]) }
}

struct Unmount: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "umount",
        abstract: "Unmount a protected file system.")

    @OptionGroup var device: DeviceOptions
    @Argument(help: "The mount point.") var mountPoint: String

    func run() async throws {
        try MountedFileSystem.unmount(mountPoint)
    }
}
