// The part of the TPM Software Stack (tpm2-tss) that DataProtectionKeybag's TPM binding uses,
// declared here and loaded at run time, as systemd loads it: a build needs no TPM headers, a
// binary starts on a machine without the stack, and only a TPM operation needs
// libtss2-esys.so.0, libtss2-tctildr.so.0 and libtss2-rc.so.0 (Debian libtss2-esys-3.0.2-0,
// libtss2-tctildr0, libtss2-rc0).
//
// Written from the TCG specifications: "TCG TSS 2.0 Overview and Common Structures
// Specification" (the TPM2_* types and the sizes of their arrays), "TCG TSS 2.0 Enhanced System
// API (ESAPI) Specification" (Esys_*), the "TCTI Loader" and the response-code decoder. Only the
// declarations the binding needs are here; their sizes and field offsets are checked against the
// stack's own headers by a test (`TPMSoftwareStackTests.theDeclarationsMatchTheStacksHeaders`,
// in Tests/DataProtectionTPMTests/TPMSoftwareStackTests.swift).
//
// The functions below carry the specification's names (`Esys_Create` …) as static inline
// trampolines into a table filled by `dp_tss2_load()`: call it, and check it succeeded, before any.
#ifndef DATAPROTECTION_TPM_SOFTWARE_STACK_H
#define DATAPROTECTION_TPM_SOFTWARE_STACK_H

#include <stddef.h>
#include <stdint.h>

// MARK: - Base types (Overview §5, Part 2 §5)

typedef uint8_t UINT8;
typedef uint8_t BYTE;
typedef uint16_t UINT16;
typedef uint32_t UINT32;
typedef uint64_t UINT64;
typedef uint32_t TSS2_RC;
typedef uint32_t ESYS_TR;

typedef struct ESYS_CONTEXT ESYS_CONTEXT;
typedef struct TSS2_TCTI_CONTEXT TSS2_TCTI_CONTEXT;
typedef struct TSS2_ABI_VERSION TSS2_ABI_VERSION;
struct TSS2_ABI_VERSION {
    UINT32 tssCreator;
    UINT32 tssFamily;
    UINT32 tssLevel;
    UINT32 tssVersion;
};

typedef UINT16 TPM2_ALG_ID;
typedef UINT16 TPM2_ECC_CURVE;
typedef UINT16 TPM2_KEY_BITS;
typedef UINT8 TPM2_SE;
typedef UINT32 TPM2_CAP;
typedef UINT32 TPM2_PT;
typedef UINT32 TPM2_HANDLE;
typedef UINT8 TPM2_NT;
typedef UINT32 TPMA_OBJECT;
typedef UINT8 TPMA_SESSION;
typedef UINT32 TPMA_PERMANENT;
typedef UINT32 TPMA_NV;
typedef BYTE TPMI_YES_NO;
typedef TPM2_HANDLE TPMI_DH_PERSISTENT;
typedef TPM2_HANDLE TPMI_RH_NV_INDEX;
typedef TPM2_ALG_ID TPMI_ALG_HASH;
typedef TPM2_ALG_ID TPMI_ALG_SYM;
typedef TPM2_ALG_ID TPMI_ALG_SYM_OBJECT;
typedef TPM2_ALG_ID TPMI_ALG_SYM_MODE;
typedef TPM2_ALG_ID TPMI_ALG_KDF;
typedef TPM2_ALG_ID TPMI_ALG_KEYEDHASH_SCHEME;
typedef TPM2_ALG_ID TPMI_ALG_ASYM_SCHEME;
typedef TPM2_ALG_ID TPMI_ALG_RSA_SCHEME;
typedef TPM2_ALG_ID TPMI_ALG_ECC_SCHEME;
typedef TPM2_ALG_ID TPMI_ALG_PUBLIC;
typedef TPM2_ECC_CURVE TPMI_ECC_CURVE;
typedef TPM2_KEY_BITS TPMI_AES_KEY_BITS;
typedef TPM2_KEY_BITS TPMI_RSA_KEY_BITS;

