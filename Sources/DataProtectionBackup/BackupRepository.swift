import Crypto
import DataProtection
import DataProtectionSystem
import Foundation
import SystemPackage

/// A backup destination directory:
///
///     DEST/objects/ab/abcdef…      stored file contents, named by their SHA-256, shared by backups
///     DEST/backups/ID/             one finished backup: manifest.sqlite, backup-keybag
///     DEST/backups/ID.incomplete/  a backup still being written (or killed half-way)
///
/// Objects are written to a temporary name, flushed and renamed, so an object name always
/// stands for complete content; a backup directory is renamed from `.incomplete` only after its
/// manifest is flushed.
public struct BackupRepository: Sendable {
    public let url: URL
    static let incompleteSuffix = ".incomplete"
    /// In each backup: the SHA-256 of every object it uses, one per line (for `verify`).
    static let objectListName = "objects.list"

    /// Objects the repository holds that are not in this directory: a remote repository's,
    /// whose staging area this is (``RemoteRepository``). They count as present.
    var objectsElsewhere: Set<String> = []

    public init(url: URL) { self.url = url.standardizedFileURL }

    var objects: URL { url.appendingPathComponent("objects") }
    var backups: URL { url.appendingPathComponent("backups") }

    /// The directory of the backup `id` (`REPOSITORY/backups/ID`), finished or not.
    public func backupURL(id: String, incomplete: Bool = false) -> URL {
        backups.appendingPathComponent(incomplete ? id + Self.incompleteSuffix : id)
    }

    /// Refuses a destination that exists and is neither empty nor a repository: a repository is
    /// never made among someone's files (nothing is written then).
    public func requireUsableAsDestination() throws {
        guard let st = POSIXFile.linkStatus(url.path) else { return }
        guard st.st_mode & S_IFMT == S_IFDIR else {
            throw BackupError.badBackup(path: url.path, reason: "not a directory")
        }
        if Self.isRepository(url) { return }
        // Empty, or only a repository's own entries (a first backup killed as it made them).
        let entries = (try? POSIXFile.directoryEntries(url.path)) ?? []
        if !Set(entries).isSubset(of: ["objects", "backups", "lock"]) {
            throw BackupError.notARepository(path: url.path)
        }
    }

    func prepare() throws {
        try requireUsableAsDestination()
        for dir in [url, objects, backups] {
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            // A repository's own directories are real ones: a planted link must not send a
            // backup's writes (or its clean-up) elsewhere.
            guard let st = POSIXFile.linkStatus(dir.path), st.st_mode & S_IFMT == S_IFDIR else {
                throw BackupError.badBackup(path: dir.path, reason: "not a directory (a symbolic link?)")
            }
            // Readable by its owner only, whatever the umask (as restic's): only ciphertext, but
            // object counts, sizes and backup times are nobody else's business. A repository
            // made before is closed the same way at its next write.
            // Not another user's (a repository shared with a group): theirs to close, left as it is.
            if st.st_mode & 0o077 != 0, st.st_uid == geteuid() {
                try POSIXFile.call("chmod", dir.path) { chmod($0, st.st_mode & 0o700) }
            }
        }
    }

