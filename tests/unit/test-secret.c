/* src/net/ca.c and src/net/secret.c: the sandbox's CA, the host's trust
 * store, secrets' values and placeholders. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "ca.h"
#include "paths.h"
#include "secret.h"
#include "util.h"

struct tmp {
	char dir[64];
};

static int tmp_setup(void **state)
{
	struct tmp *t = xcalloc(1, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "/tmp/capsule-test-secret-XXXXXX");
	if (!mkdtemp(t->dir)) {
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

static int tmp_teardown(void **state)
{
	struct tmp *t = *state;
	cap_remove_tree(t->dir);
	free(t);
	unsetenv("SSL_CERT_FILE");
	unsetenv("CAPSULE_CA_FILE");
	unsetenv("CAPSULE_TEST_TOKEN");
	return 0;
}

static void write_file(const char *path, const char *text, size_t len, mode_t mode)
{
	assert_int_equal(cap_write_file_atomic(path, text, len, mode), 0);
}

static X509 *parse_cert(const char *pem)
{
	BIO *b = BIO_new_mem_buf(pem, -1);
	X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
	BIO_free(b);
	return x;
}

/* ---- the CA ------------------------------------------------------------ */

static void ca_made_then_reloaded(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca a, b;
	struct cap_err err = { 0 };
	struct stat st;
	char path[128];

	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &a, &err), 0);
	assert_non_null(strstr(a.owned_key_pem, "-----BEGIN PRIVATE KEY-----"));
	assert_non_null(strstr(a.owned_cert_pem, "-----BEGIN CERTIFICATE-----"));
	snprintf(path, sizeof(path), "%s/ca.key", t->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	snprintf(path, sizeof(path), "%s/ca.pem", t->dir);
	assert_int_equal(stat(path, &st), 0);

	/* Loaded again: the same CA, so the same placeholders. */
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &b, &err), 0);
	assert_memory_equal(a.fp, b.fp, 32);
	assert_string_equal(a.owned_cert_pem, b.owned_cert_pem);
	assert_string_equal(a.owned_key_pem, b.owned_key_pem);
	cap_net_ca_fini(&a);
	cap_net_ca_fini(&b);
	assert_null(a.owned_key_pem);
}

static void ca_is_a_ca_and_self_verifies(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca ca;
	struct cap_err err = { 0 };
	char cn[128];

	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), 0);
	X509 *x = parse_cert(ca.owned_cert_pem);
	assert_non_null(x);
	/* CA:TRUE, critical, path length 0; keyCertSign and cRLSign. */
	int crit = -1;
	BASIC_CONSTRAINTS *bc = X509_get_ext_d2i(x, NID_basic_constraints, &crit, NULL);
	assert_non_null(bc);
	assert_true(bc->ca);
	assert_int_equal(crit, 1);
	assert_non_null(bc->pathlen);
	assert_int_equal(ASN1_INTEGER_get(bc->pathlen), 0);
	BASIC_CONSTRAINTS_free(bc);
	assert_int_equal(X509_get_key_usage(x), KU_KEY_CERT_SIGN | KU_CRL_SIGN);
	assert_true(X509_check_ca(x) > 0);
	X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
	assert_string_equal(cn, "capsule CA for box");
	/* Valid now; not before a day ago (give or take the test's time). */
	assert_true(X509_cmp_current_time(X509_get0_notBefore(x)) < 0);
	assert_true(X509_cmp_current_time(X509_get0_notAfter(x)) > 0);
	/* An EC P-256 key. */
	EVP_PKEY *pub = X509_get0_pubkey(x);
	assert_true(EVP_PKEY_is_a(pub, "EC"));
	assert_int_equal(EVP_PKEY_get_bits(pub), 256);

	/* It verifies as its own trust anchor. */
	X509_STORE *store = X509_STORE_new();
	X509_STORE_add_cert(store, x);
	X509_STORE_CTX *ctx = X509_STORE_CTX_new();
	X509_STORE_CTX_init(ctx, store, x, NULL);
	assert_int_equal(X509_verify_cert(ctx), 1);
	X509_STORE_CTX_free(ctx);
	X509_STORE_free(store);
	assert_int_equal(X509_verify(x, pub), 1);

	/* The private key is the certificate's. */
	BIO *b = BIO_new_mem_buf(ca.owned_key_pem, -1);
	EVP_PKEY *key = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
	BIO_free(b);
	assert_non_null(key);
	assert_int_equal(X509_check_private_key(x, key), 1);
	EVP_PKEY_free(key);

	/* The fingerprint is SHA-256 of the DER. */
	uint8_t fp[32];
	unsigned n = 0;
	X509_digest(x, EVP_sha256(), fp, &n);
	assert_memory_equal(fp, ca.fp, 32);
	X509_free(x);
	cap_net_ca_fini(&ca);
}

