import ArgumentParser
import DataProtectionContainers
import DataProtectionKeybag
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The server of the protected file system that serves a data root's containers to its apps,
/// started by the first `dpctl app run` that needs it (not a command people type): it ends when
/// the last app using it ends.
struct AppServeFileSystem: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve-file-system",
        abstract: "Serve the containers to apps through the protected file system (started by app run).",
        shouldDisplay: false)

    @OptionGroup var device: DeviceOptions
    @OptionGroup var unlock: UnlockOptions
    @Option(help: ArgumentHelp("Seconds to keep serving once no app uses it.", valueName: "seconds")) var linger = 30

    func run() async throws {
        // A session of its own: the terminal's Ctrl-C or hang-up for the app that started it
        // must not end it while other apps use it.
        _ = setsid()
        _ = chdir("/")   // nothing of the terminal that started it stays pinned
        let manager: ContainerManager
        do {
            manager = try await containerManager(device, passcodeFile: unlock.passcodeFile)
        } catch {
            let line = Array("error: \(describe(error))\n".utf8)
            _ = line.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
            throw ExitCode(1)
        }
        // Its standard output gets `ready` (or why not) and is closed; descriptor 1 becomes
        // /dev/null (never a file the server opens later).
        let readiness = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3)
        let null = open("/dev/null", O_WRONLY | O_CLOEXEC)
        if null >= 0 { _ = dup2(null, STDOUT_FILENO); close(null) }
        // DATAPROTECTION_FS_MAX_NODES bounds the inodes served at once (tests; tuning).
        let maxNodes = ProcessInfo.processInfo.environment["DATAPROTECTION_FS_MAX_NODES"].flatMap(Int.init)
        do {
            try await ContainerFileSystem.serve(
                manager, readiness: readiness, linger: .seconds(max(0, linger)), maxNodes: maxNodes)
        } catch { throw ExitCode(1) }
    }
}

/// Starts `dpctl app serve-file-system` for a data root (this executable, in a session of its
/// own, its output a pipe whose read end is returned), unlocked the way this process was: with
/// the same passcode file when this process unlocked a keybag of its own; with none when keybagd
/// serves the root (the server follows the device, and must not unlock it again).
///
/// Without keybagd a server is unlocked as its first app's run was, and the apps it serves share
/// that: on a device with a passcode it ends with its last app rather than carry an unlock to a
/// later run; with keybagd, or without a passcode (nothing to carry), it stays a while for the
/// next app.
func fileSystemLauncher(passcodeFile: String?, keybag: Keybag) async -> ContainerFileSystem.Launcher {
    let passcode: String? =
        keybag.daemonSocket != nil
        ? nil
        : passcodeFile.flatMap { $0 == "-" ? nil : URL(fileURLWithPath: $0).standardizedFileURL.path }
    let passcodeSet = await keybag.status.passcodeSet
    let lingers = keybag.daemonSocket != nil || !passcodeSet
    return { root in
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        process.arguments =
            ["app", "serve-file-system", "--root", root] + (passcode.map { ["--passcode-file", $0] } ?? [])
            + (lingers ? [] : ["--linger", "0"])
        let output = Pipe()
        process.standardOutput = output
        process.standardInput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let fd = dup(output.fileHandleForReading.fileDescriptor)
        try? output.fileHandleForWriting.close()
        return fd
    }
}
