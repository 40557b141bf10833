/* A sandbox's certificate authority and the host's trust store (ca.h).
 * The key's PEM text is only ever held in buffers that are wiped before
 * they are freed (OpenSSL's secure-memory BIO, our own copies). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "ca.h"
#include "paths.h"
#include "util.h"

#define KEY_FILE "ca.key"
#define CERT_FILE "ca.pem"
/* Far more than one PEM key or certificate: anything larger is not ours. */
#define PEM_MAX 65536
/* A system bundle is ~200 KiB; a test's or a registry's CA file is small. */
#define TRUST_MAX ((size_t)16 << 20)
/* Debian's bundle, when OpenSSL's default file is not there. */
#define DEBIAN_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

/* OpenSSL's reason for the last failure, for a message; clears its queue. */
static const char *ssl_why(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();
	if (!e)
		snprintf(buf, len, "unknown OpenSSL error");
	else
		ERR_error_string_n(e, buf, len);
	ERR_clear_error();
	return buf;
}

/* Copy a memory BIO's contents into a new NUL-terminated string. */
static char *bio_text(BIO *b)
{
	char *p = NULL;
	long n = BIO_get_mem_data(b, &p);
	char *s = xmalloc((size_t)(n > 0 ? n : 0) + 1);
	if (n > 0)
		memcpy(s, p, (size_t)n);
	s[n > 0 ? n : 0] = '\0';
	return s;
}

static void wipe_free(char *s)
{
	if (s) {
		OPENSSL_cleanse(s, strlen(s));
		free(s);
	}
}

/* The key as unencrypted PKCS#8 PEM, in a new string (wipe it). */
static int key_pem(EVP_PKEY *key, char **out, struct cap_err *err)
{
	char why[256];
	/* Secure memory: its buffer is cleared when it grows and when freed. */
	BIO *b = BIO_new(BIO_s_secmem());
	if (!b || !PEM_write_bio_PrivateKey(b, key, NULL, NULL, 0, NULL, NULL)) {
		BIO_free(b);
		return cap_err_set(err, EIO, "cannot encode the CA's key: %s", ssl_why(why, sizeof(why)));
	}
	*out = bio_text(b);
	BIO_free(b);
	return 0;
}

static int cert_pem(X509 *x, char **out, struct cap_err *err)
{
	char why[256];
	BIO *b = BIO_new(BIO_s_mem());
	if (!b || !PEM_write_bio_X509(b, x)) {
		BIO_free(b);
		return cap_err_set(err, EIO, "cannot encode the CA's certificate: %s", ssl_why(why, sizeof(why)));
	}
	*out = bio_text(b);
	BIO_free(b);
	return 0;
}

static int fingerprint(X509 *x, uint8_t fp[32], struct cap_err *err)
{
	char why[256];
	unsigned n = 0;
	if (!X509_digest(x, EVP_sha256(), fp, &n) || n != 32)
		return cap_err_set(err, EIO, "cannot hash the CA's certificate: %s", ssl_why(why, sizeof(why)));
	return 0;
}

static int add_ext(X509 *x, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
	X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	if (!e)
		return -1;
	int ok = X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
	return ok ? 0 : -1;
}

/* A new EC P-256 key and its self-signed CA certificate (ca.h). */
static int make_ca(const char *label, EVP_PKEY **keyp, X509 **certp, struct cap_err *err)
{
	char why[256];
	char cn[64];
	EVP_PKEY *key = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
	X509 *x = X509_new();
	BIGNUM *serial = BN_new();
	X509_NAME *name = NULL;
	int ok = key && x && serial;

	/* A random positive 127-bit serial: distinct for every CA. */
	ok = ok && BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) &&
	     BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x));
	ok = ok && X509_set_version(x, 2);
	/* From a day ago (a guest clock a little behind still accepts it),
	 * for ten years. */
	ok = ok && X509_gmtime_adj(X509_getm_notBefore(x), -86400) &&
	     X509_time_adj_ex(X509_getm_notAfter(x), 3652, -86400, NULL);
	/* A CN is at most 64 characters. */
	snprintf(cn, sizeof(cn), "capsule CA for %s", label && *label ? label : "a sandbox");
	ok = ok && (name = X509_get_subject_name(x)) &&
	     X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1, 0) &&
	     X509_set_issuer_name(x, name);
	ok = ok && X509_set_pubkey(x, key);
	ok = ok && add_ext(x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") == 0 &&
	     add_ext(x, NID_key_usage, "critical,keyCertSign,cRLSign") == 0 &&
	     add_ext(x, NID_subject_key_identifier, "hash") == 0 &&
	     add_ext(x, NID_authority_key_identifier, "keyid:always") == 0;
	ok = ok && X509_sign(x, key, EVP_sha256()) > 0;
	BN_free(serial);
	if (!ok) {
		EVP_PKEY_free(key);
		X509_free(x);
		return cap_err_set(err, EIO, "cannot make the sandbox's CA: %s", ssl_why(why, sizeof(why)));
	}
	*keyp = key;
	*certp = x;
	return 0;
}

