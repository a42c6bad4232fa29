#ifndef DATAPROTECTION_COPENSSLCRYPTO_H
#define DATAPROTECTION_COPENSSLCRYPTO_H
// Only the EVP interfaces PageCipher and GCMContexts call (OpenSSL 3: EVP_CIPHER_fetch, EVP_MAC).
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/crypto.h>
#endif
