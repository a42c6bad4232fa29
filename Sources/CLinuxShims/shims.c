#define _GNU_SOURCE
#include <linux/openat2.h>
#include <errno.h>
#include <stdio.h>
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
#include <sys/wait.h>
#include <pthread.h>
#include <sched.h>
#include <malloc.h>
#include <sys/resource.h>
#include <linux/falloc.h>

// What clone3 takes (linux/sched.h has it only from Linux 5.7's headers; the layout is the
// kernel's ABI, extended only at its end), and the numbers older headers lack.
struct dp_clone_args {
    unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#include "CLinuxShims.h"

int cshim_o_tmpfile(void) { return O_TMPFILE; }

int cshim_o_path(void) { return O_PATH; }

int cshim_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC) == 0 ? 0 : -errno; }

int cshim_accept_cloexec(int fd) {
    int client = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    return client < 0 ? -errno : client;
}

int cshim_peer_credentials(int fd, int *pid, unsigned *uid) {
    struct ucred cred;
    socklen_t length = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) return -errno;
    *pid = cred.pid;
    *uid = cred.uid;
    return 0;
}

int cshim_thread_umask_zero(void) {
    if (unshare(CLONE_FS) != 0) return -errno;
    umask(0);
    return 0;
}

int cshim_clear_freed_memory(void) { return mallopt(M_PERTURB, 0xa5); }

int cshim_set_nondumpable(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 ? 0 : -errno; }

int cshim_lock_memory(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur != RLIM_INFINITY) return 1;
#ifdef MCL_ONFAULT
    if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == 0) return 0;
#endif
    return mlockall(MCL_CURRENT | MCL_FUTURE) == 0 ? 0 : -errno;
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
    long n = sendmsg(socket, &message, MSG_NOSIGNAL);
    return n < 0 ? -errno : n;
}

long cshim_receive_descriptor(int socket, void *data, unsigned long length, int *fd) {
    *fd = -1;
    struct iovec iov = { .iov_base = data, .iov_len = length };
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int) * 4)]; } control;
    struct msghdr message = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space };
    long n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (n < 0) return -errno;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header != NULL; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
            int count = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int *fds = (int *)CMSG_DATA(header);
            for (int i = 0; i < count; i++) {
                if (*fd == -1) *fd = fds[i]; else close(fds[i]);   /* one descriptor a message: extra ones are closed */
            }
        }
    }
    if (message.msg_flags & MSG_CTRUNC) { if (*fd >= 0) close(*fd); *fd = -1; return -EMSGSIZE; }
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
int cshim_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags) {
#ifdef SYS_renameat2
    long r = syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
#else
    long r = syscall(316, olddirfd, oldpath, newdirfd, newpath, flags);
#endif
    return r < 0 ? -errno : 0;
}

long cshim_landlock_abi(void) {
#ifdef SYS_landlock_create_ruleset
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1U);
#else
    long abi = syscall(444, NULL, 0, 1U);
#endif
    return abi < 0 ? -errno : abi;
}

static int spawn_with(const char *path, char *const argv[], char *const envp[], const int *sources, int count, int *pid) {
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

/// Writes `text` to `file` (a cgroup control file); 0 or -1. Only async-signal-safe calls.
static int write_control(const char *file, const char *text) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t length = (ssize_t)strlen(text);
    ssize_t n = write(fd, text, (size_t)length);
    close(fd);
    return n == length ? 0 : -1;
}

/// What ``cshim_spawn_in_cgroup`` asks of its child, and what the child answers: the child shares
/// this memory (`CLONE_VM`) while its parent waits (`CLONE_VFORK`), as `posix_spawn`'s does.
struct spawn_request {
    const char *path; char *const *argv; char *const *envp; const int *sources; int count;
    const char *enter;                          // cgroup.procs to write itself into (no CLONE_INTO_CGROUP)
    const char *home;                           // the caller's cgroup.procs, to go back to
    const char *const *legacy; int legacyCount; // v1 cgroup directories to enter
    int placed, error;                          // answers
};

