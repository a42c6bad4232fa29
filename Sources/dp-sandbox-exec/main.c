// dp-sandbox-exec: the last step into an app's sandbox (FORMAT.md §10.2).
//
// bubblewrap has built the app's mount namespace; this program, run inside it as the app's
// first process, restricts itself with Landlock and then executes the app. Landlock cannot be
// applied to another process, and a Landlocked process can no longer mount, so this step
// cannot happen before bubblewrap nor inside the supervisor. It is written in C so that it adds
// no language runtime to every launch.
//
//   dp-sandbox-exec [--status-fd N] [--stderr-fd N] [--scope] [--max-tasks N]
//                   [--allow RIGHTS:PATH]... -- PROGRAM [ARGUMENTS...]
//
// RIGHTS is one of:
//   exec    read files and directories, execute files      (the system, the runtime, the app)
//   read    read files and directories                     (/proc, the container's metadata)
//   device  read and write files, read directories, device ioctls   (/dev)
//   write   files, directories and links, no execute, with cross-directory links/renames
//           (the app's Documents and Library); no FIFO, socket or device is made there
//   scratch like write, and sockets and FIFOs too (the app's tmp, where TMPDIR points)
//   shared  like write, without cross-directory links/renames (group containers)
//   inbox   read files and directories, remove files       (the app's Inbox)
// Every file-system right the kernel knows is handled, so anything not allowed above is
// denied. --scope also confines abstract Unix sockets and signals to the sandbox (ABI 6).
//
// Then a system-call filter (libseccomp, loaded at run time: the build needs nothing of it)
// refuses what an app has no use for and what has a long history of privilege escalations: the
// kernel's key calls (after joining a new, empty session keyring: the user's keyring with its
// Kerberos caches and fscrypt keys stays out of reach), new namespaces (unshare, setns, clone
// with CLONE_NEW*; clone3 answers ENOSYS so libc falls back to clone), mounts, ptrace,
// perf_event_open, bpf, userfaultfd, io_uring, personality changes, module and kexec calls, and
// the TIOCSTI/TIOCLINUX ioctls. Calls of another architecture's ABI kill the process.
//
// --max-tasks sets RLIMIT_NPROC: the sandbox is a user namespace of its own, where the kernel
// (5.14 and later) counts only the app's processes and threads against it — a per-app budget,
// not the user's. (The kernel never applies RLIMIT_NPROC to root: there the supervisor's pids
// cgroup holds.)
//
// The status descriptor (if given) tells the supervisor how it went: "R" once the restrictions
// are in force, just before the exec (which closes the descriptor: it is close-on-exec); on any
// failure, one line after it, and nothing is executed (exit status 126; the line also goes to
// standard error). A supervisor that reads nothing at all knows bubblewrap failed before us.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <dlfcn.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/resource.h>

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

// The kernel's Landlock ABI, defined here (the installed header may be older than the kernel).
struct dp_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};
struct dp_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

enum {
    DP_RULE_PATH_BENEATH = 1,
    DP_CREATE_RULESET_VERSION = 1,
};
#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_REMOVE_DIR (1ULL << 4)
#define FS_REMOVE_FILE (1ULL << 5)
#define FS_MAKE_CHAR (1ULL << 6)
#define FS_MAKE_DIR (1ULL << 7)
#define FS_MAKE_REG (1ULL << 8)
#define FS_MAKE_SOCK (1ULL << 9)
#define FS_MAKE_FIFO (1ULL << 10)
#define FS_MAKE_BLOCK (1ULL << 11)
#define FS_MAKE_SYM (1ULL << 12)
#define FS_REFER (1ULL << 13)      /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14)   /* ABI 3 */
#define FS_IOCTL_DEV (1ULL << 15)  /* ABI 5 */
#define SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)  /* ABI 6 */
#define SCOPE_SIGNAL (1ULL << 1)                /* ABI 6 */

