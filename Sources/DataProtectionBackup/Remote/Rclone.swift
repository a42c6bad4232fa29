import Foundation

/// The `rclone` commands a remote repository runs, each named for what it does. Every call is
/// one `rclone` process; its exit status and last error line become ``BackupError/remoteFailed(_:reason:)``.
struct Rclone: Sendable {
    let location: RemoteLocation
    let executable: String

    /// Flags on every call: no notices on standard error, a few retries, and timeouts so that a
    /// dead server fails the call instead of stalling it.
    static let commonFlags = [
        "-q", "--ask-password=false", "--retries", "3", "--low-level-retries", "3", "--contimeout", "15s", "--timeout",
        "60s",
    ]

    /// rclone's exit status for "directory not found" and "file not found".
    static let directoryNotFound: Int32 = 3
    static let fileNotFound: Int32 = 4

    init(location: RemoteLocation) throws {
        self.location = location
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        // Absolute PATH entries only: never `./rclone` from wherever the command runs.
        guard
            let found = path.split(separator: ":").filter({ $0.hasPrefix("/") }).map({ $0 + "/rclone" })
                .first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else {
            throw BackupError.toolMissing("rclone", package: "rclone")
        }
        executable = found
    }

    struct Failure: Error {
        var status: Int32
        var message: String
    }