    /// Makes `directory` (and what is missing above it) readable by its owner only.
    static func makeOwnerOnlyDirectory(_ directory: URL) throws {
        try FileManager.default.createDirectory(
            at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    /// The repository's writer lock (`DEST/lock`, an exclusive `flock`), held for the whole run.
    /// `@unchecked Sendable`: the one run that holds it releases it, once (a second release does nothing).
    final class WriterLock: @unchecked Sendable {
        private var fd: FileDescriptor?
        init(_ fd: FileDescriptor) { self.fd = fd }
        func release() { try? fd?.close(); fd = nil }
        deinit { release() }
    }

    /// Creates the repository if needed, takes its writer lock (refusing to wait on another
    /// backup into it), then removes what killed runs left in `objects/` (`.tmp-*`, `.sealed-*`):
    /// under the lock no other writer can be using them.
    func lockForWriting() throws -> WriterLock {
        try prepare()
        let lockPath = url.appendingPathComponent("lock").path
        let fd = try POSIXFile.open(lockPath, .readWrite, options: [.create, .noFollow], permissions: .ownerReadWrite)
        guard flock(fd.rawValue, LOCK_EX | LOCK_NB) == 0 else {
            let holder = Self.lockHolder(fd)
            try? fd.close()
            throw BackupError.repositoryBusy(path: url.path, holder: holder)
        }
        // The holder's pid, for the message another backup gets meanwhile (FORMAT §5).
        _ = ftruncate(fd.rawValue, 0)
        _ = "\(getpid())\n".withCString { pwrite(fd.rawValue, $0, strlen($0), 0) }
        let lock = WriterLock(fd)
        for name in (try? POSIXFile.directoryEntries(objects.path)) ?? []
        where name.hasPrefix(".tmp-") || name.hasPrefix(".sealed-") {
            _ = try? POSIXFile.call("unlink", objects.path + "/" + name) { unlink($0) }
        }
        return lock
    }

    /// `pid N (command line)` of the process that wrote its pid into the lock file, if it runs.
    static func lockHolder(_ fd: FileDescriptor) -> String? {
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = pread(fd.rawValue, &buffer, buffer.count, 0)
        guard count > 0,
            let pid = Int32(
                String(decoding: buffer[0..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)),
            pid > 0, kill(pid, 0) == 0 || errno == EPERM
        else { return nil }
        let commandLine = (try? POSIXFile.readAll("/proc/\(pid)/cmdline")).map {
            $0.split(separator: 0, omittingEmptySubsequences: true).prefix(4).map {
                String(decoding: $0, as: UTF8.self)
            }.joined(separator: " ")
        }
        return "pid \(pid)" + (commandLine.flatMap { $0.isEmpty ? nil : " (\(LosslessPath.display($0)))" } ?? "")
    }

    func objectURL(_ sha256: String) -> URL {
        objects.appendingPathComponent(String(sha256.prefix(2))).appendingPathComponent(sha256)
    }

    func hasObject(_ sha256: String) -> Bool {
        objectsElsewhere.contains(sha256) || POSIXFile.linkStatus(objectURL(sha256).path) != nil
    }

    /// Opens an object for reading: a regular file, never a link, a FIFO or a device.
    func openObject(_ sha256: String) throws -> FileDescriptor {
        do { return try POSIXFile.openRegularFile(objectURL(sha256).path) } catch {
            throw BackupError.badBackup(path: objectURL(sha256).path, reason: "the object is not a regular file")
        }
    }

    /// Finished backups, oldest first.
    public func finishedBackups() -> [URL] {
        backupNamesOldestFirst().filter { !$0.hasSuffix(Self.incompleteSuffix) }.map {
            backups.appendingPathComponent($0)
        }
    }

    /// Every backup directory's name, finished or not, oldest first: by the time its ID starts
    /// with, then — for two made in the same second, whose random suffixes say nothing of their
    /// order — by when it was last written (its authentication record is written last).
    func backupNamesOldestFirst() -> [String] {
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: backups.path)) ?? []).filter {
            !$0.hasPrefix(".")
        }
        func key(_ name: String) -> (Date, Double, String) {
            let id = name.hasSuffix(Self.incompleteSuffix) ? String(name.dropLast(Self.incompleteSuffix.count)) : name
            let directory = backups.appendingPathComponent(name)
            let written =
                [BackupAuthentication.fileName, Self.objectListName, ""].lazy
                .compactMap { POSIXFile.linkStatus(directory.appendingPathComponent($0).path) }
                .first.map { Double($0.st_mtim.tv_sec) + Double($0.st_mtim.tv_nsec) / 1e9 } ?? 0
            return (Self.creationDate(ofID: id) ?? .distantPast, written, name)
        }
        return names.map { ($0, key($0)) }.sorted { $0.1 < $1.1 }.map(\.0)
    }

    /// Copies `source` into the object store while hashing it; returns its SHA-256 and size.
    /// Nothing is copied when an object with that hash already exists.
    func store(_ source: String, requireProtected: Bool = false) throws -> (sha256: String, size: Int64) {
        // Never a link, a FIFO or a device, whatever the walk saw there earlier.
        let input = try POSIXFile.openRegularFile(source)
        defer { try? input.close() }
        if requireProtected { try Self.requireProtectedFile(input, source) }
        let temp = objects.appendingPathComponent(".tmp-\(UUID().uuidString)")
        let output = try POSIXFile.open(
            temp.path, .writeOnly, options: [.create, .exclusiveCreate], permissions: .ownerReadWrite)
        let sha: String, size: Int64
        do {
            (sha, size) = try Self.copyHashing(from: input, LosslessPath.display(source), to: output, temp.path)
            try output.close()
        } catch {
            try? output.close()
            unlink(temp.path)
            throw error
        }
        let final = objectURL(sha)
        if FileManager.default.fileExists(atPath: final.path) {
            unlink(temp.path)
        } else {
            try Self.makeOwnerOnlyDirectory(final.deletingLastPathComponent())
            try POSIXFile.check("rename", final.path) { rename(temp.path, final.path) }
        }
        return (sha, size)
    }