#define FILE_RIGHTS (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
#define MAKE_RIGHTS (FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
#define MAKE_DATA_RIGHTS (FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_SYM)
#define READ_RIGHTS (FS_READ_FILE | FS_READ_DIR)
#define WRITE_RIGHTS (READ_RIGHTS | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_DIR | FS_REMOVE_FILE | MAKE_RIGHTS)
#define DATA_RIGHTS (READ_RIGHTS | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_DIR | FS_REMOVE_FILE | MAKE_DATA_RIGHTS)

/// The oldest ABI whose rights the sandbox needs: TRUNCATE, or an Inbox file could be emptied.
#define MINIMUM_ABI 3

static int status_fd = -1;

// libseccomp's interface (libseccomp 2.x, seccomp.h), declared here and loaded at run time.
typedef void *scmp_filter_ctx;
enum dp_scmp_compare { DP_SCMP_CMP_NE = 1, DP_SCMP_CMP_EQ = 4, DP_SCMP_CMP_MASKED_EQ = 7 };
struct dp_scmp_arg_cmp {
    unsigned int arg;
    enum dp_scmp_compare op;
    uint64_t datum_a;
    uint64_t datum_b;
};
#define DP_SCMP_ACT_ALLOW 0x7fff0000U
#define DP_SCMP_ACT_ERRNO(x) (0x00050000U | ((x) & 0x0000ffffU))
struct dp_seccomp {
    scmp_filter_ctx (*init)(uint32_t def_action);
    int (*rule_add_array)(scmp_filter_ctx ctx, uint32_t action, int syscall, unsigned int arg_cnt, const struct dp_scmp_arg_cmp *args);
    int (*resolve_name)(const char *name);
    int (*load)(scmp_filter_ctx ctx);
    void (*release)(scmp_filter_ctx ctx);
};

static void fail(const char *format, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *format, ...) {
    char line[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line - 1, format, args);
    va_end(args);
    size_t n = strlen(line);
    line[n++] = '\n';
    if (status_fd >= 0) (void)!write(status_fd, line, n);
    (void)!write(2, "dp-sandbox-exec: ", 17);
    (void)!write(2, line, n);
    _exit(126);
}

static int parse_fd(const char *text) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (!text[0] || *end || value < 0 || value > 65535) fail("not a descriptor number: %s", text);
    return (int)value;
}

static uint64_t rights_named(const char *name, size_t length) {
#define IS(word) (length == strlen(word) && strncmp(name, word, length) == 0)
    if (IS("exec")) return READ_RIGHTS | FS_EXECUTE;
    if (IS("read")) return READ_RIGHTS;
    if (IS("device")) return READ_RIGHTS | FS_WRITE_FILE | FS_IOCTL_DEV;
    if (IS("write")) return DATA_RIGHTS | FS_REFER;
    if (IS("scratch")) return DATA_RIGHTS | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_REFER;
    if (IS("shared")) return DATA_RIGHTS;
    if (IS("inbox")) return READ_RIGHTS | FS_REMOVE_FILE;
#undef IS
    return 0;
}

