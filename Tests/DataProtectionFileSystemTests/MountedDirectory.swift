import DataProtectionTestSupport
import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A real `dpctl mount` of a test's directory, ended with `dpctl umount`.
final class MountedDirectory: @unchecked Sendable {
    let cli: CLI
    /// The directory served (the protected files on disk) and where it is mounted.
    let data: String, mountPoint: String
    let process = Process()
    let environment: [String: String]
    private let errors: PipeReader

    static var canMount: Bool { access("/dev/fuse", R_OK | W_OK) == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/fusermount3") }

    /// - Parameter serverUmask: the umask `dpctl mount` runs with (octal, e.g. "077"); the test
    ///   process's when `nil`.
    init(cli: CLI, passcodeFile: String? = nil, environment: [String: String] = [:], data: String? = nil, serverUmask: String? = nil) throws {
        self.cli = cli
        self.data = data ?? cli.file("data")
        self.mountPoint = cli.file("mnt")
        self.environment = environment
        try FileManager.default.createDirectory(atPath: self.data, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let arguments = ["--root", cli.root, "mount", self.data, mountPoint] + (passcodeFile.map { ["--passcode-file", $0] } ?? [])
        if let serverUmask {
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", "umask \(serverUmask) && exec \"$0\" \"$@\"", CLI.executable.path] + arguments
        } else {
            process.executableURL = CLI.executable
            process.arguments = arguments
        }
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let errorPipe = Pipe()
        process.standardError = errorPipe
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        // dpctl says "serving …" once the file system is mounted (requests wait for its threads);
        // before it, perhaps that it started a keybagd for the root.
        let said = try readUntilMountServes(errorPipe.fileHandleForReading.fileDescriptor)
        errors = PipeReader(errorPipe.fileHandleForReading)
        guard said.last?.hasPrefix("dpctl: serving ") == true else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw TestFailure("dpctl mount: \(said.joined(separator: "\n")) \(String(decoding: errors.result(), as: UTF8.self))")
        }
    }

    /// `sh -c SCRIPT` in the mount point.
    func shell(_ script: String) throws -> ChildProcess {
        try ChildProcess.run("/bin/sh", ["-c", "cd '\(mountPoint)' && " + script], environment: environment)
    }

    /// Unmounts and waits for `dpctl mount` to end; returns its standard error.
    @discardableResult
    func unmount() throws -> String {
        if process.isRunning {
            let result = try cli.run(["umount", mountPoint], environment: environment)
            if result.status != 0 { throw TestFailure("umount: \(result.stderr)") }
            process.waitUntilExit()
        }
        return String(decoding: errors.result(), as: UTF8.self)
    }

    deinit {
        if process.isRunning {
            _ = try? cli.run(["umount", mountPoint], environment: environment)
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// Every regular file below `directory`, recursively (links not followed).
    static func regularFiles(below directory: String) -> [String] {
        guard let walker = FileManager.default.enumerator(atPath: directory) else { return [] }
        var found: [String] = []
        while let relative = walker.nextObject() as? String {
            let path = directory + "/" + relative
            var st = stat()
            if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFREG { found.append(path) }
        }
        return found
    }

    /// Whether the file at `path` starts with the protected format's signature.
    static func isProtected(_ path: String) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path), let prefix = try? handle.read(upToCount: 4) else { return false }
        return prefix == Data([0x89, 0x44, 0x50, 0x46])
    }

    /// The files below `directory` whose bytes contain `marker`.
    static func files(below directory: String, containing marker: String) -> [String] {
        regularFiles(below: directory).filter { path in
            guard let bytes = FileManager.default.contents(atPath: path) else { return false }
            return bytes.range(of: Data(marker.utf8)) != nil
        }
    }
}
