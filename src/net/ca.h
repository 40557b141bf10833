/* A sandbox's certificate authority, for the policy process to
 * intercept the HTTPS connections that carry secrets (docs/network.md),
 * and the host's trust store it verifies the real servers against.
 * OpenSSL (libcrypto); the only files touched are the ones named. */
#ifndef CAP_NET_CA_H
#define CAP_NET_CA_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/types.h>

#include "err.h"

struct cap_net_ca {
	char *owned_key_pem;	/* PKCS#8, unencrypted: the policy process's only */
	char *owned_cert_pem;	/* given to the guest's trust store */
	uint8_t fp[32];		/* SHA-256 of the certificate (DER) */
};

/* With dir: load dir/ca.key and dir/ca.pem, or make them when neither
 * exists (the key 0600, written atomically; a half pair is an error
 * naming the file). With dir NULL: a new CA kept in memory only (a
 * one-shot run). An EC P-256 key; a self-signed certificate with
 * CA:TRUE (critical, path length 0), keyCertSign and cRLSign, valid from
 * a day ago for ten years, its common name "capsule CA for LABEL". */
int cap_net_ca_ensure(const char *dir, const char *label, struct cap_net_ca *out,
		      struct cap_err *err);
/* Wipe the key and free everything. */
void cap_net_ca_fini(struct cap_net_ca *ca);

/* PEM text in memory (NUL-terminated; a password is never asked): its
 * first private key or certificate, NULL when it holds none (OpenSSL's
 * error queue then says why). The caller frees the result. */
EVP_PKEY *cap_net_pem_key(const char *pem);
X509 *cap_net_pem_cert(const char *pem);
/* The certificates of a PEM bundle of len bytes, added to store; with
 * store NULL only looked for, the first one ending the search. Returns
 * how many were found. OpenSSL's error queue is left empty. */
unsigned cap_net_pem_certs(const char *pem, size_t len, X509_STORE *store);

/* The certificates the real servers are verified against, as PEM text:
 * OpenSSL's default file (SSL_CERT_FILE when set, else
 * /usr/lib/ssl/cert.pem, Debian's /etc/ssl/certs/ca-certificates.crt),
 * and the file CAPSULE_CA_FILE names when set (an extra CA: a private
 * registry's, a test's). *pem is new. -ENOENT naming the file when
 * neither holds a certificate; an unreadable CAPSULE_CA_FILE is an
 * error naming it. */
int cap_net_trust_load(char **pem, size_t *len, struct cap_err *err);

#endif
