/* netd's TLS interception, shared by its two files: the state that
 * start-up fills (netd-tls.c) and the leaves minted from it per name
 * (netd-leaf.c). Private to src/net. */
#ifndef CAP_NETD_TLS_H
#define CAP_NETD_TLS_H

#include <stdint.h>

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "netd-int.h"

#define LEAF_BACKDATE 3600	/* s: clocks a little behind still accept a new leaf */
#define LEAF_MARGIN 3600	/* s: a cached leaf this close to its end is minted anew */

struct leaf {
	char name[254];		/* "": free */
	X509 *cert;
	int64_t expires;	/* s since the epoch */
	uint64_t used;		/* last use, for eviction */
};

struct netd_tls {
	SSL_CTX *server;	/* to the guest: a minted leaf per name */
	SSL_CTX *client;	/* to the real servers: verified, never otherwise */
	X509 *ca_cert;
	EVP_PKEY *ca_key;
	EVP_PKEY *leaf_key;	/* one EC P-256 key for every leaf */
	int64_t ca_end;		/* s: the CA's notAfter */
	struct leaf leaves[NETD_LEAVES];
	uint64_t clock;
};

/* The leaf for name: cached, or minted now (evicting the least recently
 * used). Borrowed: valid until the next call. NULL on failure
 * (OpenSSL's queue says why). */
X509 *leaf_for(struct netd_tls *t, const char *name);

#endif