    /// Stored as it is only while it is still a protected file: one replaced by a plain file since
    /// it was looked at is "changed during the backup" (never its plaintext stored raw).
    static func requireProtectedFile(_ fd: FileDescriptor, _ path: String) throws {
        let prefix = try POSIXFile.read(fd, count: ProtectedFileHeader.size, at: 0, path: path)
        guard ProtectedFileHeader.looksProtected(prefix) else {
            throw FileSystemError("open", path: path, errno: .invalidArgument)
        }
    }

    /// Seals a plain file into a class-B protected object of `files`' device (possible while
    /// locked), then stores it; returns the object's SHA-256 and the plain size.
    func storeSealed(_ source: String, files: ProtectedFileManager) async throws -> (sha256: String, size: Int64) {
        let sealed = objects.appendingPathComponent(".sealed-\(UUID().uuidString)")
        let input = try POSIXFile.openRegularFile(source)
        defer { try? input.close() }
        try await files.write(contentsOf: input, to: sealed, protection: .completeUnlessOpen, thisDeviceOnly: false)
        defer { unlink(sealed.path) }
        try POSIXFile.call("chmod", sealed.path) { chmod($0, 0o600) }
        let size = try ItemInspector.plaintextSize(ofItemAt: sealed)
        // The sealed file is already in the repository: hash it and move it into place.
        let sha = try hash(of: sealed)
        let final = objectURL(sha)
        if !FileManager.default.fileExists(atPath: final.path) {
            try Self.makeOwnerOnlyDirectory(final.deletingLastPathComponent())
            try POSIXFile.check("rename", final.path) { rename(sealed.path, final.path) }
        }
        return (sha, size)
    }

    /// Copies `input` to `output` (flushed), hashing on the way: the SHA-256 (hex) and the size.
    static func copyHashing(
        from input: FileDescriptor, _ inputPath: String,
        to output: FileDescriptor, _ outputPath: String, limit: Int64? = nil
    ) throws -> (sha256: String, size: Int64) {
        var hasher = SHA256()
        var size: Int64 = 0
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            // A cancelled task (Ctrl-C) stops a long copy between two MiB; the caller removes the copy.
            if Task.isCancelled { throw CancellationError() }
            let n = try POSIXFile.system("read", inputPath) {
                try buffer.withUnsafeMutableBytes { try input.read(into: $0, retryOnInterrupt: true) }
            }
            if n == 0 { break }
            if let limit, size + Int64(n) > limit {
                throw BackupError.badBackup(path: inputPath, reason: "larger than the manifest allows (\(limit) bytes)")
            }
            try buffer.withUnsafeBytes { raw in
                let chunk = UnsafeRawBufferPointer(rebasing: raw[0..<n])
                hasher.update(bufferPointer: chunk)
                try POSIXFile.write(output, chunk, at: size, path: outputPath)
            }
            size += Int64(n)
        }
        try POSIXFile.sync(output, path: outputPath)
        return (Array(hasher.finalize()).hex, size)
    }

    /// The SHA-256 of an object's current bytes.
    func hashOfObject(_ sha256: String) throws -> String { try hash(of: objectURL(sha256)) }

    /// The SHA-256 of a file's bytes, in hex.
    func hash(of url: URL) throws -> String {
        let fd = try POSIXFile.openRegularFile(url.path)
        defer { try? fd.close() }
        var hasher = SHA256()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = try POSIXFile.system("read", url.path) {
                try buffer.withUnsafeMutableBytes { try fd.read(into: $0, retryOnInterrupt: true) }
            }
            if n == 0 { break }
            buffer.withUnsafeBytes { hasher.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        return Array(hasher.finalize()).hex
    }
}