/* Read a whole PEM file of ours (no symlink followed, a regular file, at
 * most PEM_MAX); *out new. need_private: refuse one others may read. */
static int read_own(const char *path, bool need_private, char **out, struct cap_err *err)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
	struct stat st;
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open the sandbox's CA file %s: %s%s", path, strerror(errno),
				   errno == ELOOP ? " (a symbolic link is not accepted here)" : "");
	if (fstat(fd, &st) < 0)
		return cap_err_set(err, errno, "cannot stat %s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return cap_err_set(err, EINVAL, "the sandbox's CA file %s is not a regular file", path);
	if (need_private && (st.st_mode & 077))
		return cap_err_set(err, EPERM,
				   "the sandbox's CA key %s can be read by others (mode %04o): `chmod 600 %s` "
				   "(or remove it and " CERT_FILE " next to it to make a new CA)",
				   path, (unsigned)(st.st_mode & 07777), path);
	if (st.st_size > PEM_MAX)
		return cap_err_set(err, EFBIG, "the sandbox's CA file %s is larger than %d bytes", path, PEM_MAX);
	char *buf = xmalloc((size_t)PEM_MAX + 1);
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, (size_t)PEM_MAX + 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			OPENSSL_cleanse(buf, len);
			free(buf);
			return cap_err_set(err, e, "cannot read %s: %s", path, strerror(e));
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > PEM_MAX) {
			OPENSSL_cleanse(buf, len);
			free(buf);
			return cap_err_set(err, EFBIG, "the sandbox's CA file %s is larger than %d bytes", path, PEM_MAX);
		}
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

/* A PEM callback that never gives a password: an encrypted key fails. */
static int no_password(char *buf, int size, int rw, void *u)
{
	(void)buf, (void)size, (void)rw, (void)u;
	return 0;
}

EVP_PKEY *cap_net_pem_key(const char *pem)
{
	BIO *b = BIO_new_mem_buf(pem, -1);
	EVP_PKEY *key = b ? PEM_read_bio_PrivateKey(b, NULL, no_password, NULL) : NULL;
	BIO_free(b);
	return key;
}

X509 *cap_net_pem_cert(const char *pem)
{
	BIO *b = BIO_new_mem_buf(pem, -1);
	X509 *x = b ? PEM_read_bio_X509(b, NULL, no_password, NULL) : NULL;
	BIO_free(b);
	return x;
}

unsigned cap_net_pem_certs(const char *pem, size_t len, X509_STORE *store)
{
	BIO *b = BIO_new_mem_buf(pem, (int)CAP_MIN(len, (size_t)INT32_MAX));
	unsigned n = 0;
	X509 *x;
	while (b && (x = PEM_read_bio_X509(b, NULL, no_password, NULL)) != NULL) {
		if (!store || X509_STORE_add_cert(store, x) == 1)
			n++;
		X509_free(x);
		if (!store)
			break;
	}
	BIO_free(b);
	ERR_clear_error();	/* the end of the bundle reads as an error, so does a duplicate */
	return n;
}

