/* netd: the leaf certificates of TLS interception (netd-tls.h): one per
 * name the guest connects to, signed by the sandbox's CA, cached and
 * minted anew near its end. */
#include <string.h>
#include <time.h>

#include <openssl/bn.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "netd-tls.h"
#include "util.h"

static bool add_ext(X509 *x, X509V3_CTX *v, int nid, const char *value)
{
	X509_EXTENSION *ext = X509V3_EXT_nconf_nid(NULL, v, nid, value);
	bool ok = ext && X509_add_ext(x, ext, -1) == 1;

	X509_EXTENSION_free(ext);
	return ok;
}

/* subjectAltName DNS:name, built from its parts (never a string OpenSSL
 * would parse: a name can hold nothing but [A-Za-z0-9._-] anyway). */
static bool add_san(X509 *x, const char *name, bool critical)
{
	GENERAL_NAMES *gens = sk_GENERAL_NAME_new_null();
	GENERAL_NAME *g = GENERAL_NAME_new();
	ASN1_IA5STRING *s = ASN1_IA5STRING_new();
	bool ok = false;

	if (gens && g && s && ASN1_STRING_set(s, name, (int)strlen(name)) == 1) {
		GENERAL_NAME_set0_value(g, GEN_DNS, s);
		s = NULL;
		if (sk_GENERAL_NAME_push(gens, g) > 0) {
			g = NULL;
			ok = X509_add1_ext_i2d(x, NID_subject_alt_name, gens, critical, X509V3_ADD_DEFAULT) == 1;
		}
	}
	ASN1_IA5STRING_free(s);
	GENERAL_NAME_free(g);
	GENERAL_NAMES_free(gens);
	return ok;
}

/* authorityKeyIdentifier: the CA's subjectKeyIdentifier, or the SHA-1 of
 * its key when it has none (as OpenSSL computes one). */
static bool add_aki(X509 *x, X509 *ca)
{
	const ASN1_OCTET_STRING *ski = X509_get0_subject_key_id(ca);
	AUTHORITY_KEYID *akid = AUTHORITY_KEYID_new();
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	bool ok = false;

	if (!akid)
		return false;
	akid->keyid = ski ? ASN1_OCTET_STRING_dup(ski) : ASN1_OCTET_STRING_new();
	if (akid->keyid && (ski || (X509_pubkey_digest(ca, EVP_sha1(), md, &mdlen) == 1 &&
				    ASN1_OCTET_STRING_set(akid->keyid, md, (int)mdlen) == 1)))
		ok = X509_add1_ext_i2d(x, NID_authority_key_identifier, akid, 0, X509V3_ADD_DEFAULT) == 1;
	AUTHORITY_KEYID_free(akid);
	return ok;
}

/* A leaf for name, signed by the CA: NULL on failure (OpenSSL's queue
 * says why). */
static X509 *mint(struct netd_tls *t, const char *name, int64_t now, int64_t *expires)
{
	X509 *x = X509_new();
	unsigned char serial[16];
	BIGNUM *bn = NULL;
	bool ok = false;
	int64_t end = CAP_MIN(t->ca_end, now + (int64_t)NETD_LEAF_DAYS * 86400);

	if (!x || RAND_bytes(serial, sizeof(serial)) != 1)
		goto out;
	serial[0] &= 0x7f;	/* positive */
	serial[0] |= 0x40;	/* and 16 bytes long */
	bn = BN_bin2bn(serial, sizeof(serial), NULL);
	X509_NAME *subject = X509_get_subject_name(x);
	/* A common name is at most 64 bytes; a longer name is in the
	 * subjectAltName only (critical, the subject being empty). */
	bool cn = strlen(name) <= 64;
	if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) ||
	    X509_set_version(x, X509_VERSION_3) != 1 ||
	    !X509_gmtime_adj(X509_getm_notBefore(x), -LEAF_BACKDATE) ||
	    !ASN1_TIME_set(X509_getm_notAfter(x), (time_t)end) ||
	    (cn && X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, (const unsigned char *)name,
					      -1, -1, 0) != 1) ||
	    X509_set_issuer_name(x, X509_get_subject_name(t->ca_cert)) != 1 ||
	    X509_set_pubkey(x, t->leaf_key) != 1)
		goto out;
	X509V3_CTX v;
	X509V3_set_ctx(&v, t->ca_cert, x, NULL, NULL, 0);
	if (!add_ext(x, &v, NID_basic_constraints, "critical,CA:FALSE") ||
	    !add_ext(x, &v, NID_key_usage, "critical,digitalSignature") ||
	    !add_ext(x, &v, NID_ext_key_usage, "serverAuth") ||
	    !add_ext(x, &v, NID_subject_key_identifier, "hash") || !add_aki(x, t->ca_cert) ||
	    !add_san(x, name, !cn))
		goto out;
	int type = EVP_PKEY_get_base_id(t->ca_key);
	const EVP_MD *md = type == EVP_PKEY_ED25519 || type == EVP_PKEY_ED448 ? NULL : EVP_sha256();
	if (X509_sign(x, t->ca_key, md) <= 0)
		goto out;
	*expires = end;
	ok = true;
out:
	BN_free(bn);
	if (!ok) {
		X509_free(x);
		return NULL;
	}
	return x;
}

/* The leaf for name (netd-tls.h). */
X509 *leaf_for(struct netd_tls *t, const char *name)
{
	int64_t now = time(NULL);
	struct leaf *slot = NULL;

	for (unsigned i = 0; i < NETD_LEAVES; i++) {
		struct leaf *l = &t->leaves[i];
		if (l->cert && !strcmp(l->name, name)) {
			if (l->expires - LEAF_MARGIN > now) {
				l->used = ++t->clock;
				return l->cert;
			}
			slot = l;	/* about to end: minted anew in its place */
			break;
		}
		if (!slot || (slot->cert && (!l->cert || l->used < slot->used)))
			slot = l;
	}
	int64_t expires = 0;
	X509 *x = mint(t, name, now, &expires);
	if (!x)
		return NULL;
	X509_free(slot->cert);
	snprintf(slot->name, sizeof(slot->name), "%s", name);
	slot->cert = x;
	slot->expires = expires;
	slot->used = ++t->clock;
	return x;
}
