#define _GNU_SOURCE
#include <fcntl.h>
#include "CLinuxShims.h"

int cshim_o_tmpfile(void) { return O_TMPFILE; }