/// Loads libseccomp (before Landlock: its library is then still reachable however rules read).
static struct dp_seccomp load_seccomp(void) {
    void *library = dlopen("libseccomp.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!library) fail("libseccomp is not installed (%s): apt-get install libseccomp2", dlerror());
    struct dp_seccomp api;
    *(void **)&api.init = dlsym(library, "seccomp_init");
    *(void **)&api.rule_add_array = dlsym(library, "seccomp_rule_add_array");
    *(void **)&api.resolve_name = dlsym(library, "seccomp_syscall_resolve_name");
    *(void **)&api.load = dlsym(library, "seccomp_load");
    *(void **)&api.release = dlsym(library, "seccomp_release");
    if (!api.init || !api.rule_add_array || !api.resolve_name || !api.load || !api.release) fail("libseccomp.so.2 lacks a function this program needs");
    return api;
}

/// Denies `name` with `error` when the comparisons hold (all of them; none: always). A call this
/// kernel's architecture does not have is skipped.
static void deny(struct dp_seccomp *api, scmp_filter_ctx ctx, const char *name, int error, unsigned int count, const struct dp_scmp_arg_cmp *args) {
    int number = api->resolve_name(name);
    if (number < 0) return;   // __NR_SCMP_ERROR: not a call here
    int rc = api->rule_add_array(ctx, DP_SCMP_ACT_ERRNO(error), number, count, args);
    if (rc < 0) fail("seccomp rule for %s: %s", name, strerror(-rc));
}

static void install_system_call_filter(struct dp_seccomp *api) {
    // A new, empty session keyring first: even a key call that got through would see nothing.
    if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL) < 0 && errno != ENOSYS && errno != EPERM)
        fail("keyctl(KEYCTL_JOIN_SESSION_KEYRING): %s", strerror(errno));
    scmp_filter_ctx ctx = api->init(DP_SCMP_ACT_ALLOW);
    if (!ctx) fail("seccomp_init failed");
    static const char *const refused[] = {
        "keyctl", "add_key", "request_key",
        "unshare", "setns",
        "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
        "ptrace", "process_vm_readv", "process_vm_writev", "perf_event_open", "bpf", "userfaultfd",
        "io_uring_setup", "io_uring_enter", "io_uring_register",
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct", "swapon", "swapoff", "reboot",
        "syslog", "quotactl", "lookup_dcookie", "vhangup", "nfsservctl", "uselib", "name_to_handle_at", "open_by_handle_at",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) deny(api, ctx, refused[i], EPERM, 0, NULL);
    // clone with any new-namespace flag (x86-64: the flags are the first argument).
    static const uint64_t namespaces[] = {0x00020000 /* NEWNS */, 0x02000000 /* NEWCGROUP */, 0x04000000 /* NEWUTS */,
                                          0x08000000 /* NEWIPC */, 0x10000000 /* NEWUSER */, 0x20000000 /* NEWPID */, 0x40000000 /* NEWNET */};
    for (size_t i = 0; i < sizeof namespaces / sizeof *namespaces; i++) {
        struct dp_scmp_arg_cmp flag = {.arg = 0, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = namespaces[i], .datum_b = namespaces[i]};
        deny(api, ctx, "clone", EPERM, 1, &flag);
    }
    // clone3's flags are in memory a filter cannot read: ENOSYS, and libc falls back to clone.
    deny(api, ctx, "clone3", ENOSYS, 0, NULL);
    // Only Linux's own personality (no address-space tricks, no emulation modes).
    struct dp_scmp_arg_cmp linux_only = {.arg = 0, .op = DP_SCMP_CMP_NE, .datum_a = 0 /* PER_LINUX */, .datum_b = 0};
    deny(api, ctx, "personality", EINVAL, 1, &linux_only);
    // No set-user-ID or set-group-ID file or directory: chmod and creation modes with those bits.
    struct dp_scmp_arg_cmp setid1 = {.arg = 1, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISUID, .datum_b = S_ISUID};
    struct dp_scmp_arg_cmp setgid1 = {.arg = 1, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISGID, .datum_b = S_ISGID};
    struct dp_scmp_arg_cmp setid2 = {.arg = 2, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISUID, .datum_b = S_ISUID};
    struct dp_scmp_arg_cmp setgid2 = {.arg = 2, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISGID, .datum_b = S_ISGID};
    struct dp_scmp_arg_cmp setid3 = {.arg = 3, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISUID, .datum_b = S_ISUID};
    struct dp_scmp_arg_cmp setgid3 = {.arg = 3, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = S_ISGID, .datum_b = S_ISGID};
    const char *mode_arg1[] = {"chmod", "fchmod", "creat", "mkdir"};
    for (size_t i = 0; i < sizeof mode_arg1 / sizeof *mode_arg1; i++) {
        deny(api, ctx, mode_arg1[i], EPERM, 1, &setid1);
        deny(api, ctx, mode_arg1[i], EPERM, 1, &setgid1);
    }
    const char *mode_arg2[] = {"fchmodat", "fchmodat2", "mkdirat"};
    for (size_t i = 0; i < sizeof mode_arg2 / sizeof *mode_arg2; i++) {
        deny(api, ctx, mode_arg2[i], EPERM, 1, &setid2);
        deny(api, ctx, mode_arg2[i], EPERM, 1, &setgid2);
    }
    // open and openat read their mode only when they create a file: with O_CREAT, or O_TMPFILE
    // (an unnamed file linked in later).
    static const uint64_t creating_flags[] = {O_CREAT, 0x400000 /* __O_TMPFILE */};
    for (size_t i = 0; i < sizeof creating_flags / sizeof *creating_flags; i++) {
        struct dp_scmp_arg_cmp creating1 = {.arg = 1, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = creating_flags[i], .datum_b = creating_flags[i]};
        struct dp_scmp_arg_cmp creating2 = {.arg = 2, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = creating_flags[i], .datum_b = creating_flags[i]};
        struct dp_scmp_arg_cmp open_setuid[] = {creating1, setid2}, open_setgid[] = {creating1, setgid2};
        struct dp_scmp_arg_cmp openat_setuid[] = {creating2, setid3}, openat_setgid[] = {creating2, setgid3};
        deny(api, ctx, "open", EPERM, 2, open_setuid);
        deny(api, ctx, "open", EPERM, 2, open_setgid);
        deny(api, ctx, "openat", EPERM, 2, openat_setuid);
        deny(api, ctx, "openat", EPERM, 2, openat_setgid);
    }
    // openat2 takes its mode in memory a filter cannot read: ENOSYS, and libc falls back to openat.
    deny(api, ctx, "openat2", ENOSYS, 0, NULL);
    // No typing into the terminal of whoever started it, no console tricks.
    static const uint64_t terminal[] = {TIOCSTI, 0x541C /* TIOCLINUX */};
    for (size_t i = 0; i < sizeof terminal / sizeof *terminal; i++) {
        struct dp_scmp_arg_cmp request = {.arg = 1, .op = DP_SCMP_CMP_MASKED_EQ, .datum_a = 0xFFFFFFFFu, .datum_b = terminal[i]};
        deny(api, ctx, "ioctl", EPERM, 1, &request);
    }
    int rc = api->load(ctx);
    if (rc < 0) fail("seccomp_load: %s", strerror(-rc));
    api->release(ctx);
}

