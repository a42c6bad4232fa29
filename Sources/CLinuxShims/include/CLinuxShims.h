// Linux headers and constants that Swift's Glibc module does not export.
#ifndef C_LINUX_SHIMS_H
#define C_LINUX_SHIMS_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <sys/xattr.h>
#include <sys/prctl.h>

/// `O_TMPFILE` (a macro Swift cannot import): an unnamed file in a directory, linked in later.
static inline int cshim_o_tmpfile(void) { return O_TMPFILE; }
#endif
