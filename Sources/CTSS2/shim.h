#ifndef DATAPROTECTION_CTSS2_SHIM_H
#define DATAPROTECTION_CTSS2_SHIM_H

#include <tss2/tss2_esys.h>
#include <tss2/tss2_tctildr.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>

#endif