// MARK: - Constants (Part 2 §6, §8; ESAPI §3)

#define TSS2_RC_SUCCESS ((TSS2_RC)0)

#define ESYS_TR_NONE 0xfffU
#define ESYS_TR_PASSWORD 0x0ffU
#define ESYS_TR_RH_OWNER 0x101U
#define ESYS_TR_RH_LOCKOUT 0x10AU

#define TPM2_ALG_AES ((TPM2_ALG_ID)0x0006)
#define TPM2_ALG_KEYEDHASH ((TPM2_ALG_ID)0x0008)
#define TPM2_ALG_SHA256 ((TPM2_ALG_ID)0x000B)
#define TPM2_ALG_NULL ((TPM2_ALG_ID)0x0010)
#define TPM2_ALG_ECC ((TPM2_ALG_ID)0x0023)
#define TPM2_ALG_CFB ((TPM2_ALG_ID)0x0043)
#define TPM2_ECC_NIST_P256 ((TPM2_ECC_CURVE)0x0003)

#define TPM2_SE_HMAC ((TPM2_SE)0x00)
#define TPM2_SE_POLICY ((TPM2_SE)0x01)
#define TPM2_SE_TRIAL ((TPM2_SE)0x03)

#define TPM2_CAP_HANDLES ((TPM2_CAP)0x00000001)
#define TPM2_CAP_TPM_PROPERTIES ((TPM2_CAP)0x00000006)

#define TPMA_OBJECT_FIXEDTPM ((TPMA_OBJECT)0x00000002)
#define TPMA_OBJECT_FIXEDPARENT ((TPMA_OBJECT)0x00000010)
#define TPMA_OBJECT_SENSITIVEDATAORIGIN ((TPMA_OBJECT)0x00000020)
#define TPMA_OBJECT_USERWITHAUTH ((TPMA_OBJECT)0x00000040)
#define TPMA_OBJECT_NODA ((TPMA_OBJECT)0x00000400)
#define TPMA_OBJECT_RESTRICTED ((TPMA_OBJECT)0x00010000)
#define TPMA_OBJECT_DECRYPT ((TPMA_OBJECT)0x00020000)

#define TPMA_SESSION_CONTINUESESSION ((TPMA_SESSION)0x01)
#define TPMA_SESSION_DECRYPT ((TPMA_SESSION)0x20)
#define TPMA_SESSION_ENCRYPT ((TPMA_SESSION)0x40)

#define TPMA_PERMANENT_LOCKOUTAUTHSET ((TPMA_PERMANENT)0x00000004)
#define TPMA_PERMANENT_INLOCKOUT ((TPMA_PERMANENT)0x00000200)

#define TPM2_NT_ORDINARY ((TPM2_NT)0x0)
#define TPM2_NT_COUNTER ((TPM2_NT)0x1)
#define TPMA_NV_TPM2_NT_SHIFT (4)
#define TPMA_NV_AUTHWRITE ((TPMA_NV)0x00000004)
#define TPMA_NV_AUTHREAD ((TPMA_NV)0x00040000)
#define TPMA_NV_NO_DA ((TPMA_NV)0x02000000)

// Array sizes: the Overview's values for a PC-client TPM, as tpm2-tss defines them.
#define DP_TPM2_MAX_DIGEST_SIZE 64        // sizeof(TPMU_HA): SHA-512
#define DP_TPM2_MAX_SYM_DATA 256
#define DP_TPM2_MAX_ECC_KEY_BYTES 128
#define DP_TPM2_MAX_RSA_KEY_BYTES 512
#define DP_TPM2_MAX_NV_BUFFER_SIZE 2048
#define DP_TPM2_NUM_PCR_BANKS 16
#define DP_TPM2_PCR_SELECT_MAX 4          // (32 PCRs + 7) / 8
#define DP_TPM2_MAX_CAP_BUFFER 1024
#define DP_TPM2_MAX_CAP_HANDLES ((DP_TPM2_MAX_CAP_BUFFER - 4 - 4) / 4)
#define DP_TPM2_MAX_TPM_PROPERTIES ((DP_TPM2_MAX_CAP_BUFFER - 4 - 4) / 8)
#define DP_TPM2_MAX_PTT_PROPERTIES (DP_TPM2_MAX_CAP_BUFFER / 4)

