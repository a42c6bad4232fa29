// Intentionally empty: CLinuxShims only re-exports system headers (see include/CLinuxShims.h).
#include "CLinuxShims.h"