static void ca_half_pair_refused(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca ca;
	struct cap_err err = { 0 };
	char key[128], cert[128];

	snprintf(key, sizeof(key), "%s/ca.key", t->dir);
	snprintf(cert, sizeof(cert), "%s/ca.pem", t->dir);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), 0);
	cap_net_ca_fini(&ca);

	/* The certificate gone: refused, naming the key that is left. */
	assert_int_equal(unlink(cert), 0);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), -EINVAL);
	assert_non_null(strstr(err.msg, key));
	assert_non_null(strstr(err.msg, "half"));
	/* Neither: a new CA. Then the key gone. */
	assert_int_equal(unlink(key), 0);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), 0);
	cap_net_ca_fini(&ca);
	assert_int_equal(unlink(key), 0);
	memset(&err, 0, sizeof(err));
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), -EINVAL);
	assert_non_null(strstr(err.msg, cert));
}

static void ca_bad_files_refused(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca ca, other;
	struct cap_err err = { 0 };
	char key[128], cert[128], d2[128];

	snprintf(key, sizeof(key), "%s/ca.key", t->dir);
	snprintf(cert, sizeof(cert), "%s/ca.pem", t->dir);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), 0);

	/* A key others may read. */
	assert_int_equal(chmod(key, 0644), 0);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &other, &err), -EPERM);
	assert_non_null(strstr(err.msg, key));
	assert_int_equal(chmod(key, 0600), 0);

	/* A certificate that is not the key's. */
	assert_int_equal(cap_net_ca_ensure(NULL, "other", &other, &err), 0);
	write_file(cert, other.owned_cert_pem, strlen(other.owned_cert_pem), 0644);
	cap_net_ca_fini(&other);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &other, &err), -EINVAL);
	assert_non_null(strstr(err.msg, cert));

	/* Garbage. */
	write_file(cert, "not a certificate\n", 18, 0644);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &other, &err), -EINVAL);
	assert_non_null(strstr(err.msg, cert));
	write_file(key, "not a key\n", 10, 0600);
	write_file(cert, ca.owned_cert_pem, strlen(ca.owned_cert_pem), 0644);
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &other, &err), -EINVAL);
	assert_non_null(strstr(err.msg, key));

	/* A key that is a symbolic link is not followed. */
	write_file(key, ca.owned_key_pem, strlen(ca.owned_key_pem), 0600);
	snprintf(d2, sizeof(d2), "%s/real.key", t->dir);
	assert_int_equal(rename(key, d2), 0);
	assert_int_equal(symlink(d2, key), 0);
	assert_true(cap_net_ca_ensure(t->dir, "box", &other, &err) < 0);
	assert_non_null(strstr(err.msg, key));

	/* A directory that does not exist: an error naming the key. */
	snprintf(d2, sizeof(d2), "%s/missing", t->dir);
	assert_int_equal(cap_net_ca_ensure(d2, "box", &other, &err), -ENOENT);
	assert_non_null(strstr(err.msg, d2));
	cap_net_ca_fini(&ca);
}

