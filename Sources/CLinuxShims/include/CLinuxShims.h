// Linux headers that Swift's Glibc module does not export.
#ifndef C_LINUX_SHIMS_H
#define C_LINUX_SHIMS_H
#include <sys/xattr.h>
#include <sys/prctl.h>
#endif