static long parse_count(const char *text) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (!text[0] || *end || value < 1 || value > 1L << 30) fail("not a count: %s", text);
    return value;
}

// SwiftPM links every executable with the Swift runtime's image registration (swiftrt.o), which
// calls into libswiftCore. This helper has no Swift in it: these two no-op definitions satisfy
// the registration, so that, linked with the static standard library (Package.swift), nothing
// of the runtime is linked in and no libswiftCore.so is loaded. The helper runs at every app
// launch: loading the runtime cost it half a millisecond of its one.
void swift_addNewDSOImage(const void *image) { (void)image; }
int _swift_backtrace_isThunkFunction(const char *name) { (void)name; return 0; }

int main(int argc, char **argv) {
    int stderr_fd = -1, scope = 0, first_rule = 0, rule_count = 0, program = -1;
    long max_tasks = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { program = i + 1; break; }
        if (strcmp(argv[i], "--status-fd") == 0 && i + 1 < argc) {
            status_fd = parse_fd(argv[++i]);
            if (fcntl(status_fd, F_SETFD, FD_CLOEXEC) != 0) fail("status descriptor %d: %s", status_fd, strerror(errno));
        } else if (strcmp(argv[i], "--stderr-fd") == 0 && i + 1 < argc) {
            stderr_fd = parse_fd(argv[++i]);
        } else if (strcmp(argv[i], "--scope") == 0) {
            scope = 1;
        } else if (strcmp(argv[i], "--max-tasks") == 0 && i + 1 < argc) {
            max_tasks = parse_count(argv[++i]);
        } else if (strcmp(argv[i], "--allow") == 0 && i + 1 < argc) {
            if (!first_rule) first_rule = i;
            rule_count++;
            i++;
        } else {
            fail("unknown argument: %s", argv[i]);
        }
    }
    if (program < 0 || program >= argc) fail("no program to run (expected -- PROGRAM)");
    struct dp_seccomp seccomp = load_seccomp();

    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, DP_CREATE_RULESET_VERSION);
    if (abi < 0) {
        if (errno == ENOSYS) fail("this kernel has no Landlock (Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK)");
        if (errno == EOPNOTSUPP) fail("Landlock is disabled on this kernel (add landlock to the lsm= boot parameter)");
        fail("Landlock: %s", strerror(errno));
    }
    if (abi < MINIMUM_ABI) fail("Landlock ABI %ld is too old: the sandbox needs ABI %d (Linux 6.2) to keep the Inbox read-only", abi, MINIMUM_ABI);
    if (scope && abi < 6) fail("Landlock ABI %ld cannot scope abstract sockets and signals (ABI 6, Linux 6.12)", abi);

    struct dp_ruleset_attr attr = {0};
    attr.handled_access_fs = WRITE_RIGHTS | FS_EXECUTE | FS_REFER | FS_TRUNCATE;
    if (abi >= 5) attr.handled_access_fs |= FS_IOCTL_DEV;
    if (scope) attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
    // The kernel takes the attribute's prefix it knows: one field before ABI 4, two before 6.
    size_t attr_size = abi >= 6 ? sizeof attr : abi >= 4 ? 2 * sizeof(uint64_t) : sizeof(uint64_t);
    int ruleset = (int)syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0);
    if (ruleset < 0) fail("landlock_create_ruleset: %s", strerror(errno));

    for (int i = first_rule, added = 0; added < rule_count; i++) {
        if (strcmp(argv[i], "--allow") != 0) continue;
        const char *rule = argv[++i];
        const char *colon = strchr(rule, ':');
        uint64_t rights = colon ? rights_named(rule, (size_t)(colon - rule)) : 0;
        if (!rights) fail("not a rule (RIGHTS:PATH with exec, read, device, write, scratch, shared or inbox): %s", rule);
        const char *path = colon + 1;
        int fd = open(path, O_PATH | O_CLOEXEC);
        if (fd < 0) fail("%s: %s", path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0) fail("%s: %s", path, strerror(errno));
        if (!S_ISDIR(st.st_mode)) rights &= FILE_RIGHTS;
        rights &= attr.handled_access_fs;
        struct dp_path_beneath_attr beneath = {.allowed_access = rights, .parent_fd = fd};
        if (syscall(__NR_landlock_add_rule, ruleset, DP_RULE_PATH_BENEATH, &beneath, 0) != 0) fail("landlock_add_rule %s: %s", path, strerror(errno));
        close(fd);
        added++;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
    if (syscall(__NR_landlock_restrict_self, ruleset, 0) != 0) fail("landlock_restrict_self: %s", strerror(errno));
    close(ruleset);
    install_system_call_filter(&seccomp);

    if (stderr_fd >= 0) {
        if (dup2(stderr_fd, 2) < 0) fail("standard error: %s", strerror(errno));
        if (stderr_fd != 2) close(stderr_fd);
    }
    if (max_tasks) {
        struct rlimit tasks = {.rlim_cur = (rlim_t)max_tasks, .rlim_max = (rlim_t)max_tasks};
        if (setrlimit(RLIMIT_NPROC, &tasks) != 0) fail("RLIMIT_NPROC: %s", strerror(errno));
    }
    if (status_fd >= 0) (void)!write(status_fd, "R", 1);
    execvp(argv[program], &argv[program]);
    fail("%s: %s", argv[program], strerror(errno));
}