static void ca_in_memory(void **state)
{
	(void)state;
	struct cap_net_ca a, b;
	struct cap_err err = { 0 };

	assert_int_equal(cap_net_ca_ensure(NULL, "run", &a, &err), 0);
	assert_int_equal(cap_net_ca_ensure(NULL, "run", &b, &err), 0);
	/* A new CA each time: its own key, its own fingerprint. */
	assert_memory_not_equal(a.fp, b.fp, 32);
	assert_string_not_equal(a.owned_key_pem, b.owned_key_pem);
	X509 *x = parse_cert(a.owned_cert_pem);
	assert_non_null(x);
	assert_true(X509_check_ca(x) > 0);
	X509_free(x);
	cap_net_ca_fini(&a);
	cap_net_ca_fini(&b);
	/* A label too long for a common name is cut, not refused. */
	assert_int_equal(cap_net_ca_ensure(NULL, "a-sandbox-name-that-is-quite-long-indeed-0123456789", &a, &err), 0);
	cap_net_ca_fini(&a);
}

/* ---- the trust store -------------------------------------------------- */

static void trust_default_and_extra(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca c1, c2;
	struct cap_err err = { 0 };
	char f1[128], f2[128];
	char *pem = NULL;
	size_t len = 0;

	assert_int_equal(cap_net_ca_ensure(NULL, "one", &c1, &err), 0);
	assert_int_equal(cap_net_ca_ensure(NULL, "two", &c2, &err), 0);
	snprintf(f1, sizeof(f1), "%s/default.pem", t->dir);
	snprintf(f2, sizeof(f2), "%s/extra.pem", t->dir);
	/* No final newline: the two are still separate in the result. */
	write_file(f1, c1.owned_cert_pem, strlen(c1.owned_cert_pem) - 1, 0644);
	write_file(f2, c2.owned_cert_pem, strlen(c2.owned_cert_pem), 0644);

	setenv("SSL_CERT_FILE", f1, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), 0);
	assert_int_equal(len, strlen(pem));
	assert_string_equal(pem, c1.owned_cert_pem);
	free(pem);

	setenv("CAPSULE_CA_FILE", f2, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), 0);
	assert_non_null(strstr(pem, c1.owned_cert_pem));
	assert_non_null(strstr(pem, c2.owned_cert_pem));
	/* Both parse out of it. */
	BIO *b = BIO_new_mem_buf(pem, (int)len);
	int n = 0;
	X509 *x;
	while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
		X509_free(x);
		n++;
	}
	ERR_clear_error();
	BIO_free(b);
	assert_int_equal(n, 2);
	free(pem);
	cap_net_ca_fini(&c1);
	cap_net_ca_fini(&c2);
}

static void trust_missing_files(void **state)
{
	struct tmp *t = *state;
	struct cap_net_ca c;
	struct cap_err err = { 0 };
	char missing[128], empty[128], good[128];
	char *pem = NULL;
	size_t len = 0;

	snprintf(missing, sizeof(missing), "%s/missing.pem", t->dir);
	snprintf(empty, sizeof(empty), "%s/empty.pem", t->dir);
	snprintf(good, sizeof(good), "%s/good.pem", t->dir);
	write_file(empty, "no certificate here\n", 20, 0644);
	assert_int_equal(cap_net_ca_ensure(NULL, "x", &c, &err), 0);
	write_file(good, c.owned_cert_pem, strlen(c.owned_cert_pem), 0644);

	/* SSL_CERT_FILE named but missing: an error naming it. */
	setenv("SSL_CERT_FILE", missing, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), -ENOENT);
	assert_non_null(strstr(err.msg, missing));
	assert_non_null(strstr(err.msg, "SSL_CERT_FILE"));

	/* A default file without certificates and no extra one. */
	setenv("SSL_CERT_FILE", empty, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), -ENOENT);
	assert_non_null(strstr(err.msg, empty));

	/* The extra file alone is enough. */
	setenv("CAPSULE_CA_FILE", good, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), 0);
	assert_string_equal(pem, c.owned_cert_pem);
	free(pem);

	/* An extra file that is missing or holds nothing: an error naming it. */
	setenv("SSL_CERT_FILE", good, 1);
	setenv("CAPSULE_CA_FILE", missing, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), -ENOENT);
	assert_non_null(strstr(err.msg, missing));
	assert_non_null(strstr(err.msg, "CAPSULE_CA_FILE"));
	setenv("CAPSULE_CA_FILE", empty, 1);
	assert_int_equal(cap_net_trust_load(&pem, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, empty));
	cap_net_ca_fini(&c);
}