/* Load dir's pair, check it belongs together, fill out. */
static int load_ca(const char *keyp, const char *certp, struct cap_net_ca *out, struct cap_err *err)
{
	char why[256];
	char *ktext = NULL, *ctext = NULL;
	EVP_PKEY *key = NULL;
	X509 *x = NULL;
	int r;

	if ((r = read_own(keyp, true, &ktext, err)) < 0)
		return r;
	if ((r = read_own(certp, false, &ctext, err)) < 0)
		goto out;
	if (!(key = cap_net_pem_key(ktext))) {
		r = cap_err_set(err, EINVAL, "%s is not a PEM private key (%s); remove it and %s to make a new CA",
				keyp, ssl_why(why, sizeof(why)), certp);
		goto out;
	}
	if (!(x = cap_net_pem_cert(ctext))) {
		r = cap_err_set(err, EINVAL, "%s is not a PEM certificate (%s); remove it and %s to make a new CA",
				certp, ssl_why(why, sizeof(why)), keyp);
		goto out;
	}
	if (X509_check_private_key(x, key) != 1) {
		ERR_clear_error();
		r = cap_err_set(err, EINVAL, "%s is not the certificate of the key %s; remove both to make a new CA",
				certp, keyp);
		goto out;
	}
	if (X509_check_ca(x) == 0) {
		r = cap_err_set(err, EINVAL, "%s is not a CA certificate; remove it and %s to make a new CA",
				certp, keyp);
		goto out;
	}
	/* Kept in the one form ca.h promises (PKCS#8), whatever was read. */
	if ((r = key_pem(key, &out->owned_key_pem, err)) < 0 ||
	    (r = cert_pem(x, &out->owned_cert_pem, err)) < 0 ||
	    (r = fingerprint(x, out->fp, err)) < 0)
		goto out;
	r = 0;
out:
	wipe_free(ktext);
	free(ctext);
	EVP_PKEY_free(key);
	X509_free(x);
	return r;
}

/* Whether path exists (as anything, a dangling link included). */
static int exists(const char *path, bool *yes, struct cap_err *err)
{
	struct stat st;
	if (lstat(path, &st) == 0) {
		*yes = true;
		return 0;
	}
	if (errno == ENOENT) {
		*yes = false;
		return 0;
	}
	return cap_err_set(err, errno, "cannot check %s: %s", path, strerror(errno));
}

int cap_net_ca_ensure(const char *dir, const char *label, struct cap_net_ca *out,
		      struct cap_err *err)
{
	struct cap_net_ca ca = { 0 };
	EVP_PKEY *key = NULL;
	X509 *x = NULL;
	int r;

	if (dir) {
		_cleanup_free_ char *keyp = xasprintf("%s/" KEY_FILE, dir);
		_cleanup_free_ char *certp = xasprintf("%s/" CERT_FILE, dir);
		bool have_key, have_cert;
		if ((r = exists(keyp, &have_key, err)) < 0 || (r = exists(certp, &have_cert, err)) < 0)
			return r;
		if (have_key && have_cert) {
			if ((r = load_ca(keyp, certp, &ca, err)) < 0) {
				cap_net_ca_fini(&ca);
				return r;
			}
			*out = ca;
			return 0;
		}
		if (have_key != have_cert)
			return cap_err_set(err, EINVAL,
					   "the sandbox's CA is half there: %s exists but %s does not; remove %s to "
					   "make a new CA (the secrets' placeholders change with it)",
					   have_key ? keyp : certp, have_key ? certp : keyp, have_key ? keyp : certp);
		if ((r = make_ca(label, &key, &x, err)) < 0)
			return r;
		if ((r = key_pem(key, &ca.owned_key_pem, err)) < 0 ||
		    (r = cert_pem(x, &ca.owned_cert_pem, err)) < 0 ||
		    (r = fingerprint(x, ca.fp, err)) < 0)
			goto fail;
		/* The key first: a certificate alone would be refused as half a
		 * pair just the same, but never without its key being safe. */
		if ((r = cap_write_file_atomic(keyp, ca.owned_key_pem, strlen(ca.owned_key_pem), 0600)) < 0) {
			r = cap_err_set(err, -r, "cannot write the sandbox's CA key %s: %s", keyp, strerror(-r));
			goto fail;
		}
		if ((r = cap_write_file_atomic(certp, ca.owned_cert_pem, strlen(ca.owned_cert_pem), 0644)) < 0) {
			r = cap_err_set(err, -r, "cannot write the sandbox's CA certificate %s: %s", certp, strerror(-r));
			unlink(keyp);
			goto fail;
		}
	} else {
		if ((r = make_ca(label, &key, &x, err)) < 0)
			return r;
		if ((r = key_pem(key, &ca.owned_key_pem, err)) < 0 ||
		    (r = cert_pem(x, &ca.owned_cert_pem, err)) < 0 ||
		    (r = fingerprint(x, ca.fp, err)) < 0)
			goto fail;
	}
	EVP_PKEY_free(key);
	X509_free(x);
	*out = ca;
	return 0;
fail:
	EVP_PKEY_free(key);
	X509_free(x);
	cap_net_ca_fini(&ca);
	return r;
}

