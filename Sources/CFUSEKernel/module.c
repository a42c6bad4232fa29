#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "CFUSEKernel.h"

const int cfuse_o_path = O_PATH;
const int cfuse_at_empty_path = AT_EMPTY_PATH;
const long cfuse_utime_now = UTIME_NOW;
const long cfuse_utime_omit = UTIME_OMIT;
const int cfuse_falloc_keep_size = FALLOC_FL_KEEP_SIZE;
const unsigned int cfuse_rename_exchange = RENAME_EXCHANGE;

int cfuse_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}

long cfuse_getdents64(int fd, void *buffer, unsigned long size) {
    return syscall(SYS_getdents64, fd, buffer, size);
}

int cfuse_gettid(void) { return (int)syscall(SYS_gettid); }

uint32_t cfuse_header_minor(void) { return FUSE_KERNEL_MINOR_VERSION; }
