// Linux declarations that Swift's Glibc module does not export, for DataProtectionSystem alone
// (which wraps each one in Swift, named after its call). One convention: a call returns its
// value (0 when it has none), or -errno; the few that cannot fail say so.
// Keep this header free of feature macros (_GNU_SOURCE): it is imported next to Glibc and
// Dispatch, whose view of the system headers must stay the same.
#ifndef C_LINUX_SHIMS_H
#define C_LINUX_SHIMS_H
#include <sys/xattr.h>
#include <sys/random.h>
#include <stdint.h>

/// `O_TMPFILE` (a macro needing _GNU_SOURCE, which Swift cannot import): an unnamed file in a
/// directory, linked into it later.
int cshim_o_tmpfile(void);

/// `O_PATH` (a macro needing _GNU_SOURCE): a descriptor that holds an inode without opening it.
int cshim_o_path(void);

/// `pipe2(fds, O_CLOEXEC)` (needs _GNU_SOURCE): both ends close-on-exec from the start, so a
/// child another thread spawns meanwhile never inherits one. 0, or -errno.
int cshim_pipe_cloexec(int fds[2]);

/// `accept4(fd, NULL, NULL, SOCK_CLOEXEC)` (needs _GNU_SOURCE): the connection close-on-exec
/// from the start. The descriptor, or -errno.
int cshim_accept_cloexec(int fd);

/// `getsockopt(SO_PEERCRED)` (`struct ucred` needs _GNU_SOURCE): the peer's pid and uid. 0, or -errno.
int cshim_peer_credentials(int fd, int *pid, unsigned *uid);

/// `unshare(CLONE_FS)` then `umask(0)`: the calling thread gets file-system attributes of its
/// own (working directory, root, umask) with no umask, the rest of the process keeping theirs.
/// A file server's threads make items with the mode their callers asked for, which the
/// caller's kernel already masked with the caller's umask. 0, or -errno (the umask then stays
/// the process's).
int cshim_thread_umask_zero(void);

/// `mallopt(M_PERTURB, 0xa5)`: from now on glibc's allocator overwrites every block it frees
/// (and fills every block it hands out), so what a buffer held does not outlive it in freed
/// memory. 1 when set, 0 otherwise (another allocator).
int cshim_clear_freed_memory(void);

/// `prctl(PR_SET_DUMPABLE, 0)` (prctl is variadic): no core dumps, no ptrace by the same user.
/// 0, or -errno.
int cshim_set_nondumpable(void);

/// `mlockall(MCL_CURRENT | MCL_FUTURE [| MCL_ONFAULT])`, only when RLIMIT_MEMLOCK is unlimited
/// (with a limit, future allocations would start failing): 0 locked, 1 skipped, or -errno.
int cshim_lock_memory(void);

/// Sends `length` bytes of `data` (at least 1) and the descriptor `fd` over a Unix socket in
/// one `sendmsg` with an `SCM_RIGHTS` control message (the CMSG_* macros Swift cannot import).
/// Returns the bytes sent, or -errno.
long cshim_send_descriptor(int socket, int fd, const void *data, unsigned long length);

/// Receives up to `length` bytes into `data` and at most one descriptor (`*fd`, -1 if none;
/// `MSG_CMSG_CLOEXEC`). Returns the bytes received (0 at end of stream), or -errno
/// (-EMSGSIZE: the descriptors did not fit, none is kept).
long cshim_receive_descriptor(int socket, void *data, unsigned long length, int *fd);

/// `explicit_bzero`: zeroes `length` bytes at `pointer`, never optimised away.
void cshim_wipe(void *pointer, unsigned long length);