    /// Runs `rclone ARGUMENTS` (standard input from `input` when given); its standard output.
    /// A cancelled task stops it (SIGTERM) and gets `CancellationError`.
    /// - Throws: ``Failure`` with the exit status and the last line rclone wrote on standard
    ///   error, the location's connection string and any password in it blotted out.
    @discardableResult
    func run(_ arguments: [String], input: [UInt8]? = nil) async throws -> Data {
        // Output through files: neither stream can fill a pipe and stall rclone.
        let scratch = try Self.privateDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let out = scratch.appendingPathComponent("out"), err = scratch.appendingPathComponent("err")
        let outFD = open(out.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        defer { if outFD >= 0 { close(outFD) } }
        let errFD = open(err.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        defer { if errFD >= 0 { close(errFD) } }
        // The input through a socket pair made close-on-exec at once: no other child started
        // meanwhile inherits its writing end (rclone would then never see the input end).
        var pipeFDs: [Int32] = [-1, -1]
        guard outFD >= 0, errFD >= 0,
            input == nil
                || socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pipeFDs) == 0
        else {
            throw Failure(status: -1, message: "cannot start rclone: \(String(cString: strerror(errno)))")
        }
        let inFD = input == nil ? open("/dev/null", O_RDONLY | O_CLOEXEC) : pipeFDs[0]
        let process: ToolProcess
        do {
            defer { close(inFD) }
            process = try ToolProcess(
                executable, Self.commonFlags + arguments, input: inFD, output: outFD, error: errFD)
        } catch {
            if input != nil { close(pipeFDs[1]) }
            throw Failure(status: -1, message: "cannot start rclone: \(error.localizedDescription)")
        }
        if let input {
            // Written by a thread of its own (a socket buffer may not hold it all); rclone ending
            // before it read its input must not end this process.
            signal(SIGPIPE, SIG_IGN)
            let fd = pipeFDs[1]
            Thread.detachNewThread {
                input.withUnsafeBytes { buffer in
                    var done = 0
                    while done < buffer.count {
                        let n = Glibc.write(fd, buffer.baseAddress! + done, buffer.count - done)
                        if n < 0 && errno == EINTR { continue }
                        if n <= 0 { break }
                        done += n
                    }
                }
                close(fd)
            }
        }
        let ending: ToolProcess.Ending
        do { ending = try await process.wait() } catch is CancellationError {
            throw CancellationError()
        } catch let error as NSError where error.domain == NSPOSIXErrorDomain {
            throw Failure(
                status: -1, message: "cannot wait for rclone: \(String(cString: strerror(Int32(error.code))))")
        }
        guard !ending.signalled, ending.status == 0 else {
            let lines = String(decoding: (try? Data(contentsOf: err)) ?? Data(), as: UTF8.self).split(separator: "\n")
            let last =
                lines.last.map { location.redacted(Self.message($0)) } ?? "rclone ended with status \(ending.status)"
            throw Failure(status: ending.signalled ? -1 : ending.status, message: last)
        }
        return (try? Data(contentsOf: out)) ?? Data()
    }

    /// A new directory only this user can enter, for rclone's output and file lists.
    static func privateDirectory() throws -> URL {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("dp-rclone-\(UUID().uuidString)")
        try FileManager.default.createDirectory(
            at: scratch, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        return scratch
    }

    /// A line of rclone's log without its date and level: "2026/11/26 11:46:04 ERROR : x: why" → "x: why".
    static func message(_ line: Substring) -> String {
        var text = line
        let stamp = text.prefix(20)
        if stamp.count == 20, stamp.dropFirst(4).first == "/", stamp.dropFirst(10).first == " ", stamp.last == " " {
            text = text.dropFirst(20)
        }
        for level in ["ERROR : ", "NOTICE: ", "CRITICAL: "] where text.hasPrefix(level) {
            text = text.dropFirst(level.count)
        }
        if text.hasPrefix(": ") { text = text.dropFirst(2) }
        return String(text)
    }

    /// The regular files under `relative` (recursively; paths relative to it) and their sizes;
    /// empty when the directory does not exist. One streamed listing (`lsf --fast-list`: a
    /// single request where the storage can list recursively), not a JSON document in memory.
    func listFiles(_ relative: String) async throws -> [String: Int64] {
        let output: Data
        do {
            output = try await run([
                "lsf", "-R", "--files-only", "--fast-list", "--format", "sp", "--separator", "\t",
                location.appending(relative),
            ])
        } catch let failure as Failure where failure.status == Self.directoryNotFound {
            return [:]
        }
        var files: [String: Int64] = [:]
        for line in output.split(separator: UInt8(ascii: "\n")) {
            // SIZE<TAB>PATH: the size first, so that a tab in a name cannot shift it.
            guard let tab = line.firstIndex(of: UInt8(ascii: "\t")),
                let size = Int64(String(decoding: line[line.startIndex..<tab], as: UTF8.self))
            else { continue }
            files[String(decoding: line[(tab + 1)...], as: UTF8.self)] = size
        }
        return files
    }

    /// The files right under `relative` with their sizes and times (a few: lock files).
    func listFilesWithTimes(_ relative: String) async throws -> [String: (size: Int64, modified: Date?)] {
        let output: Data
        do { output = try await run(["lsjson", "--files-only", location.appending(relative)]) } catch let failure
            as Failure where failure.status == Self.directoryNotFound
        {
            return [:]
        }
        struct Item: Decodable { var Path: String; var Size: Int64; var ModTime: String? }
        let items = try JSONDecoder().decode([Item].self, from: output)
        let dates = ISO8601DateFormatter()
        dates.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let plain = ISO8601DateFormatter()
        var out: [String: (size: Int64, modified: Date?)] = [:]
        for item in items {
            out[item.Path] = (item.Size, item.ModTime.flatMap { dates.date(from: $0) ?? plain.date(from: $0) })
        }
        return out
    }

    /// The directories right under `relative` (names only); empty when it does not exist.
    func listDirectories(_ relative: String) async throws -> [String] {
        let output: Data
        do { output = try await run(["lsf", "--dirs-only", location.appending(relative)]) } catch let failure as Failure
            where failure.status == Self.directoryNotFound
        {
            return []
        }
        return output.split(separator: UInt8(ascii: "\n")).map { String(decoding: $0, as: UTF8.self) }
            .map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
    }

    /// Uploads `files` (paths relative to the local directory `local`) to `relative`. Only the
    /// directories that hold them are listed (looking each file up on its own, `--no-traverse`,
    /// measured 16 times slower over SFTP for a thousand files). With `sizeOnly`, a file
    /// already there with the same size is not sent again (objects are named by their
    /// content); one of another size (a cut upload) is replaced.
    func upload(_ local: URL, to relative: String, files: [String], sizeOnly: Bool = true) async throws {
        guard !files.isEmpty else { return }
        try await withFileList(files) { list in
            try await run(
                ["copy"] + (sizeOnly ? ["--size-only"] : []) + [
                    "--files-from-raw", list.path, local.path, location.appending(relative),
                ])
        }
    }

    /// Downloads the files of `relative` into the local directory `local` (those of `files` only,
    /// when given; files the remote lacks are skipped).
    func download(_ relative: String, to local: URL, files: [String]? = nil, include: [String] = []) async throws {
        let source = location.appending(relative)
        if let files {
            guard !files.isEmpty else { return }
            try await withFileList(files) { list in
                try await run(["copy", "--no-traverse", "--files-from-raw", list.path, source, local.path])
            }
        } else {
            try await run(["copy", source, local.path] + include.flatMap { ["--include", $0] })
        }
    }

    /// The bytes of the file `relative`.
    func read(_ relative: String) async throws -> Data { try await run(["cat", location.appending(relative)]) }

    /// Writes `bytes` as the file `relative`.
    func write(_ bytes: [UInt8], to relative: String) async throws {
        try await run(["rcat", location.appending(relative)], input: bytes)
    }

    /// Deletes one file (absent is fine).
    func deleteFile(_ relative: String) async throws {
        do { try await run(["deletefile", location.appending(relative)]) } catch let failure as Failure
            where failure.status == Self.fileNotFound || failure.status == Self.directoryNotFound
        {}
    }

    /// Deletes the files of `relative` named in `files`.
    func deleteFiles(in relative: String, _ files: [String]) async throws {
        guard !files.isEmpty else { return }
        try await withFileList(files) { list in
            try await run(["delete", "--files-from-raw", list.path, location.appending(relative)])
        }
    }

    /// Deletes a directory and everything in it (absent is fine).
    func purge(_ relative: String) async throws {
        do { try await run(["purge", location.appending(relative)]) } catch let failure as Failure
            where failure.status == Self.directoryNotFound
        {}
    }

    /// `body` with a file listing `files`, one per line, in a directory only this user can enter.
    @discardableResult
    private func withFileList<T>(_ files: [String], _ body: (URL) async throws -> T) async throws -> T {
        let scratch = try Self.privateDirectory()
        defer { try? FileManager.default.removeItem(at: scratch) }
        let list = scratch.appendingPathComponent("files")
        try Data(files.map { $0 + "\n" }.joined().utf8).write(to: list)
        return try await body(list)
    }
}
