// Loads the TPM Software Stack at run time (see CTPMSoftwareStack.h): dlopen of each library by
// its soname, dlsym of each function into `dp_tss2`, once per process.
#include "CTPMSoftwareStack.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

struct dp_tss2_table dp_tss2;

static const char *const library_names[] = {"libtss2-esys.so.0", "libtss2-tctildr.so.0", "libtss2-rc.so.0"};
static char load_failure[512];
static const char *load_result;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *libraries[3];
    for (int i = 0; i < 3; i++) {
        libraries[i] = dlopen(library_names[i], RTLD_NOW | RTLD_LOCAL);
        if (libraries[i] == NULL) {
            const char *why = dlerror();
            snprintf(load_failure, sizeof load_failure, "%s", why ? why : library_names[i]);
            load_result = load_failure;
            return;
        }
    }
    struct dp_tss2_table table;
#define DP_TSS2_RESOLVE(library, name) \
    *(void **)&table.name = dlsym(libraries[library], #name); \
    if (table.name == NULL) { \
        snprintf(load_failure, sizeof load_failure, "%s: no symbol %s", library_names[library], #name); \
        load_result = load_failure; \
        return; \
    }
#define DP_TSS2_RESOLVE_FUNCTION(library, result, name, parameters, arguments) DP_TSS2_RESOLVE(library, name)
#define DP_TSS2_RESOLVE_VOID_FUNCTION(library, name, parameters, arguments) DP_TSS2_RESOLVE(library, name)
    DP_TSS2_FUNCTIONS(DP_TSS2_RESOLVE_FUNCTION)
    DP_TSS2_VOID_FUNCTIONS(DP_TSS2_RESOLVE_VOID_FUNCTION)
    dp_tss2 = table;
    load_result = NULL;
}

const char *dp_tss2_load(void) {
    pthread_once(&load_once, load);
    return load_result;
}