/// Writes "0" to `directory`/`file` (a cgroup's control file): the calling thread or process moves
/// there. 0 or -1.
static int enter_cgroup(const char *directory, size_t length, const char *file) {
    char path[4096];
    size_t name = strlen(file);
    if (length + 1 + name + 1 > sizeof path) return -1;
    memcpy(path, directory, length);
    path[length] = '/';
    memcpy(path + length + 1, file, name + 1);
    return write_control(path, "0");
}

/// The child's side of ``cshim_spawn_in_cgroup``, from `clone` to `execve`: a process of its own
/// on its own stack, every signal blocked. Only async-signal-safe calls; it writes no memory of
/// the parent's but the request's answers.
static int spawn_child(void *argument) {
    struct spawn_request *request = argument;
    int count = request->count, outside = 0, entered = 0;
    if (request->enter) {
        if (write_control(request->enter, "0") != 0) outside = 1; else entered = 1;
    }
    // A v1 cgroup is entered by moving this thread (`tasks`): immediate, where moving a process
    // (`cgroup.procs`) waits for an RCU grace period. This process has one thread.
    for (int i = 0; i < request->legacyCount && !outside; i++) {
        if (enter_cgroup(request->legacy[i], strlen(request->legacy[i]), "tasks") != 0) outside = 1;
    }
    if (outside) {
        // Not held to every limit: the app runs outside its cgroups altogether (as the caller
        // does with an app it could not place), and says so. Where it cannot get out again, it
        // does not run at all: its state would be neither.
        int born_inside = !request->enter;   // CLONE_INTO_CGROUP
        if ((born_inside || entered) && write_control(request->home, "0") != 0) goto failed;
        for (int i = 0; i < request->legacyCount; i++) {
            const char *slash = strrchr(request->legacy[i], '/');
            if (!slash || enter_cgroup(request->legacy[i], (size_t)(slash - request->legacy[i]), "tasks") != 0) goto failed;
        }
    }
    request->placed = !outside;
    // Sources are first copied above every target (never onto one), then put in place; every
    // other descriptor is closed at the exec.
    int moved[256];
    for (int i = 0; i < count; i++) {
        moved[i] = fcntl(request->sources[i], F_DUPFD_CLOEXEC, count);
        if (moved[i] < 0) goto failed;
    }
    for (int i = 0; i < count; i++) if (dup2(moved[i], i) < 0) goto failed;
    if (syscall(SYS_close_range, (unsigned)count, ~0U, 4U /* CLOSE_RANGE_CLOEXEC, Linux 5.11 */) != 0 &&
        syscall(SYS_close_range, (unsigned)count, ~0U, 0U /* Linux 5.9 */) != 0) {
        struct rlimit limit;
        long last = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_max != RLIM_INFINITY ? (long)limit.rlim_max : 1L << 20;
        for (long fd = count; fd < last; fd++) close((int)fd);
    }
    // Every signal at its default action and none blocked: a signal the supervisor ignores
    // would otherwise stay ignored through every exec, and a program could not even trap it.
    struct sigaction standard = {.sa_handler = SIG_DFL};
    for (int sig = 1; sig < NSIG; sig++) if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &standard, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(request->path, request->argv, request->envp);
failed:
    request->error = errno ? errno : ENOEXEC;
    _exit(127);
}