/// Zeroes 64 KiB of this thread's stack below the caller, where a crypto routine that just
/// returned (BoringSSL's HMAC key block, an AES key schedule) may have left secrets.
void cshim_scrub_stack(void);

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0, VERSION)`), or -errno
/// (-ENOSYS: no Landlock; -EOPNOTSUPP: Landlock disabled at boot).
long cshim_landlock_abi(void);

/// `posix_spawn` with the child's descriptors set up exactly: `count` descriptors (`sources[i]` becomes
/// descriptor `i`) and every other descriptor closed. Returns 0 and the pid, or -errno.
int cshim_spawn(const char *path, char *const argv[], char *const envp[], const int *sources, int count, int *pid);

/// ``cshim_spawn`` with the child born in a cgroup: `clone3(CLONE_INTO_CGROUP)` into the cgroup v2
/// directory `cgroup` (a descriptor), so that no process is ever moved there (a move into a cgroup
/// waits for an RCU grace period: milliseconds). Before it runs `path`, the child, then a single
/// thread, also enters each cgroup v1 directory in `legacy` (hybrid systems' `pids` and `memory`
/// hierarchies) by writing `0` to its `tasks`: moving only the calling thread is immediate.
/// `*placed` is 1 when the child runs in every one of them, 0 when one refused it (it then runs
/// in `home`'s `cgroup.procs`, the caller's own cgroup v2; a child that cannot get out again
/// is not run: an error). Where `clone3` fails (no `CLONE_INTO_CGROUP` before Linux 5.7, a
/// system-call filter) the child writes itself into `cgroup`'s `cgroup.procs`, given as `procs`,
/// instead. Returns 0 and the pid, or -errno.
int cshim_spawn_in_cgroup(const char *path, char *const argv[], char *const envp[], const int *sources, int count,
                          int cgroup, const char *procs, const char *home, const char *const legacy[], int legacyCount,
                          int *pid, int *placed);

/// Sets the inotify budget of the user namespace `namespace` (a descriptor of `/proc/PID/ns/user`):
/// a forked child (one thread, as `setns` needs) joins it — its owner has every capability there —
/// and writes `/proc/sys/user/max_inotify_instances` and `max_inotify_watches`. Returns 0, or
/// -errno with `*step` 1 (joining), 2 (instances) or 3 (watches).
int cshim_limit_inotify(int namespace, long instances, long watches, int *step);

/// `openat2(2)` (no libc wrapper): opens `path` relative to `dirfd` with `flags` and `mode`,
/// resolving it under the `RESOLVE_*` rules in `resolve`. Returns the descriptor or -errno.
int cshim_openat2(int dirfd, const char *path, int flags, unsigned mode, unsigned long long resolve);
/// `statx(2)`'s birth time of `path` (relative to `dirfd`, a link not followed; an empty `path`:
/// `dirfd` itself): 0 and the time, 1 when the file system keeps none, or -errno.
int cshim_birth_time(int dirfd, const char *path, long long *seconds, unsigned *nanoseconds);
/// `renameat2(2)` (no libc wrapper on older glibc) with its `flags` (`CSHIM_RENAME_NOREPLACE`,
/// `CSHIM_RENAME_EXCHANGE`). Returns 0 or -errno.
int cshim_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags);
enum { CSHIM_RENAME_NOREPLACE = 1, CSHIM_RENAME_EXCHANGE = 2 };

/// Names an unnamed file (`O_TMPFILE`) open at `fd`: `linkat(fd, "", AT_EMPTY_PATH)` (Linux 6.10
/// lets the process that opened it do so without CAP_DAC_READ_SEARCH), else through its
/// `/proc/self/fd` link (`AT_SYMLINK_FOLLOW`). 0, or -errno.
int cshim_link_unnamed(int fd, int newdirfd, const char *newpath);
/// `copy_file_range(2)` between two offsets (declared only under _GNU_SOURCE): the kernel copies
/// up to `length` bytes from `in_fd` at `in_offset` to `out_fd` at `out_offset` without them passing
/// through this process. Returns the bytes copied (0 at the end of the input), or -errno.
long cshim_copy_file_range(int in_fd, long long in_offset, int out_fd, long long out_offset, unsigned long length);
/// `sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)`: starts writing that range back
/// without waiting (a later `fsync` then waits for less). Returns 0 or -errno.
int cshim_start_writeback(int fd, long long offset, long long length);
/// The `RESOLVE_*` flags.
enum {
    CSHIM_RESOLVE_NO_XDEV = 0x01, CSHIM_RESOLVE_NO_MAGICLINKS = 0x02, CSHIM_RESOLVE_NO_SYMLINKS = 0x04,
    CSHIM_RESOLVE_BENEATH = 0x08, CSHIM_RESOLVE_IN_ROOT = 0x10,
};

/// A 64-bit word another process publishes in shared memory, read with acquire ordering.
static inline uint64_t cshim_load_acquire_u64(const uint64_t *word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

/// Publishes a 64-bit word in shared memory with release ordering.
static inline void cshim_store_release_u64(uint64_t *word, uint64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }
/// `fcntl(F_OFD_SETLK)` of a write lock on the whole file (an open-file-description lock, released
/// when the last descriptor of it closes): 0, or -errno (-EAGAIN: another description holds one).
int cshim_ofd_write_lock(int fd);

/// `ioctl(NS_GET_PARENT)`: a descriptor of the parent of the user namespace `fd` refers to
/// (close-on-exec), or -errno.
int cshim_namespace_parent(int fd);

/// `fstatfs(fd)`'s file system type (`f_type`: `FUSE_SUPER_MAGIC` …), or -errno.
long long cshim_file_system_type(int fd);
/// statfs(2)'s f_type for a path (followed if a link), or -errno.
long long cshim_path_file_system_type(const char *path);

/// `fcntl(F_OFD_GETLK)` for a write lock on the whole file, without taking anything: 1 when another
/// open file description holds a lock on it, 0 when none does, or -errno.
int cshim_ofd_is_locked(int fd);

/// `pidfd_open(pid, 0)`: a descriptor of the process (close-on-exec), or -errno.
int cshim_pidfd_open(int pid);
/// `pidfd_send_signal(fd, 0)`: 0 while the process lives, or -errno (-ESRCH: it has ended).
int cshim_pidfd_alive(int fd);

/// `getdents64(2)`: directory entries from the descriptor's offset. The bytes read, or -errno.
long cshim_getdents64(int fd, void *buffer, unsigned long size);

/// `gettid(2)`: the calling thread's ID (cannot fail).
int cshim_gettid(void);

/// Macros that need _GNU_SOURCE: `AT_EMPTY_PATH`, `UTIME_NOW`, `UTIME_OMIT`, `FALLOC_FL_KEEP_SIZE`.
int cshim_at_empty_path(void);
long cshim_utime_now(void);
long cshim_utime_omit(void);
int cshim_falloc_keep_size(void);

#endif