/* ---- values ------------------------------------------------------------- */

static struct cap_net_secret decl(const char *name, const char *source)
{
	struct cap_net_secret s = { 0 };
	snprintf(s.name, sizeof(s.name), "%s", name);
	snprintf(s.source, sizeof(s.source), "%s", source);
	s.hosts[0].kind = CAP_NET_SECRET_HOST;
	snprintf(s.hosts[0].name, sizeof(s.hosts[0].name), "api.test");
	s.nhosts = 1;
	return s;
}

static void value_from_env(void **state)
{
	(void)state;
	struct cap_net_secret s = decl("TOKEN", "env:CAPSULE_TEST_TOKEN");
	struct cap_err err = { 0 };
	char *v = NULL;
	size_t len = 0;

	setenv("CAPSULE_TEST_TOKEN", "ghp_realvalue123", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	assert_int_equal(len, 16);
	assert_memory_equal(v, "ghp_realvalue123", 16);
	cap_net_secret_wipe(v, len);

	/* Unset: the message the user of `capsule start` sees. */
	unsetenv("CAPSULE_TEST_TOKEN");
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -ENOENT);
	assert_string_equal(err.msg,
			    "secret TOKEN: environment variable CAPSULE_TEST_TOKEN is not set "
			    "(--secret TOKEN=env:CAPSULE_TEST_TOKEN@api.test); set it in the environment "
			    "of the command that starts the sandbox");
}

static void value_from_file(void **state)
{
	struct tmp *t = *state;
	struct cap_err err = { 0 };
	char path[128], link[160], src[200];
	char *v = NULL;
	size_t len = 0;

	snprintf(path, sizeof(path), "%s/token", t->dir);
	snprintf(src, sizeof(src), "file:%s", path);
	struct cap_net_secret s = decl("GH", src);

	write_file(path, "secret-file-value\n", 18, 0600);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	assert_int_equal(len, 17);
	assert_memory_equal(v, "secret-file-value", 17);
	assert_int_equal(v[len], '\0');
	cap_net_secret_wipe(v, len);

	/* One "\r\n" goes; no line end at all is fine too. */
	write_file(path, "secret-file-value\r\n", 19, 0600);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	assert_int_equal(len, 17);
	cap_net_secret_wipe(v, len);
	write_file(path, "secret-file-value", 17, 0600);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	assert_int_equal(len, 17);
	cap_net_secret_wipe(v, len);

	/* Through a symbolic link (a token kept by a dotfiles manager). */
	snprintf(link, sizeof(link), "%s/link", t->dir);
	assert_int_equal(symlink(path, link), 0);
	snprintf(src, sizeof(src), "file:%s", link);
	struct cap_net_secret sl = decl("GH", src);
	assert_int_equal(cap_net_secret_value(&sl, &v, &len, &err), 0);
	assert_int_equal(len, 17);
	cap_net_secret_wipe(v, len);

	/* A directory, a FIFO: not regular files (and never waited on). */
	snprintf(src, sizeof(src), "file:%s", t->dir);
	struct cap_net_secret sd = decl("GH", src);
	assert_int_equal(cap_net_secret_value(&sd, &v, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "not a regular file"));
	snprintf(link, sizeof(link), "%s/fifo", t->dir);
	assert_int_equal(mkfifo(link, 0600), 0);
	snprintf(src, sizeof(src), "file:%s", link);
	struct cap_net_secret sf = decl("GH", src);
	assert_int_equal(cap_net_secret_value(&sf, &v, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, link));

	/* Missing: named, with the secret. */
	snprintf(link, sizeof(link), "%s/missing", t->dir);
	snprintf(src, sizeof(src), "file:%s", link);
	struct cap_net_secret sm = decl("GH", src);
	assert_int_equal(cap_net_secret_value(&sm, &v, &len, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "secret GH"));
	assert_non_null(strstr(err.msg, link));
}