// MARK: - Sized buffers

typedef struct TPM2B_DIGEST { UINT16 size; BYTE buffer[DP_TPM2_MAX_DIGEST_SIZE]; } TPM2B_DIGEST;
typedef TPM2B_DIGEST TPM2B_AUTH;
typedef TPM2B_DIGEST TPM2B_NONCE;
typedef struct TPM2B_DATA { UINT16 size; BYTE buffer[DP_TPM2_MAX_DIGEST_SIZE]; } TPM2B_DATA;
typedef struct TPM2B_SENSITIVE_DATA { UINT16 size; BYTE buffer[DP_TPM2_MAX_SYM_DATA]; } TPM2B_SENSITIVE_DATA;
typedef struct TPM2B_MAX_NV_BUFFER { UINT16 size; BYTE buffer[DP_TPM2_MAX_NV_BUFFER_SIZE]; } TPM2B_MAX_NV_BUFFER;
typedef struct TPM2B_PUBLIC_KEY_RSA { UINT16 size; BYTE buffer[DP_TPM2_MAX_RSA_KEY_BYTES]; } TPM2B_PUBLIC_KEY_RSA;
typedef struct TPM2B_ECC_PARAMETER { UINT16 size; BYTE buffer[DP_TPM2_MAX_ECC_KEY_BYTES]; } TPM2B_ECC_PARAMETER;

// Only passed from one call to another, never looked into: incomplete here.
typedef struct TPM2B_PRIVATE TPM2B_PRIVATE;
typedef struct TPM2B_CREATION_DATA TPM2B_CREATION_DATA;
typedef struct TPMT_TK_CREATION TPMT_TK_CREATION;

// MARK: - Symmetric definitions and schemes

typedef union TPMU_SYM_KEY_BITS {
    TPMI_AES_KEY_BITS aes;
    TPM2_KEY_BITS sm4;
    TPM2_KEY_BITS camellia;
    TPM2_KEY_BITS sym;
    TPMI_ALG_HASH exclusiveOr;
} TPMU_SYM_KEY_BITS;

typedef union TPMU_SYM_MODE {
    TPMI_ALG_SYM_MODE aes;
    TPMI_ALG_SYM_MODE sm4;
    TPMI_ALG_SYM_MODE camellia;
    TPMI_ALG_SYM_MODE sym;
} TPMU_SYM_MODE;

typedef struct TPMT_SYM_DEF { TPMI_ALG_SYM algorithm; TPMU_SYM_KEY_BITS keyBits; TPMU_SYM_MODE mode; } TPMT_SYM_DEF;
typedef struct TPMT_SYM_DEF_OBJECT { TPMI_ALG_SYM_OBJECT algorithm; TPMU_SYM_KEY_BITS keyBits; TPMU_SYM_MODE mode; } TPMT_SYM_DEF_OBJECT;

typedef struct TPMS_SCHEME_HASH { TPMI_ALG_HASH hashAlg; } TPMS_SCHEME_HASH;
typedef struct TPMS_SCHEME_ECDAA { TPMI_ALG_HASH hashAlg; UINT16 count; } TPMS_SCHEME_ECDAA;
typedef struct TPMS_SCHEME_XOR { TPMI_ALG_HASH hashAlg; TPMI_ALG_KDF kdf; } TPMS_SCHEME_XOR;

typedef union TPMU_SCHEME_KEYEDHASH { TPMS_SCHEME_HASH hmac; TPMS_SCHEME_XOR exclusiveOr; } TPMU_SCHEME_KEYEDHASH;
typedef struct TPMT_KEYEDHASH_SCHEME { TPMI_ALG_KEYEDHASH_SCHEME scheme; TPMU_SCHEME_KEYEDHASH details; } TPMT_KEYEDHASH_SCHEME;

