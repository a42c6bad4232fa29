import DataProtection
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import Logging
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// The watcher: inotify on the plist's directory, asking the worker to read the file back whenever
/// another process replaces, writes or removes it.
extension PreferencesStore {
    /// Asks the worker to read the file back whenever it is replaced, written or removed.
    func watch() {
        guard let url else { return }
        let fd = inotify_init1(Int32(IN_CLOEXEC))
        guard fd >= 0 else { return }
        defer { close(fd) }
        let directory = url.deletingLastPathComponent().path
        guard inotify_add_watch(fd, directory, UInt32(IN_MOVED_TO | IN_CLOSE_WRITE | IN_DELETE | IN_CREATE)) >= 0 else {
            return
        }
        let name = url.lastPathComponent
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            var fds = [
                pollfd(fd: fd, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wake[0], events: Int16(POLLIN), revents: 0),
            ]
            if poll(&fds, 2, -1) < 0 { if errno == EINTR { continue } else { return } }
            if fds[1].revents != 0 { return }
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { if n < 0 && errno == EINTR { continue } else { return } }
            if inotifyEvents(buffer, count: n).contains(where: { $0.name == name }) {
                // The file as this process last read or wrote it (its own write's events): no
                // round needed, there is nothing new to read.
                let now = FileIdentity(path)
                condition.lock()
                if now == nil || now != knownFile?.identity || busy { requested += 1; condition.broadcast() }
                condition.unlock()
            }
            // A quiet moment before waiting again: the events meanwhile (a write is five or six
            // of them) queue up without waking this thread, so writers (this process and others)
            // pay for no wake-up each, and a burst is read at once.
            var quiet = pollfd(fd: wake[0], events: Int16(POLLIN), revents: 0)
            if poll(&quiet, 1, Self.watcherQuietMilliseconds) > 0 { return }
        }
    }

    /// How long the watcher lets events queue up after reading some (``watch()``).
    static let watcherQuietMilliseconds: Int32 = 5
}