/// `clone3(args)` whose child runs `run(argument)` on the stack `args` gives it and exits with
/// its result; the parent gets the child's pid or -errno. glibc has no public clone3 wrapper
/// that runs a function (the child of a raw system call would return into its parent's frames
/// on a stack it no longer has), hence these few instructions per architecture. Elsewhere -ENOSYS.
static long clone3_running(struct dp_clone_args *args, int (*run)(void *), void *argument) {
#if defined(__x86_64__)
    register long result __asm__("rax") = SYS_clone3;
    register void *a0 __asm__("rdi") = args;
    register unsigned long a1 __asm__("rsi") = sizeof *args;
    register int (*function)(void *) __asm__("r12") = run;
    register void *data __asm__("r13") = argument;
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xor %%ebp, %%ebp\n\t"
        "mov %%r13, %%rdi\n\t"
        "call *%%r12\n\t"
        "mov %%eax, %%edi\n\t"
        "mov $60, %%eax\n\t"          // exit
        "syscall\n\t"
        "hlt\n"
        "1:"
        : "+r"(result)
        : "r"(a0), "r"(a1), "r"(function), "r"(data)
        : "rcx", "r11", "memory");
    return result;
#elif defined(__aarch64__)
    register long x0 __asm__("x0") = (long)args;
    register unsigned long x1 __asm__("x1") = sizeof *args;
    register long x8 __asm__("x8") = SYS_clone3;
    register int (*function)(void *) __asm__("x19") = run;
    register void *data __asm__("x20") = argument;
    __asm__ volatile(
        "svc #0\n\t"
        "cbnz x0, 1f\n\t"
        "mov x29, xzr\n\t"
        "mov x0, x20\n\t"
        "blr x19\n\t"
        "mov x8, #93\n\t"              // exit
        "svc #0\n"
        "1:"
        : "+r"(x0)
        : "r"(x1), "r"(x8), "r"(function), "r"(data)
        : "memory");
    return x0;
#else
    (void)args; (void)run; (void)argument;
    return -ENOSYS;
#endif
}

static int spawn_in_cgroup_with(const char *path, char *const argv[], char *const envp[], const int *sources, int count,
                                 int cgroup, const char *procs, const char *home, const char *const legacy[], int legacyCount,
                                 int *pid, int *placed) {
    if (count > 256) return EINVAL;
    struct spawn_request request = {
        .path = path, .argv = argv, .envp = envp, .sources = sources, .count = count,
        .enter = NULL, .home = home, .legacy = legacy, .legacyCount = legacyCount, .placed = 0, .error = 0,
    };
    size_t size = 256 * 1024;
    char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return errno;
    // The child starts with every signal blocked (but glibc's own two, whose handlers act only on
    // signals from this process), so no handler of this process runs in it.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    struct dp_clone_args arguments = {
        .flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP, .exit_signal = SIGCHLD,
        .stack = (unsigned long long)(uintptr_t)stack, .stack_size = size, .cgroup = (unsigned long long)cgroup,
    };
    long child = clone3_running(&arguments, spawn_child, &request);
    if (child < 0 && child != -EAGAIN && child != -ENOMEM) {
        // No clone3 here, no CLONE_INTO_CGROUP, clone3 refused by a filter (ENOSYS, E2BIG,
        // EINVAL, EPERM…), or the cgroup refused: a child that writes itself in, as the kernel
        // lets it. A cgroup that refuses that too leaves it outside, and it says so.
        request.enter = procs;
        child = clone(spawn_child, stack + size, CLONE_VM | CLONE_VFORK | SIGCHLD, &request);
        if (child < 0) child = -errno;
    }
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    munmap(stack, size);
    if (child < 0) return (int)-child;
    if (request.error) {
        int status;
        while (waitpid((pid_t)child, &status, 0) < 0 && errno == EINTR) {}
        return request.error;
    }
    *pid = (int)child;
    *placed = request.placed;
    return 0;
}

/// Writes `value` and a newline to `file` (``write_control``); 0 or -1. Only async-signal-safe calls.
static int write_number(const char *file, long value) {
    char text[24];
    int at = (int)sizeof text;
    text[--at] = 0;
    text[--at] = '\n';
    do { text[--at] = (char)('0' + value % 10); value /= 10; } while (value > 0 && at > 0);
    return write_control(file, text + at);
}

