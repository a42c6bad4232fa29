// The kernel's FUSE protocol, from the system's <linux/fuse.h> (Debian's linux-libc-dev, which
// every C toolchain has: nothing new to install). The file system speaks it directly, as go-fuse
// and Rust's fuser do; libfuse is not used. Only the file system's Kernel/ reads it; system calls
// the protocol does not define are DataProtectionSystem's (CLinuxShims).
// Keep this header free of feature macros (_GNU_SOURCE): it is imported next to Glibc and
// Dispatch, whose view of the system headers must stay the same.
#ifndef CFUSEKERNEL_H
#define CFUSEKERNEL_H
#include <linux/fuse.h>
#include <stdint.h>

// The protocol version this server speaks: the header's. The kernel offers its own (newer) and
// keeps to the older of the two.
static const uint32_t cfuse_major = FUSE_KERNEL_VERSION;
static const uint32_t cfuse_minor = FUSE_KERNEL_MINOR_VERSION;

// INIT flags this server asks for (bits of fuse_init_out.flags).
static const uint32_t cfuse_async_read = FUSE_ASYNC_READ;
static const uint32_t cfuse_atomic_o_trunc = FUSE_ATOMIC_O_TRUNC;
static const uint32_t cfuse_big_writes = FUSE_BIG_WRITES;
static const uint32_t cfuse_max_pages = FUSE_MAX_PAGES;
static const uint32_t cfuse_parallel_dirops = FUSE_PARALLEL_DIROPS;
static const uint32_t cfuse_export_support = FUSE_EXPORT_SUPPORT;
// READDIRPLUS (entries with their attributes: no LOOKUP per entry), when the kernel sees a
// program stat what it lists (`ls -l`).
static const uint32_t cfuse_do_readdirplus = FUSE_DO_READDIRPLUS;
static const uint32_t cfuse_readdirplus_auto = FUSE_READDIRPLUS_AUTO;
// The server clears set-user-ID and set-group-ID bits where the kernel says (a write, a
// truncation, a chown): without it the kernel asks for security.capability before every write.
static const uint32_t cfuse_handle_killpriv_v2 = FUSE_HANDLE_KILLPRIV_V2;
static const uint32_t cfuse_write_kill_suidgid = FUSE_WRITE_KILL_SUIDGID;
static const uint32_t cfuse_open_kill_suidgid = FUSE_OPEN_KILL_SUIDGID;
static const uint32_t cfuse_fattr_kill_suidgid = FATTR_KILL_SUIDGID;

// SETATTR's valid bits.
static const uint32_t cfuse_fattr_mode = FATTR_MODE;
static const uint32_t cfuse_fattr_uid = FATTR_UID;
static const uint32_t cfuse_fattr_gid = FATTR_GID;
static const uint32_t cfuse_fattr_size = FATTR_SIZE;
static const uint32_t cfuse_fattr_atime = FATTR_ATIME;
static const uint32_t cfuse_fattr_mtime = FATTR_MTIME;
static const uint32_t cfuse_fattr_fh = FATTR_FH;
static const uint32_t cfuse_fattr_atime_now = FATTR_ATIME_NOW;
static const uint32_t cfuse_fattr_mtime_now = FATTR_MTIME_NOW;

// Requests that carry a file handle in their flags.
static const uint32_t cfuse_getattr_fh = FUSE_GETATTR_FH;

/// The protocol minor version of the installed header (for the build's record).
uint32_t cfuse_header_minor(void);

#endif
