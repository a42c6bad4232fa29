#include "CFUSEKernel.h"

uint32_t cfuse_header_minor(void) { return FUSE_KERNEL_MINOR_VERSION; }
