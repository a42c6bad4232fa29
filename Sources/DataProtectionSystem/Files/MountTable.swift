import Foundation

/// One mount this process sees (a line of `/proc/self/mountinfo`).
package struct MountEntry: Sendable, Equatable {
    /// The mounted file system's directory that appears at ``mountPoint`` (`/` for its root).
    package let root: String
    /// Where it is mounted, unescaped.
    package let mountPoint: String
    /// Its type (`ext4`, `cgroup2`, `fuse.dataprotection` …).
    package let type: String
    /// The file system's own options (the last field: `rw,discard` …).
    package let superOptions: [String]
}

/// The mounts this process sees, from `/proc/self/mountinfo` (read to its end: a /proc file
/// says it is empty, and some readers then read nothing), its octal escapes (`\040` for a space …)
/// undone.
package enum MountTable {
    package static func entries() -> [MountEntry]? {
        guard let bytes = try? POSIXFile.readAll("/proc/self/mountinfo") else { return nil }
        return String(decoding: bytes, as: UTF8.self).split(separator: "\n").compactMap { line in
            // mount ID, parent ID, major:minor, root, mount point, options, optional fields… "-" type source
            // super-options
            // (a field never holds a space: they are escaped).
            let all = line.split(separator: " ")
            guard let separator = all.indices.first(where: { $0 >= 6 && all[$0] == "-" }) else { return nil }
            let fields = all[..<separator], tail = all[(separator + 1)...]
            guard let type = tail.first else { return nil }
            return MountEntry(
                root: unescaped(fields[3]), mountPoint: unescaped(fields[4]), type: String(type),
                superOptions: tail.count > 2 ? tail[tail.endIndex - 1].split(separator: ",").map(String.init) : [])
        }
    }

    /// The mount `path` (absolute) is on: the one whose point is its longest prefix (the last
    /// mounted, of several at one point).
    package static func mount(covering path: String) -> MountEntry? {
        var best: MountEntry?
        for entry in entries() ?? [] {
            let point = entry.mountPoint
            guard point == "/" || path == point || path.hasPrefix(point + "/") else { continue }
            if point.count >= (best?.mountPoint.count ?? -1) { best = entry }
        }
        return best
    }

    /// Whether something is mounted at `path` (`true` when the table cannot be read).
    package static func isMountPoint(_ path: String) -> Bool {
        guard let entries = entries() else { return true }
        return entries.contains { $0.mountPoint == path }
    }

    private static func unescaped(_ field: Substring) -> String {
        guard field.contains("\\") else { return String(field) }
        var bytes: [UInt8] = []
        var utf8 = Array(field.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "\\"), utf8.count >= 3,
                let value = UInt8(String(decoding: utf8.prefix(3), as: UTF8.self), radix: 8)
            {
                bytes.append(value)
                utf8 = utf8.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
