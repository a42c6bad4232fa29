import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What one run of an app may take of what the user's other apps also need (FORMAT.md §10.2):
/// processes and threads, memory, inotify instances and watches. iOS gives each app such
/// budgets (jetsam's memory limit, process and descriptor limits); here the kernel enforces
/// them where it gives a mechanism:
///
/// - **tasks** (`TasksMax`, as systemd names it): `RLIMIT_NPROC` inside the sandbox's own user
///   namespace, where the kernel counts only the app's processes; for root, whom the kernel
///   exempts from it, the app's `pids` cgroup.
/// - **memory** (`MemoryMax`): the app's `memory` cgroup, where this user may make one (root,
///   or a delegated subtree such as `systemd-run --user --scope -p Delegate=yes`). Elsewhere it
///   is not limited, and ``RunningApp/limitsInForce`` says so.
/// - **inotify**: the sandbox's user namespace's own budget, a quarter of the user's.
///
/// ```swift
/// let limits = AppResourceLimits(metadata: app.metadata)   // the app's, or the defaults
/// ```
public struct AppResourceLimits: Sendable, Equatable {
    /// Processes and threads the app may have at once.
    public var tasks: Int
    /// Bytes of memory the app may use (resident and page cache, as the cgroup counts them).
    public var memoryBytes: Int64
    /// inotify instances and watches the app may hold at once.
    public var inotifyInstances: Int
    public var inotifyWatches: Int

    /// Processes and threads, unless the app was installed with its own figure.
    public static let defaultTasks = 1024
    /// Memory: half of the machine's, unless the app was installed with its own figure.
    public static var defaultMemoryBytes: Int64 { max(256 << 20, Int64(ProcessInfo.processInfo.physicalMemory / 2)) }

    /// The limits of an app: those chosen at install (``ContainerMetadata/tasksMax``,
    /// ``ContainerMetadata/memoryMax``), else the defaults; the inotify budget from this
    /// machine's settings.
    public init(metadata: ContainerMetadata) {
        tasks = metadata.tasksMax ?? Self.defaultTasks
        memoryBytes = metadata.memoryMax ?? Self.defaultMemoryBytes
        let (instances, watches) = Self.userInotifyLimits()
        inotifyInstances = max(8, instances / 4)
        inotifyWatches = max(1024, watches / 4)
    }

    /// The smallest and largest figures an app may be installed with.
    public static let tasksRange = 16...1_048_576
    public static let memoryRange: ClosedRange<Int64> = (16 << 20)...(1 << 50)

    /// The user's own inotify limits (`/proc/sys/fs/inotify/max_user_instances`, `…watches`).
    static func userInotifyLimits() -> (instances: Int, watches: Int) {
        func read(_ name: String, _ fallback: Int) -> Int {
            (try? String(contentsOfFile: "/proc/sys/fs/inotify/" + name, encoding: .utf8))
                .flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? fallback
        }
        return (read("max_user_instances", 128), read("max_user_watches", 8192))
    }

    /// A size as people write it for systemd's `MemoryMax=`: bytes, or with `K`, `M`, `G`, `T`
    /// (powers of 1024; an optional `i` and `B`: `512M`, `2GiB`). `nil` when it is not one.
    public static func parseSize(_ text: String) -> Int64? {
        var digits = text.trimmingCharacters(in: .whitespaces)
        for suffix in ["iB", "B", "i"]
        where digits.count > suffix.count && digits.hasSuffix(suffix) && !digits.dropLast(suffix.count).last!.isNumber {
            digits.removeLast(suffix.count)
            break
        }
        var shift: Int64 = 0
        if let last = digits.last, !last.isNumber {
            guard let index = ["K", "M", "G", "T"].firstIndex(of: last.uppercased()) else { return nil }
            shift = Int64(10 * (index + 1))
            digits.removeLast()
        }
        guard !digits.isEmpty, digits.allSatisfy(\.isNumber), let value = Int64(digits), value <= Int64.max >> shift
        else { return nil }
        return value << shift
    }

    /// `bytes` as a person reads it: `512 MiB`, `11.8 GiB`.
    public static func describe(bytes: Int64) -> String {
        let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
        var value = Double(bytes), unit = 0
        while value >= 1024, unit < units.count - 1 { value /= 1024; unit += 1 }
        if unit == 0 { return "\(bytes) bytes" }
        return value == value.rounded()
            ? String(format: "%.0f %@", value, units[unit]) : String(format: "%.1f %@", value, units[unit])
    }
}
