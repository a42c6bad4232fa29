import Crypto
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// One item's lock and change record in a coordination directory (FORMAT.md §10.5):
/// `<dir>/<32 hex of SHA-256(path)>.lock` (held with `flock`: shared to read, exclusive to
/// write) and `<…>.change` (replaced atomically after each coordinated write:
/// `kind`, `origin`, a UUID, `path` and, for a move, the new path, one per line).
///
/// The directory is `.coordination` in the group container that holds the item, or
/// `Library/.coordination` in an app's container (its root is read-only to the app), or — for an
/// item in no container — `.coordination` beside it.
struct CoordinationLock: Sendable {
    enum Change: Equatable {
        case changed, deleted
        case moved(to: URL)
    }

    let item: URL
    let lockPath: String
    private let fd: Int32

    init(item: URL, exclusive: Bool, announcingOnly: Bool = false) throws {
        self.item = item.standardizedFileURL
        lockPath = try Self.path(for: item)
        let directory = URL(fileURLWithPath: lockPath).deletingLastPathComponent().path
        try makeDirectory(directory)
        // A member may have replaced the directory with a link: refused, never followed.
        guard let st = POSIXFile.linkStatus(directory), st.st_mode & S_IFMT == S_IFDIR else {
            throw ContainerError.refusedItem(path: directory, reason: "is not a directory")
        }
        fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard fd >= 0 else {
            throw ContainerError.fileSystem(FileSystemError("open", path: lockPath, errno: Errno(rawValue: errno)))
        }
        if announcingOnly { return }
        while flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0 {
            guard errno == EINTR else {
                close(fd)
                throw ContainerError.fileSystem(FileSystemError("flock", path: lockPath, errno: Errno(rawValue: errno)))
            }
        }
    }

    func release() { close(fd) }

    /// Takes the lock on a thread of its own (a task waiting for another process must not hold
    /// one of the few threads that run tasks).
    static func acquire(item: URL, exclusive: Bool) async throws -> CoordinationLock {
        try await withCheckedThrowingContinuation { continuation in
            let thread = Thread {
                continuation.resume(with: Result { try CoordinationLock(item: item, exclusive: exclusive) })
            }
            thread.name = "coordination lock"
            thread.start()
        }
    }

    /// Records a change for the item's presenters (in every process).
    func announce(_ change: Change, origin: String) {
        var lines = [origin, UUID().uuidString, item.path]   // the UUID: two identical changes are two records
        switch change {
        case .changed: lines.insert("changed", at: 0)
        case .deleted: lines.insert("deleted", at: 0)
        case .moved(let url): lines.insert("moved", at: 0); lines.append(url.standardizedFileURL.path)
        }
        let record = Self.recordPath(lockPath)
        try? POSIXFile.writeAtomically(record, Array((lines.joined(separator: "\n") + "\n").utf8))
        PresenterRegistry.shared.deliverLocally(record)
    }

    static func recordPath(_ lockPath: String) -> String { String(lockPath.dropLast(".lock".count)) + ".change" }

    /// The lock file's path for `item`.
    static func path(for item: URL) throws -> String {
        let standardized = item.standardizedFileURL
        let digest = SHA256.hash(data: Data(standardized.path.utf8)).prefix(16).map { String(format: "%02x", $0) }
            .joined()
        return coordinationDirectory(for: standardized) + "/" + digest + ".lock"
    }

    /// Where `item`'s lock lives (see the type's documentation). The container is found from
    /// what is known — the supervisor's description inside an app, else the path's shape
    /// (`…/Containers/Data/Application/<UUID>/…`, `…/Containers/Shared/AppGroup/<UUID>/…`) —
    /// never from files an app can write (a planted metadata file would misdirect other apps).
    static func coordinationDirectory(for item: URL) -> String {
        let path = item.standardizedFileURL.path
        if let app = CurrentApp.shared {
            if path.hasPrefix(app.url.path + "/") { return app.url.path + "/Library/.coordination" }
            for group in app.groupContainers.values where path.hasPrefix(group.path + "/") {
                return group.path + "/.coordination"
            }
        }
        let parts = item.standardizedFileURL.pathComponents
        var index = parts.count - 1
        while index >= 4 {
            let uuid = parts[index]
            if UUID(uuidString: uuid)?.uuidString == uuid, parts[index - 3] == "Containers" {
                let root = NSString.path(withComponents: Array(parts[...index]))
                if parts[index - 2] == "Data" && parts[index - 1] == "Application" && index < parts.count - 1 {
                    return root + "/Library/.coordination"
                }
                if parts[index - 2] == "Shared" && parts[index - 1] == "AppGroup" && index < parts.count - 1 {
                    return root + "/.coordination"
                }
            }
            index -= 1
        }
        return item.deletingLastPathComponent().path + "/.coordination"
    }
}