/// Every asymmetric scheme carries a hash algorithm; ECDAA also a count (the largest member).
typedef union TPMU_ASYM_SCHEME { TPMS_SCHEME_HASH anySig; TPMS_SCHEME_ECDAA ecdaa; } TPMU_ASYM_SCHEME;
typedef struct TPMT_ASYM_SCHEME { TPMI_ALG_ASYM_SCHEME scheme; TPMU_ASYM_SCHEME details; } TPMT_ASYM_SCHEME;
typedef struct TPMT_RSA_SCHEME { TPMI_ALG_RSA_SCHEME scheme; TPMU_ASYM_SCHEME details; } TPMT_RSA_SCHEME;
typedef struct TPMT_ECC_SCHEME { TPMI_ALG_ECC_SCHEME scheme; TPMU_ASYM_SCHEME details; } TPMT_ECC_SCHEME;

typedef union TPMU_KDF_SCHEME { TPMS_SCHEME_HASH mgf1; TPMS_SCHEME_HASH kdf1_sp800_56a; TPMS_SCHEME_HASH kdf2; TPMS_SCHEME_HASH kdf1_sp800_108; } TPMU_KDF_SCHEME;
typedef struct TPMT_KDF_SCHEME { TPMI_ALG_KDF scheme; TPMU_KDF_SCHEME details; } TPMT_KDF_SCHEME;

// MARK: - Public areas (Part 2 §12.2)

typedef struct TPMS_KEYEDHASH_PARMS { TPMT_KEYEDHASH_SCHEME scheme; } TPMS_KEYEDHASH_PARMS;
typedef struct TPMS_SYMCIPHER_PARMS { TPMT_SYM_DEF_OBJECT sym; } TPMS_SYMCIPHER_PARMS;
typedef struct TPMS_ASYM_PARMS { TPMT_SYM_DEF_OBJECT symmetric; TPMT_ASYM_SCHEME scheme; } TPMS_ASYM_PARMS;
typedef struct TPMS_RSA_PARMS { TPMT_SYM_DEF_OBJECT symmetric; TPMT_RSA_SCHEME scheme; TPMI_RSA_KEY_BITS keyBits; UINT32 exponent; } TPMS_RSA_PARMS;
typedef struct TPMS_ECC_PARMS { TPMT_SYM_DEF_OBJECT symmetric; TPMT_ECC_SCHEME scheme; TPMI_ECC_CURVE curveID; TPMT_KDF_SCHEME kdf; } TPMS_ECC_PARMS;

typedef union TPMU_PUBLIC_PARMS {
    TPMS_KEYEDHASH_PARMS keyedHashDetail;
    TPMS_SYMCIPHER_PARMS symDetail;
    TPMS_RSA_PARMS rsaDetail;
    TPMS_ECC_PARMS eccDetail;
    TPMS_ASYM_PARMS asymDetail;
} TPMU_PUBLIC_PARMS;

typedef struct TPMS_ECC_POINT { TPM2B_ECC_PARAMETER x; TPM2B_ECC_PARAMETER y; } TPMS_ECC_POINT;

typedef union TPMU_PUBLIC_ID {
    TPM2B_DIGEST keyedHash;
    TPM2B_DIGEST sym;
    TPM2B_PUBLIC_KEY_RSA rsa;
    TPMS_ECC_POINT ecc;
} TPMU_PUBLIC_ID;

typedef struct TPMT_PUBLIC {
    TPMI_ALG_PUBLIC type;
    TPMI_ALG_HASH nameAlg;
    TPMA_OBJECT objectAttributes;
    TPM2B_DIGEST authPolicy;
    TPMU_PUBLIC_PARMS parameters;
    TPMU_PUBLIC_ID unique;
} TPMT_PUBLIC;

typedef struct TPM2B_PUBLIC { UINT16 size; TPMT_PUBLIC publicArea; } TPM2B_PUBLIC;

