#if canImport(Glibc)
import Glibc
#endif

/// What a process that holds class keys or plaintext does about its memory: nobody else reads
/// it, and it is never written to a core file.
package enum ProcessHygiene {
    /// `prctl(PR_SET_DUMPABLE, 0)` — other processes of the same user can neither `ptrace` it
    /// nor read `/proc/PID/mem` (only a process with `CAP_SYS_PTRACE` can), and no core is
    /// dumped — and a soft `RLIMIT_CORE` of 0 as well (a `core_pattern` pipe would otherwise still get
    /// one where `suid_dumpable` is 2). Dumpability comes back at `execve`: programs this
    /// process starts are their own. Returns whether the process is now non-dumpable.
    @discardableResult
    package static func keepMemoryPrivate() -> Bool {
        // The soft limit only: programs it starts may raise it again (theirs are their own).
        var limit = rlimit()
        if getrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &limit) == 0 {
            limit.rlim_cur = 0
            _ = setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &limit)
        }
        return (try? SystemCall.setNotDumpable()) != nil
    }
}