/// What ``cshim_limit_inotify``'s child is given, and answers.
struct inotify_limits { int namespace; long instances, watches; int step, error; };

/// ``cshim_limit_inotify``'s child: it shares this process's memory (`CLONE_VM`, the parent
/// waits: `CLONE_VFORK`) but is a thread group of its own, as `setns` needs. It answers in `limits`.
static int limit_inotify_child(void *argument) {
    struct inotify_limits *limits = argument;
    if (setns(limits->namespace, CLONE_NEWUSER) != 0) { limits->step = 1; limits->error = errno; _exit(1); }
    if (write_number("/proc/sys/user/max_inotify_instances", limits->instances) != 0) { limits->step = 2; limits->error = errno; _exit(1); }
    if (write_number("/proc/sys/user/max_inotify_watches", limits->watches) != 0) { limits->step = 3; limits->error = errno; _exit(1); }
    _exit(0);
}

static int limit_inotify_with(int namespace, long instances, long watches, int *step) {
    if (instances < 0 || watches < 0) return EINVAL;
    struct inotify_limits limits = {.namespace = namespace, .instances = instances, .watches = watches, .step = 0, .error = 0};
    size_t size = 64 * 1024;
    void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) { *step = 0; return errno; }
    // Every signal blocked in the child: no handler of this process runs on its stack.
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    pid_t child = clone(limit_inotify_child, (char *)stack + size, CLONE_VM | CLONE_VFORK | SIGCHLD, &limits);
    int error = child < 0 ? errno : 0;
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    int status = -1;
    if (child > 0) {
        pid_t reaped;
        while ((reaped = waitpid(child, &status, 0)) < 0 && errno == EINTR) {}
        if (reaped != child) status = -1;
    }
    munmap(stack, size);
    if (error) { *step = 0; return error; }
    if (limits.step) { *step = limits.step; return limits.error ? limits.error : EIO; }
    // Only a helper seen to finish counts: one killed before it answered set nothing.
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) { *step = 0; return ECHILD; }
    return 0;
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

int cshim_link_unnamed(int fd, int newdirfd, const char *newpath) {
    if (linkat(fd, "", newdirfd, newpath, AT_EMPTY_PATH) == 0) return 0;
    // Refused without the capability before 6.10 (ENOENT), or by a security module (EPERM).
    if (errno != ENOENT && errno != EPERM && errno != EINVAL) return -errno;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    return linkat(AT_FDCWD, proc, newdirfd, newpath, AT_SYMLINK_FOLLOW) == 0 ? 0 : -errno;
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

int cshim_spawn(const char *path, char *const argv[], char *const envp[], const int *sources, int count, int *pid) {
    int error = spawn_with(path, argv, envp, sources, count, pid);
    return error ? -error : 0;
}

int cshim_spawn_in_cgroup(const char *path, char *const argv[], char *const envp[], const int *sources, int count,
                          int cgroup, const char *procs, const char *home, const char *const legacy[], int legacyCount,
                          int *pid, int *placed) {
    int error = spawn_in_cgroup_with(path, argv, envp, sources, count, cgroup, procs, home, legacy, legacyCount, pid, placed);
    return error ? -error : 0;
}

int cshim_limit_inotify(int namespace, long instances, long watches, int *step) {
    int error = limit_inotify_with(namespace, instances, watches, step);
    return error ? -error : 0;
}

long cshim_getdents64(int fd, void *buffer, unsigned long size) {
    long n = syscall(SYS_getdents64, fd, buffer, size);
    return n < 0 ? -errno : n;
}

int cshim_gettid(void) { return (int)syscall(SYS_gettid); }

int cshim_at_empty_path(void) { return AT_EMPTY_PATH; }
long cshim_utime_now(void) { return UTIME_NOW; }
long cshim_utime_omit(void) { return UTIME_OMIT; }
int cshim_falloc_keep_size(void) { return FALLOC_FL_KEEP_SIZE; }
