import Foundation

/// The `rclone` commands a remote repository runs, each named for what it does. Every call is
/// one `rclone` process; its exit status and last error line become ``BackupError/remoteFailed(_:reason:)``.
struct Rclone: Sendable {
    let location: RemoteLocation
    let executable: String

    /// Flags on every call: no notices on standard error, a few retries, and timeouts so that a
    /// dead server fails the call instead of stalling it.
    static let commonFlags = ["-q", "--ask-password=false", "--retries", "3", "--low-level-retries", "3", "--contimeout", "15s", "--timeout", "60s"]

    /// rclone's exit status for "directory not found" and "file not found".
    static let directoryNotFound: Int32 = 3
    static let fileNotFound: Int32 = 4

    init(location: RemoteLocation) throws {
        self.location = location
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        // Absolute PATH entries only: never `./rclone` from wherever the command runs.
        guard let found = path.split(separator: ":").filter({ $0.hasPrefix("/") }).map({ $0 + "/rclone" })
            .first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw BackupError.toolMissing("rclone", package: "rclone")
        }
        executable = found
    }

    struct Failure: Error {
        var status: Int32
        var message: String
    }

    /// Runs `rclone ARGUMENTS` (standard input from `input` when given); its standard output.
    /// - Throws: ``Failure`` with the exit status and the last line rclone wrote on standard error.
    @discardableResult
    func run(_ arguments: [String], input: [UInt8]? = nil) throws -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = Self.commonFlags + arguments
        // Output through files: neither stream can fill a pipe and stall rclone.
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("dp-rclone-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: scratch) }
        let out = scratch.appendingPathComponent("out"), err = scratch.appendingPathComponent("err")
        FileManager.default.createFile(atPath: out.path, contents: nil)
        FileManager.default.createFile(atPath: err.path, contents: nil)
        process.standardOutput = try FileHandle(forWritingTo: out)
        process.standardError = try FileHandle(forWritingTo: err)
        let stdin = Pipe()
        process.standardInput = input == nil ? FileHandle.nullDevice : stdin
        try process.run()
        // rclone ending before it read its input must not end this process.
        signal(SIGPIPE, SIG_IGN)
        if let input {
            try stdin.fileHandleForWriting.write(contentsOf: Data(input))
            try stdin.fileHandleForWriting.close()
        }
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            let lines = String(decoding: (try? Data(contentsOf: err)) ?? Data(), as: UTF8.self).split(separator: "\n")
            let last = lines.last.map(Self.message) ?? "rclone ended with status \(process.terminationStatus)"
            throw Failure(status: process.terminationReason == .exit ? process.terminationStatus : -1, message: last)
        }
        return (try? Data(contentsOf: out)) ?? Data()
    }

    /// A line of rclone's log without its date and level: "2026/11/26 11:46:04 ERROR : x: why" → "x: why".
    static func message(_ line: Substring) -> String {
        var text = line
        let stamp = text.prefix(20)
        if stamp.count == 20, stamp.dropFirst(4).first == "/", stamp.dropFirst(10).first == " ", stamp.last == " " { text = text.dropFirst(20) }
        for level in ["ERROR : ", "NOTICE: ", "CRITICAL: "] where text.hasPrefix(level) { text = text.dropFirst(level.count) }
        if text.hasPrefix(": ") { text = text.dropFirst(2) }
        return String(text)
    }

    /// The regular files under `relative` (recursively; paths relative to it) and their sizes;
    /// empty when the directory does not exist.
    func listFiles(_ relative: String) throws -> [String: (size: Int64, modified: Date?)] {
        let output: Data
        do { output = try run(["lsjson", "-R", "--files-only", location.appending(relative)]) } catch let failure as Failure where failure.status == Self.directoryNotFound {
            return [:]
        }
        struct Item: Decodable { var Path: String; var Size: Int64; var ModTime: String? }
        let items = try JSONDecoder().decode([Item].self, from: output)
        let dates = ISO8601DateFormatter()
        dates.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let plain = ISO8601DateFormatter()
        var out: [String: (size: Int64, modified: Date?)] = [:]
        for item in items { out[item.Path] = (item.Size, item.ModTime.flatMap { dates.date(from: $0) ?? plain.date(from: $0) }) }
        return out
    }

    /// The directories right under `relative` (names only); empty when it does not exist.
    func listDirectories(_ relative: String) throws -> [String] {
        let output: Data
        do { output = try run(["lsjson", "--dirs-only", location.appending(relative)]) } catch let failure as Failure where failure.status == Self.directoryNotFound {
            return []
        }
        struct Item: Decodable { var Name: String }
        return try JSONDecoder().decode([Item].self, from: output).map(\.Name)
    }

    /// Uploads the files under the local directory `local` to `relative`, those of `files` only
    /// when given; a file already there with the same size is not sent again (objects are named
    /// by their content), one of another size (a cut upload) is replaced.
    func upload(_ local: URL, to relative: String, files: [String]? = nil, sizeOnly: Bool = true, exclude: [String] = []) throws {
        var arguments = ["copy", local.path, location.appending(relative)] + exclude.flatMap { ["--exclude", $0] }
        if sizeOnly { arguments.insert("--size-only", at: 1) }
        try withFileList(files) { list in try run(arguments + (list.map { ["--files-from-raw", $0.path] } ?? [])) }
    }

    /// Downloads the files of `relative` into the local directory `local` (those of `files` only,
    /// when given; files the remote lacks are skipped).
    func download(_ relative: String, to local: URL, files: [String]? = nil, include: [String] = []) throws {
        try withFileList(files) { list in
            try run(["copy", location.appending(relative), local.path] + include.flatMap { ["--include", $0] }
                    + (list.map { ["--files-from-raw", $0.path] } ?? []))
        }
    }

    /// The bytes of the file `relative`.
    func read(_ relative: String) throws -> Data { try run(["cat", location.appending(relative)]) }

    /// Writes `bytes` as the file `relative`.
    func write(_ bytes: [UInt8], to relative: String) throws { try run(["rcat", location.appending(relative)], input: bytes) }

    /// Deletes one file (absent is fine).
    func deleteFile(_ relative: String) throws {
        do { try run(["deletefile", location.appending(relative)]) } catch let failure as Failure
            where failure.status == Self.fileNotFound || failure.status == Self.directoryNotFound {}
    }

    /// Deletes the files of `relative` named in `files`.
    func deleteFiles(in relative: String, _ files: [String]) throws {
        guard !files.isEmpty else { return }
        try withFileList(files) { list in try run(["delete", location.appending(relative), "--files-from-raw", list!.path]) }
    }

    /// Deletes a directory and everything in it (absent is fine).
    func purge(_ relative: String) throws {
        do { try run(["purge", location.appending(relative)]) } catch let failure as Failure where failure.status == Self.directoryNotFound {}
    }

    private func withFileList<T>(_ files: [String]?, _ body: (URL?) throws -> T) throws -> T {
        guard let files else { return try body(nil) }
        // In a directory only this user can enter.
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("dp-rclone-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(at: scratch) }
        let list = scratch.appendingPathComponent("files")
        try Data(files.map { $0 + "\n" }.joined().utf8).write(to: list)
        return try body(list)
    }
}