typedef struct TPMS_SENSITIVE_CREATE { TPM2B_AUTH userAuth; TPM2B_SENSITIVE_DATA data; } TPMS_SENSITIVE_CREATE;
typedef struct TPM2B_SENSITIVE_CREATE { UINT16 size; TPMS_SENSITIVE_CREATE sensitive; } TPM2B_SENSITIVE_CREATE;

// MARK: - PCR selections, NV indices, capabilities

typedef struct TPMS_PCR_SELECTION { TPMI_ALG_HASH hash; UINT8 sizeofSelect; BYTE pcrSelect[DP_TPM2_PCR_SELECT_MAX]; } TPMS_PCR_SELECTION;
typedef struct TPML_PCR_SELECTION { UINT32 count; TPMS_PCR_SELECTION pcrSelections[DP_TPM2_NUM_PCR_BANKS]; } TPML_PCR_SELECTION;

typedef struct TPMS_NV_PUBLIC { TPMI_RH_NV_INDEX nvIndex; TPMI_ALG_HASH nameAlg; TPMA_NV attributes; TPM2B_DIGEST authPolicy; UINT16 dataSize; } TPMS_NV_PUBLIC;
typedef struct TPM2B_NV_PUBLIC { UINT16 size; TPMS_NV_PUBLIC nvPublic; } TPM2B_NV_PUBLIC;

typedef struct TPML_HANDLE { UINT32 count; TPM2_HANDLE handle[DP_TPM2_MAX_CAP_HANDLES]; } TPML_HANDLE;
typedef struct TPMS_TAGGED_PROPERTY { TPM2_PT property; UINT32 value; } TPMS_TAGGED_PROPERTY;
typedef struct TPML_TAGGED_TPM_PROPERTY { UINT32 count; TPMS_TAGGED_PROPERTY tpmProperty[DP_TPM2_MAX_TPM_PROPERTIES]; } TPML_TAGGED_TPM_PROPERTY;
/// The largest member of the capabilities union in tpm2-tss (an implementation's property list).
typedef struct TPML_INTEL_PTT_PROPERTY { UINT32 count; UINT32 property[DP_TPM2_MAX_PTT_PROPERTIES]; } TPML_INTEL_PTT_PROPERTY;

/// Only the members the binding reads; always allocated by the stack (freed with `Esys_Free`).
typedef union TPMU_CAPABILITIES {
    TPML_HANDLE handles;
    TPML_TAGGED_TPM_PROPERTY tpmProperties;
    TPML_INTEL_PTT_PROPERTY intelPttProperty;
} TPMU_CAPABILITIES;
typedef struct TPMS_CAPABILITY_DATA { TPM2_CAP capability; TPMU_CAPABILITIES data; } TPMS_CAPABILITY_DATA;

// MARK: - Functions

