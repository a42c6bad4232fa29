import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// `ROOT/keybagd.lock`: one data root, one keybagd. The daemon serving a root holds a write lock
/// on this file (an open-file-description lock) for its whole life and records in it its pid and
/// the socket it listens on (FORMAT.md §8). Two spellings of the root, or two runtime directories
/// (`XDG_RUNTIME_DIR` set for one process and not for another: ssh, cron, `su`), still meet here,
/// in the root itself: a second daemon refuses to start, and a client that finds no daemon where
/// it looks but a live one here refuses instead of keeping a lock state of its own.
package enum KeybagDaemonLock {
    package static let fileName = "keybagd.lock"

    /// The daemon that holds the lock: its pid and socket path, as it recorded them.
    package struct Holder: Sendable, Equatable {
        package var pid: Int32?
        package var socketPath: String?

        package var described: String {
            "keybagd" + (pid.map { " (pid \($0))" } ?? "") + (socketPath.map { " on \($0)" } ?? "")
        }
    }

    /// Takes the lock for a daemon about to serve `root` on `socketPath` and returns its
    /// descriptor, to be kept open for the daemon's life.
    ///
    /// - Throws: ``KeybagError/daemon(_:)`` naming the daemon that already serves `root`.
    package static func acquire(root: String, socketPath: String) throws -> Int32 {
        let path = root + "/" + fileName
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw KeybagError.io(path: path, reason: String(cString: strerror(errno))) }
        do throws(Errno) { try SystemCall.ofdWriteLock(fd) } catch {
            let holder = read(fd)
            close(fd)
            if error == .resourceTemporarilyUnavailable || error == .permissionDenied {
                throw KeybagError.daemon(
                    "another \(holder.described) already serves \(root): one data root has one keybagd")
            }
            throw KeybagError.io(path: path, reason: error.description)
        }
        let record = Array("\(getpid())\n\(socketPath)\n".utf8)
        guard ftruncate(fd, 0) == 0, pwrite(fd, record, record.count, 0) == record.count else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw KeybagError.io(path: path, reason: reason)
        }
        return fd
    }

    /// The daemon serving `root`, whatever socket it listens on, or `nil` when none holds the lock.
    package static func holder(root: String) -> Holder? {
        let fd = open(root + "/" + fileName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        guard (try? SystemCall.ofdIsLocked(fd)) == true else { return nil }
        return read(fd)
    }

    private static func read(_ fd: Int32) -> Holder {
        var buffer = [UInt8](repeating: 0, count: 4200)
        let count = max(0, pread(fd, &buffer, buffer.count, 0))
        let lines = String(decoding: buffer[0..<count], as: UTF8.self).split(
            separator: "\n", omittingEmptySubsequences: false)
        return Holder(
            pid: lines.first.flatMap { Int32($0) },
            socketPath: lines.count > 1 && !lines[1].isEmpty ? String(lines[1]) : nil)
    }
}
