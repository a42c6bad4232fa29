#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <string.h>
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