/// X(library, return type, name, (parameters), (arguments)) for each function the binding calls;
/// library is 0 for libtss2-esys, 1 for libtss2-tctildr, 2 for libtss2-rc.
#define DP_TSS2_FUNCTIONS(X) \
    X(0, TSS2_RC, Esys_Initialize, (ESYS_CONTEXT **context, TSS2_TCTI_CONTEXT *tcti, TSS2_ABI_VERSION *abiVersion), (context, tcti, abiVersion)) \
    X(0, TSS2_RC, Esys_Create, (ESYS_CONTEXT *c, ESYS_TR parent, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_SENSITIVE_CREATE *inSensitive, \
        const TPM2B_PUBLIC *inPublic, const TPM2B_DATA *outsideInfo, const TPML_PCR_SELECTION *creationPCR, TPM2B_PRIVATE **outPrivate, \
        TPM2B_PUBLIC **outPublic, TPM2B_CREATION_DATA **creationData, TPM2B_DIGEST **creationHash, TPMT_TK_CREATION **creationTicket), \
        (c, parent, s1, s2, s3, inSensitive, inPublic, outsideInfo, creationPCR, outPrivate, outPublic, creationData, creationHash, creationTicket)) \
    X(0, TSS2_RC, Esys_CreatePrimary, (ESYS_CONTEXT *c, ESYS_TR hierarchy, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_SENSITIVE_CREATE *inSensitive, \
        const TPM2B_PUBLIC *inPublic, const TPM2B_DATA *outsideInfo, const TPML_PCR_SELECTION *creationPCR, ESYS_TR *objectHandle, \
        TPM2B_PUBLIC **outPublic, TPM2B_CREATION_DATA **creationData, TPM2B_DIGEST **creationHash, TPMT_TK_CREATION **creationTicket), \
        (c, hierarchy, s1, s2, s3, inSensitive, inPublic, outsideInfo, creationPCR, objectHandle, outPublic, creationData, creationHash, creationTicket)) \
    X(0, TSS2_RC, Esys_DictionaryAttackLockReset, (ESYS_CONTEXT *c, ESYS_TR lockHandle, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3), (c, lockHandle, s1, s2, s3)) \
    X(0, TSS2_RC, Esys_EvictControl, (ESYS_CONTEXT *c, ESYS_TR auth, ESYS_TR object, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, TPMI_DH_PERSISTENT persistent, \
        ESYS_TR *newObject), (c, auth, object, s1, s2, s3, persistent, newObject)) \
    X(0, TSS2_RC, Esys_FlushContext, (ESYS_CONTEXT *c, ESYS_TR handle), (c, handle)) \
    X(0, TSS2_RC, Esys_GetCapability, (ESYS_CONTEXT *c, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, TPM2_CAP capability, UINT32 property, UINT32 count, \
        TPMI_YES_NO *moreData, TPMS_CAPABILITY_DATA **data), (c, s1, s2, s3, capability, property, count, moreData, data)) \
    X(0, TSS2_RC, Esys_Load, (ESYS_CONTEXT *c, ESYS_TR parent, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_PRIVATE *inPrivate, \
        const TPM2B_PUBLIC *inPublic, ESYS_TR *object), (c, parent, s1, s2, s3, inPrivate, inPublic, object)) \
    X(0, TSS2_RC, Esys_NV_DefineSpace, (ESYS_CONTEXT *c, ESYS_TR authHandle, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_AUTH *auth, \
        const TPM2B_NV_PUBLIC *publicInfo, ESYS_TR *nv), (c, authHandle, s1, s2, s3, auth, publicInfo, nv)) \
    X(0, TSS2_RC, Esys_NV_Increment, (ESYS_CONTEXT *c, ESYS_TR authHandle, ESYS_TR nv, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3), (c, authHandle, nv, s1, s2, s3)) \
    X(0, TSS2_RC, Esys_NV_Read, (ESYS_CONTEXT *c, ESYS_TR authHandle, ESYS_TR nv, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, UINT16 size, UINT16 offset, \
        TPM2B_MAX_NV_BUFFER **data), (c, authHandle, nv, s1, s2, s3, size, offset, data)) \
    X(0, TSS2_RC, Esys_NV_UndefineSpace, (ESYS_CONTEXT *c, ESYS_TR authHandle, ESYS_TR nv, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3), (c, authHandle, nv, s1, s2, s3)) \
    X(0, TSS2_RC, Esys_NV_Write, (ESYS_CONTEXT *c, ESYS_TR authHandle, ESYS_TR nv, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_MAX_NV_BUFFER *data, \
        UINT16 offset), (c, authHandle, nv, s1, s2, s3, data, offset)) \
    X(0, TSS2_RC, Esys_PolicyAuthValue, (ESYS_CONTEXT *c, ESYS_TR session, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3), (c, session, s1, s2, s3)) \
    X(0, TSS2_RC, Esys_PolicyGetDigest, (ESYS_CONTEXT *c, ESYS_TR session, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, TPM2B_DIGEST **digest), \
        (c, session, s1, s2, s3, digest)) \
    X(0, TSS2_RC, Esys_PolicyPCR, (ESYS_CONTEXT *c, ESYS_TR session, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, const TPM2B_DIGEST *pcrDigest, \
        const TPML_PCR_SELECTION *pcrs), (c, session, s1, s2, s3, pcrDigest, pcrs)) \
    X(0, TSS2_RC, Esys_StartAuthSession, (ESYS_CONTEXT *c, ESYS_TR tpmKey, ESYS_TR bind, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, \
        const TPM2B_NONCE *nonceCaller, TPM2_SE type, const TPMT_SYM_DEF *symmetric, TPMI_ALG_HASH authHash, ESYS_TR *session), \
        (c, tpmKey, bind, s1, s2, s3, nonceCaller, type, symmetric, authHash, session)) \
    X(0, TSS2_RC, Esys_TRSess_SetAttributes, (ESYS_CONTEXT *c, ESYS_TR session, TPMA_SESSION flags, TPMA_SESSION mask), (c, session, flags, mask)) \
    X(0, TSS2_RC, Esys_TR_Close, (ESYS_CONTEXT *c, ESYS_TR *handle), (c, handle)) \
    X(0, TSS2_RC, Esys_TR_FromTPMPublic, (ESYS_CONTEXT *c, TPM2_HANDLE tpmHandle, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, ESYS_TR *object), \
        (c, tpmHandle, s1, s2, s3, object)) \
    X(0, TSS2_RC, Esys_TR_SetAuth, (ESYS_CONTEXT *c, ESYS_TR handle, const TPM2B_AUTH *authValue), (c, handle, authValue)) \
    X(0, TSS2_RC, Esys_Unseal, (ESYS_CONTEXT *c, ESYS_TR item, ESYS_TR s1, ESYS_TR s2, ESYS_TR s3, TPM2B_SENSITIVE_DATA **outData), \
        (c, item, s1, s2, s3, outData)) \
    X(1, TSS2_RC, Tss2_TctiLdr_Initialize, (const char *nameConf, TSS2_TCTI_CONTEXT **context), (nameConf, context)) \
    X(2, const char *, Tss2_RC_Decode, (TSS2_RC rc), (rc))

