import CLinuxShims
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Processes, threads and namespaces.
extension SystemCall {
    /// `posix_spawn` with the child's descriptors exactly `descriptors` (the `i`th becomes
    /// descriptor `i`, every other one closed) and every signal at its default: the child's pid.
    package static func spawn(
        _ path: UnsafePointer<CChar>, _ argv: UnsafePointer<UnsafeMutablePointer<CChar>?>,
        _ envp: UnsafePointer<UnsafeMutablePointer<CChar>?>, descriptors: [Int32]
    ) throws(Errno) -> pid_t {
        var pid: Int32 = 0
        _ = try checked(
            descriptors.withUnsafeBufferPointer { cshim_spawn(path, argv, envp, $0.baseAddress, Int32($0.count), &pid) }
        )
        return pid
    }

    /// Where a child is born (``spawn(_:_:_:descriptors:in:)``): a cgroup v2 directory (its
    /// descriptor, and its `cgroup.procs` for kernels without `CLONE_INTO_CGROUP`), the caller's
    /// own cgroup to fall back to, and cgroup v1 directories to enter as well.
    package struct Birthplace {
        package let directory: Int32
        package let procs: String
        package let home: String
        package let legacy: [String]
        package init(directory: Int32, procs: String, home: String, legacy: [String]) {
            (self.directory, self.procs, self.home, self.legacy) = (directory, procs, home, legacy)
        }
    }

    /// ``spawn(_:_:_:descriptors:)`` with the child born in `birthplace`'s cgroup
    /// (`clone3(CLONE_INTO_CGROUP)`): its pid, and whether it runs in every cgroup asked.
    package static func spawn(
        _ path: UnsafePointer<CChar>, _ argv: UnsafePointer<UnsafeMutablePointer<CChar>?>,
        _ envp: UnsafePointer<UnsafeMutablePointer<CChar>?>, descriptors: [Int32],
        in birthplace: Birthplace
    ) throws(Errno) -> (pid: pid_t, placed: Bool) {
        var pid: Int32 = 0, placed: Int32 = 0
        let legacy = birthplace.legacy.map { strdup($0) }
        defer { legacy.forEach { free($0) } }
        let result = descriptors.withUnsafeBufferPointer { fds in
            legacy.map { UnsafePointer($0) }.withUnsafeBufferPointer { dirs in
                cshim_spawn_in_cgroup(
                    path, argv, envp, fds.baseAddress, Int32(fds.count), birthplace.directory, birthplace.procs,
                    birthplace.home, dirs.baseAddress, Int32(dirs.count), &pid, &placed)
            }
        }
        _ = try checked(result)
        return (pid, placed != 0)
    }

    /// `pidfd_open(pid, 0)`: a descriptor of the process (close-on-exec).
    package static func pidfdOpen(_ pid: pid_t) throws(Errno) -> Int32 { try checked(cshim_pidfd_open(pid)) }

    /// `pidfd_send_signal(fd, 0)`: whether the process still runs (`ESRCH`: it has ended).
    package static func pidfdIsRunning(_ fd: Int32) -> Bool { cshim_pidfd_alive(fd) == 0 }

    /// `gettid(2)`: the calling thread's ID.
    package static func gettid() -> pid_t { cshim_gettid() }

    /// `ioctl(NS_GET_PARENT)`: a descriptor (close-on-exec) of the parent of the user namespace
    /// `fd` refers to.
    package static func namespaceParent(_ fd: Int32) throws(Errno) -> Int32 { try checked(cshim_namespace_parent(fd)) }

    /// Why ``limitInotify(_:instances:watches:)`` failed: the errno, and the step (1 joining the
    /// namespace, 2 the instances, 3 the watches; 0 starting or ending the helper).
    package struct InotifyLimitError: Error {
        package let errno: Errno
        package let step: Int32
    }

    /// Sets the inotify budget of the user namespace `namespace` (a descriptor of
    /// `/proc/PID/ns/user`) from a helper that joins it (`setns`, then
    /// `/proc/sys/user/max_inotify_*`).
    package static func limitInotify(_ namespace: Int32, instances: Int, watches: Int) throws(InotifyLimitError) {
        var step: Int32 = 0
        let result = cshim_limit_inotify(namespace, instances, watches, &step)
        if result < 0 { throw InotifyLimitError(errno: Errno(rawValue: -result), step: step) }
    }

    /// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the kernel's Landlock
    /// ABI version (`ENOSYS`: no Landlock; `EOPNOTSUPP`: disabled at boot).
    package static func landlockABI() throws(Errno) -> Int { try checked(cshim_landlock_abi()) }

    /// `unshare(CLONE_FS)` then `umask(0)`: the calling thread gets file-system attributes of its
    /// own, without a umask (a file server's thread makes items with the modes its callers'
    /// kernels already masked).
    package static func unshareFileSystemAttributesWithoutUmask() throws(Errno) {
        _ = try checked(cshim_thread_umask_zero())
    }

    /// `prctl(PR_SET_DUMPABLE, 0)`: no core dumps, no `ptrace` by the same user.
    package static func setNotDumpable() throws(Errno) { _ = try checked(cshim_set_nondumpable()) }

    /// `mlockall(MCL_CURRENT | MCL_FUTURE [| MCL_ONFAULT])` where `RLIMIT_MEMLOCK` is unlimited:
    /// `true` when locked, `false` when skipped (a limit would make later allocations fail).
    package static func lockAllMemory() throws(Errno) -> Bool { try checked(cshim_lock_memory()) == 0 }

    /// `mallopt(M_PERTURB)`: glibc overwrites every block it frees from now on. `false` under
    /// another allocator.
    @discardableResult
    package static func overwriteFreedMemory() -> Bool { cshim_clear_freed_memory() == 1 }
}
