// dp-sandbox-exec: the last step into an app's sandbox (FORMAT.md §10.2).
//
// bubblewrap has built the app's mount namespace; this program, run inside it as the app's
// first process, restricts itself with Landlock and then executes the app. Landlock cannot be
// applied to another process, and a Landlocked process can no longer mount, so this step
// cannot happen before bubblewrap nor inside the supervisor. It is written in C so that it adds
// no language runtime to every launch.
//
//   dp-sandbox-exec [--status-fd N] [--stderr-fd N] [--scope]
//                   [--allow RIGHTS:PATH]... -- PROGRAM [ARGUMENTS...]
//
// RIGHTS is one of:
//   exec    read files and directories, execute files      (the system, the runtime, the app)
//   read    read files and directories                     (/proc, the container's metadata)
//   device  read and write files, read directories, device ioctls   (/dev)
//   write   everything but execute, with cross-directory links/renames (the app's container)
//   shared  like write, without cross-directory links/renames (group containers)
//   inbox   read files and directories, remove files       (the app's Inbox)
// Every file-system right the kernel knows is handled, so anything not allowed above is
// denied. --scope also confines abstract Unix sockets and signals to the sandbox (ABI 6).
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
#define READ_RIGHTS (FS_READ_FILE | FS_READ_DIR)
#define WRITE_RIGHTS (READ_RIGHTS | FS_WRITE_FILE | FS_TRUNCATE | FS_REMOVE_DIR | FS_REMOVE_FILE | MAKE_RIGHTS)

/// The oldest ABI whose rights the sandbox needs: TRUNCATE, or an Inbox file could be emptied.
#define MINIMUM_ABI 3

static int status_fd = -1;

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
    if (IS("write")) return WRITE_RIGHTS | FS_REFER;
    if (IS("shared")) return WRITE_RIGHTS;
    if (IS("inbox")) return READ_RIGHTS | FS_REMOVE_FILE;
#undef IS
    return 0;
}

int main(int argc, char **argv) {
    int stderr_fd = -1, scope = 0, first_rule = 0, rule_count = 0, program = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { program = i + 1; break; }
        if (strcmp(argv[i], "--status-fd") == 0 && i + 1 < argc) {
            status_fd = parse_fd(argv[++i]);
            if (fcntl(status_fd, F_SETFD, FD_CLOEXEC) != 0) fail("status descriptor %d: %s", status_fd, strerror(errno));
        } else if (strcmp(argv[i], "--stderr-fd") == 0 && i + 1 < argc) {
            stderr_fd = parse_fd(argv[++i]);
        } else if (strcmp(argv[i], "--scope") == 0) {
            scope = 1;
        } else if (strcmp(argv[i], "--allow") == 0 && i + 1 < argc) {
            if (!first_rule) first_rule = i;
            rule_count++;
            i++;
        } else {
            fail("unknown argument: %s", argv[i]);
        }
    }
    if (program < 0 || program >= argc) fail("no program to run (expected -- PROGRAM)");

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
        if (!rights) fail("not a rule (RIGHTS:PATH with exec, read, device, write, shared or inbox): %s", rule);
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

    if (stderr_fd >= 0) {
        if (dup2(stderr_fd, 2) < 0) fail("standard error: %s", strerror(errno));
        if (stderr_fd != 2) close(stderr_fd);
    }
    if (status_fd >= 0) (void)!write(status_fd, "R", 1);
    execvp(argv[program], &argv[program]);
    fail("%s: %s", argv[program], strerror(errno));
}