/// The functions that return nothing.
#define DP_TSS2_VOID_FUNCTIONS(X) \
    X(0, Esys_Finalize, (ESYS_CONTEXT **context), (context)) \
    X(0, Esys_Free, (void *pointer), (pointer)) \
    X(1, Tss2_TctiLdr_Finalize, (TSS2_TCTI_CONTEXT **context), (context))

struct dp_tss2_table {
#define DP_TSS2_FIELD(library, result, name, parameters, arguments) result (*name) parameters;
#define DP_TSS2_VOID_FIELD(library, name, parameters, arguments) void (*name) parameters;
    DP_TSS2_FUNCTIONS(DP_TSS2_FIELD)
    DP_TSS2_VOID_FUNCTIONS(DP_TSS2_VOID_FIELD)
#undef DP_TSS2_FIELD
#undef DP_TSS2_VOID_FIELD
};

/// Filled by `dp_tss2_load()`; read only after it returned NULL.
extern struct dp_tss2_table dp_tss2;

/// Loads the three libraries and resolves every function, once per process (later calls return
/// the first call's answer). Returns NULL on success, or why not: the loader's own message
/// (`libtss2-esys.so.0: cannot open shared object file: …`, or a missing symbol).
const char *dp_tss2_load(void);

#define DP_TSS2_TRAMPOLINE(library, result, name, parameters, arguments) \
    static inline result name parameters { return dp_tss2.name arguments; }
#define DP_TSS2_VOID_TRAMPOLINE(library, name, parameters, arguments) \
    static inline void name parameters { dp_tss2.name arguments; }
DP_TSS2_FUNCTIONS(DP_TSS2_TRAMPOLINE)
DP_TSS2_VOID_FUNCTIONS(DP_TSS2_VOID_TRAMPOLINE)
#undef DP_TSS2_TRAMPOLINE
#undef DP_TSS2_VOID_TRAMPOLINE

#endif