static void value_bounds_and_bytes(void **state)
{
	struct tmp *t = *state;
	struct cap_err err = { 0 };
	struct cap_net_secret s = decl("TOKEN", "env:CAPSULE_TEST_TOKEN");
	char *v = NULL;
	size_t len = 0;

	/* Too short, empty: refused without the value in the message. */
	setenv("CAPSULE_TEST_TOKEN", "short", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	assert_null(strstr(err.msg, "short\""));
	assert_non_null(strstr(err.msg, "too short"));
	setenv("CAPSULE_TEST_TOKEN", "", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "empty"));
	/* Exactly the bounds. */
	setenv("CAPSULE_TEST_TOKEN", "12345678", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	cap_net_secret_wipe(v, len);
	char *big = xmalloc(CAP_NET_SECRET_VALUE_MAX + 2);
	memset(big, 'a', CAP_NET_SECRET_VALUE_MAX + 1);
	big[CAP_NET_SECRET_VALUE_MAX] = '\0';
	setenv("CAPSULE_TEST_TOKEN", big, 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	assert_int_equal(len, CAP_NET_SECRET_VALUE_MAX);
	cap_net_secret_wipe(v, len);
	big[CAP_NET_SECRET_VALUE_MAX] = 'a';
	big[CAP_NET_SECRET_VALUE_MAX + 1] = '\0';
	setenv("CAPSULE_TEST_TOKEN", big, 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -E2BIG);
	/* A file too large, also with its line end. */
	char path[128], src[160];
	snprintf(path, sizeof(path), "%s/big", t->dir);
	snprintf(src, sizeof(src), "file:%s", path);
	struct cap_net_secret sf = decl("BIG", src);
	write_file(path, big, CAP_NET_SECRET_VALUE_MAX + 1, 0600);
	assert_int_equal(cap_net_secret_value(&sf, &v, &len, &err), -E2BIG);
	big[CAP_NET_SECRET_VALUE_MAX] = '\n';
	write_file(path, big, CAP_NET_SECRET_VALUE_MAX + 1, 0600);
	assert_int_equal(cap_net_secret_value(&sf, &v, &len, &err), 0);
	assert_int_equal(len, CAP_NET_SECRET_VALUE_MAX);
	cap_net_secret_wipe(v, len);
	free(big);

	/* Control characters: a line end inside, a tab, DEL, NUL (file). */
	setenv("CAPSULE_TEST_TOKEN", "abcd\r\nX-Evil: 1", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "control character at byte 5"));
	assert_null(strstr(err.msg, "Evil"));
	setenv("CAPSULE_TEST_TOKEN", "abcd\tefghij", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	setenv("CAPSULE_TEST_TOKEN", "abcdefgh\x7f", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	write_file(path, "abcd\0efghij\n", 12, 0600);
	assert_int_equal(cap_net_secret_value(&sf, &v, &len, &err), -EINVAL);
	write_file(path, "abcdefgh\n\n", 10, 0600);
	assert_int_equal(cap_net_secret_value(&sf, &v, &len, &err), -EINVAL);

	/* A placeholder is never a value (a variable set inside a sandbox). */
	char ph[CAP_NET_PLACEHOLDER_LEN + 1];
	uint8_t fp[32] = { 1 };
	cap_net_secret_placeholder(fp, "TOKEN", ph);
	setenv("CAPSULE_TEST_TOKEN", ph, 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "placeholder"));
	assert_null(strstr(err.msg, ph));
	char wrapped[128];
	snprintf(wrapped, sizeof(wrapped), "Bearer %s", ph);
	setenv("CAPSULE_TEST_TOKEN", wrapped, 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), -EINVAL);

	/* Non-ASCII bytes and spaces are fine (header values take them). */
	setenv("CAPSULE_TEST_TOKEN", "Bearer t\xc3\xa9st-value", 1);
	assert_int_equal(cap_net_secret_value(&s, &v, &len, &err), 0);
	cap_net_secret_wipe(v, len);
	cap_net_secret_wipe(NULL, 0);
}

static void env_source_forgotten(void **state)
{
	(void)state;
	struct cap_net_secret s = decl("TOKEN", "env:CAPSULE_TEST_TOKEN");
	struct cap_net_secret f = decl("TOKEN", "file:/nonexistent");

	setenv("CAPSULE_TEST_TOKEN", "ghp_realvalue123", 1);
	char *where = getenv("CAPSULE_TEST_TOKEN");
	cap_net_secret_forget_source(&s);
	assert_null(getenv("CAPSULE_TEST_TOKEN"));
	/* The bytes themselves are gone, not only the variable. */
	for (size_t i = 0; i < 16; i++)
		assert_int_equal(where[i], 0);
	/* Unset already, or a file: nothing happens. */
	cap_net_secret_forget_source(&s);
	cap_net_secret_forget_source(&f);
}

/* ---- placeholders ------------------------------------------------------- */

static void placeholder_shape(void **state)
{
	(void)state;
	uint8_t fp1[32], fp2[32];
	char a[CAP_NET_PLACEHOLDER_LEN + 1], b[CAP_NET_PLACEHOLDER_LEN + 1];

	memset(fp1, 0x11, sizeof(fp1));
	memset(fp2, 0x11, sizeof(fp2));
	fp2[31] = 0x12;
	cap_net_secret_placeholder(fp1, "TOKEN", a);
	assert_int_equal(strlen(a), CAP_NET_PLACEHOLDER_LEN);
	assert_int_equal(strncmp(a, CAP_NET_PLACEHOLDER_PREFIX, strlen(CAP_NET_PLACEHOLDER_PREFIX)), 0);
	for (size_t i = strlen(CAP_NET_PLACEHOLDER_PREFIX); i < CAP_NET_PLACEHOLDER_LEN; i++)
		assert_non_null(strchr("0123456789abcdef", a[i]));
	/* Stable. */
	cap_net_secret_placeholder(fp1, "TOKEN", b);
	assert_string_equal(a, b);
	/* Another CA (another sandbox), another name: another placeholder. */
	cap_net_secret_placeholder(fp2, "TOKEN", b);
	assert_string_not_equal(a, b);
	cap_net_secret_placeholder(fp1, "TOKEN2", b);
	assert_string_not_equal(a, b);
	cap_net_secret_placeholder(fp1, "TOKE", b);
	assert_string_not_equal(a, b);
	/* Fixed length whatever the name. */
	cap_net_secret_placeholder(fp1, "A", b);
	assert_int_equal(strlen(b), CAP_NET_PLACEHOLDER_LEN);
	/* A known answer, so that a change of the derivation is noticed
	 * (it would change every named sandbox's placeholders). */
	uint8_t zero[32] = { 0 };
	cap_net_secret_placeholder(zero, "TOKEN", a);
	assert_string_equal(a, "capsule-ph-ac91f6df26d8730d34b0cd05fee39668bef32197");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(ca_made_then_reloaded, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(ca_is_a_ca_and_self_verifies, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(ca_half_pair_refused, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(ca_bad_files_refused, tmp_setup, tmp_teardown),
		cmocka_unit_test(ca_in_memory),
		cmocka_unit_test_setup_teardown(trust_default_and_extra, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(trust_missing_files, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(value_from_env, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(value_from_file, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(value_bounds_and_bytes, tmp_setup, tmp_teardown),
		cmocka_unit_test_setup_teardown(env_source_forgotten, tmp_setup, tmp_teardown),
		cmocka_unit_test(placeholder_shape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