void cap_net_ca_fini(struct cap_net_ca *ca)
{
	if (!ca)
		return;
	wipe_free(ca->owned_key_pem);
	free(ca->owned_cert_pem);
	OPENSSL_cleanse(ca, sizeof(*ca));
}

/* Read a trust file (symlinks followed: Debian's default file is one)
 * and see whether it holds a certificate (the policy process parses them
 * all, once). *text new; -errno with err naming path. */
static int read_trust(const char *path, char **text, size_t *len, bool *some,
		      struct cap_err *err)
{
	char *buf = NULL;
	ssize_t n = cap_read_file(path, TRUST_MAX, &buf);
	if (n < 0)
		return cap_err_set(err, (int)-n, "cannot read the certificate file %s: %s%s", path, strerror((int)-n),
				   n == -EFBIG ? " (larger than 16 MiB)" : "");
	*some = cap_net_pem_certs(buf, (size_t)n, NULL) > 0;
	*text = buf;
	*len = (size_t)n;
	return 0;
}

int cap_net_trust_load(char **pem, size_t *len, struct cap_err *err)
{
	const char *env = getenv(X509_get_default_cert_file_env());
	const char *extra = getenv("CAPSULE_CA_FILE");
	const char *def = env && *env ? env : X509_get_default_cert_file();
	char *dtext = NULL, *etext = NULL;
	size_t dlen = 0, elen = 0;
	bool dn = false, en = false;
	struct cap_err derr = { 0 };
	int r;

	if (extra && !*extra)
		extra = NULL;
	/* The default file: a missing one is fine when CAPSULE_CA_FILE
	 * holds the certificates (a test's fake internet); one set by
	 * SSL_CERT_FILE must be readable. */
	r = read_trust(def, &dtext, &dlen, &dn, &derr);
	if (r == -ENOENT && !(env && *env)) {
		struct cap_err e2 = { 0 };
		if (read_trust(DEBIAN_BUNDLE, &dtext, &dlen, &dn, &e2) == 0)
			r = 0;
	}
	if (r < 0 && (r != -ENOENT || (env && *env))) {
		if (env && *env)
			cap_err_prefix(&derr, "%s: ", X509_get_default_cert_file_env());
		return cap_err_set(err, derr.code, "%s", derr.msg);
	}
	if (extra) {
		if ((r = read_trust(extra, &etext, &elen, &en, err)) < 0) {
			free(dtext);
			cap_err_prefix(err, "CAPSULE_CA_FILE: ");
			return r;
		}
		if (en == 0) {
			free(dtext);
			free(etext);
			return cap_err_set(err, EINVAL, "CAPSULE_CA_FILE: %s holds no PEM certificate", extra);
		}
	}
	if (!dn && !en) {
		free(dtext);
		return cap_err_set(err, ENOENT,
				   "no certificate to verify servers against: %s %s; install the system's CA "
				   "certificates (ca-certificates) or name a PEM file with SSL_CERT_FILE or CAPSULE_CA_FILE",
				   def, dtext ? "holds no PEM certificate" : "does not exist");
	}
	/* The default's certificates (when any), then the extra file's. */
	size_t total = (dn ? dlen + 1 : 0) + (en ? elen + 1 : 0);
	char *all = xmalloc(total + 1);
	size_t o = 0;
	if (dn) {
		memcpy(all + o, dtext, dlen);
		o += dlen;
		if (dlen == 0 || dtext[dlen - 1] != '\n')
			all[o++] = '\n';
	}
	if (en) {
		memcpy(all + o, etext, elen);
		o += elen;
		if (elen == 0 || etext[elen - 1] != '\n')
			all[o++] = '\n';
	}
	all[o] = '\0';
	free(dtext);
	free(etext);
	*pem = all;
	*len = o;
	return 0;
}
