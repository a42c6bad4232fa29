import Foundation

/// A remote repository's mirror for one run (`…/mirrors/UUID`): what reading fetches, never
/// shared with another process nor left to the next run. The run holds an `flock` on its
/// `.lock` while it lives; the directory goes when the run is done with it, and one whose lock
/// nobody holds (a killed run's) is removed by the next run that makes its own.
final class MirrorDirectory: Sendable {
    let url: URL
    private let lockDescriptor: Int32

    init(in parent: URL) throws {
        try FileManager.default.createDirectory(
            at: parent, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        Self.removeAbandoned(in: parent)
        // Made under a dot name, locked, then renamed into view: a sweeping run never sees it unlocked.
        let name = UUID().uuidString.lowercased()
        let hidden = parent.appendingPathComponent("." + name)
        try FileManager.default.createDirectory(
            at: hidden, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let fd = open(hidden.appendingPathComponent(".lock").path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        url = parent.appendingPathComponent(name)
        guard fd >= 0, flock(fd, LOCK_EX | LOCK_NB) == 0, rename(hidden.path, url.path) == 0 else {
            let error = errno
            if fd >= 0 { close(fd) }
            try? FileManager.default.removeItem(at: hidden)
            throw BackupError.remoteFailed(
                parent.path, reason: "cannot make a mirror directory: \(String(cString: strerror(error)))")
        }
        lockDescriptor = fd
    }

    deinit {
        remove()
        close(lockDescriptor)
    }

    /// Removes the directory and all it holds (the lock stays held until the value goes).
    func remove() {
        try? FileManager.default.removeItem(at: url)
    }

    /// Removes the mirrors of runs that are gone: those whose lock can be taken.
    static func removeAbandoned(in parent: URL) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: parent.path)) ?? [] where !name.hasPrefix(".")
        {
            let directory = parent.appendingPathComponent(name)
            let fd = open(directory.appendingPathComponent(".lock").path, O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            guard fd >= 0 else {
                // A directory without its lock file is no run's: a run's is locked before it is seen.
                if errno == ENOENT { try? FileManager.default.removeItem(at: directory) }
                continue
            }
            defer { close(fd) }
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { try? FileManager.default.removeItem(at: directory) }
        }
    }
}
