#define _GNU_SOURCE
#include <linux/openat2.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>
#include <sys/uio.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include "CLinuxShims.h"

int cshim_o_tmpfile(void) { return O_TMPFILE; }

int cshim_peer_credentials(int fd, int *pid, unsigned *uid) {
    struct ucred cred;
    socklen_t length = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) return -1;
    *pid = cred.pid;
    *uid = cred.uid;
    return 0;
}

int cshim_set_nondumpable(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }

int cshim_lock_memory(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur != RLIM_INFINITY) return 1;
#ifdef MCL_ONFAULT
    if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == 0) return 0;
#endif
    return mlockall(MCL_CURRENT | MCL_FUTURE) == 0 ? 0 : -1;
}

void cshim_wipe(void *pointer, unsigned long length) {
    if (pointer != NULL && length > 0) explicit_bzero(pointer, length);
}

__attribute__((noinline)) void cshim_scrub_stack(void) {
    volatile unsigned char area[64 * 1024];
    explicit_bzero((void *)area, sizeof area);
    __asm__ __volatile__("" : : "r"(area) : "memory");
}

long cshim_send_descriptor(int socket, int fd, const void *data, unsigned long length) {
    struct iovec iov = { .iov_base = (void *)data, .iov_len = length };
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int))]; } control;
    memset(&control, 0, sizeof control);
    struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space };
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(header), &fd, sizeof(int));
    return sendmsg(socket, &message, MSG_NOSIGNAL);
}

long cshim_receive_descriptor(int socket, void *data, unsigned long length, int *fd) {
    *fd = -1;
    struct iovec iov = { .iov_base = data, .iov_len = length };
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int) * 4)]; } control;
    struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space };
    long n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header != NULL; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
            int count = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int *fds = (int *)CMSG_DATA(header);
            for (int i = 0; i < count; i++) {
                if (*fd == -1) *fd = fds[i]; else close(fds[i]);   /* one descriptor a message: extra ones are closed */
            }
        }
    }
    if (message.msg_flags & MSG_CTRUNC) { if (*fd >= 0) close(*fd); *fd = -1; errno = EMSGSIZE; return -1; }
    return n;
}

int cshim_openat2(int dirfd, const char *path, int flags, unsigned mode, unsigned long long resolve) {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (unsigned long long)(unsigned)flags;
    how.mode = mode;
    how.resolve = resolve;
#ifdef SYS_openat2
    long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
#else
    long fd = syscall(437, dirfd, path, &how, sizeof how);
#endif
    return fd < 0 ? -errno : (int)fd;
}

/// `renameat2(2)` with `flags` (no libc wrapper on older glibc): 0 or -errno.
static int rename_with_flags(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags) {
#ifdef SYS_renameat2
    long r = syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
#else
    long r = syscall(316, olddirfd, oldpath, newdirfd, newpath, flags);
#endif
    return r < 0 ? -errno : 0;
}

int cshim_rename_noreplace(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    return rename_with_flags(olddirfd, oldpath, newdirfd, newpath, 1U /* RENAME_NOREPLACE */);
}

long cshim_landlock_abi(void) {
#ifdef SYS_landlock_create_ruleset
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1U);
#else
    long abi = syscall(444, NULL, 0, 1U);
#endif
    return abi < 0 ? -errno : abi;
}

int cshim_spawn(const char *path, char *const argv[], char *const envp[], const int *sources, int count, int *pid) {
    posix_spawn_file_actions_t actions;
    int error = posix_spawn_file_actions_init(&actions);
    if (error) return error;
    // Sources are first moved above every target, so that no dup2 overwrites a later source.
    int base = 1000;
    for (int i = 0; i < count && !error; i++) error = posix_spawn_file_actions_adddup2(&actions, sources[i], base + i);
    for (int i = 0; i < count && !error; i++) error = posix_spawn_file_actions_adddup2(&actions, base + i, i);
    if (!error) error = posix_spawn_file_actions_addclosefrom_np(&actions, count);
    if (error) { posix_spawn_file_actions_destroy(&actions); return error; }
    // The child starts with every signal at its default action and none blocked: a signal this
    // process ignores (dpctl ignores SIGTERM, SIGINT and SIGHUP while it supervises) would
    // otherwise stay ignored through every exec, and a program could not even trap it.
    posix_spawnattr_t attributes;
    error = posix_spawnattr_init(&attributes);
    if (error) { posix_spawn_file_actions_destroy(&actions); return error; }
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&attributes, &all);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    error = posix_spawn(pid, path, &actions, &attributes, argv, envp);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    return error;
}

long cshim_copy_file_range(int in_fd, long long in_offset, int out_fd, long long out_offset, unsigned long length) {
    off64_t in = in_offset, out = out_offset;
    ssize_t n = copy_file_range(in_fd, &in, out_fd, &out, length, 0);
    return n < 0 ? -errno : n;
}

int cshim_start_writeback(int fd, long long offset, long long length) {
    return sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE) < 0 ? -errno : 0;
}

int cshim_birth_time(int dirfd, const char *path, long long *seconds, unsigned *nanoseconds) {
    struct statx sx;
    int flags = AT_SYMLINK_NOFOLLOW | (path[0] == 0 ? AT_EMPTY_PATH : 0);
    if (statx(dirfd, path, flags, STATX_BTIME, &sx) != 0) return -errno;
    if (!(sx.stx_mask & STATX_BTIME)) return 1;
    *seconds = sx.stx_btime.tv_sec;
    *nanoseconds = sx.stx_btime.tv_nsec;
    return 0;
}

int cshim_ofd_write_lock(int fd) {
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    return fcntl(fd, F_OFD_SETLK, &lock) == 0 ? 0 : -errno;
}

int cshim_ofd_is_locked(int fd) {
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_OFD_GETLK, &lock) != 0) return -errno;
    return lock.l_type != F_UNLCK;
}

int cshim_rename_exchange(const char *first, const char *second) {
    return rename_with_flags(AT_FDCWD, first, AT_FDCWD, second, 2U /* RENAME_EXCHANGE */);
}

int cshim_namespace_parent(int fd) {
    int parent = ioctl(fd, 0xb702 /* NS_GET_PARENT */);
    if (parent < 0) return -errno;
    fcntl(parent, F_SETFD, FD_CLOEXEC);
    return parent;
}

long long cshim_file_system_type(int fd) {
    struct statfs st;
    return fstatfs(fd, &st) == 0 ? (long long)st.f_type : -errno;
}

long long cshim_path_file_system_type(const char *path) {
    struct statfs st;
    return statfs(path, &st) == 0 ? (long long)st.f_type : -errno;
}

int cshim_pidfd_open(int pid) {
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
    long fd = syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return -errno;
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    return (int)fd;
}

int cshim_pidfd_alive(int fd) {
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
    return syscall(SYS_pidfd_send_signal, fd, 0, NULL, 0) == 0 ? 0 : -errno;
}
