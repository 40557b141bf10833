/* Fuzz target for an image's JSON (src/store: the OCI index, image
 * manifest and config, docker save's manifest.json), as import and pull
 * read them from an archive or a layout (a registry's or an archive's
 * author is untrusted). The input is up to five documents separated by
 * a line "##": the first is written as index.json and as manifest.json,
 * the others as blobs under their digests and as files p1..p4. "@1" to
 * "@4" in a document become the digest of that later document (computed
 * from the last to the first, so the chain index -> manifest -> config
 * and layers can be made of checked blobs). Then the layer lists of
 * the layout and of the docker directory, and the platform's manifest.
 * Checked: every layer named is a regular file inside the directory
 * (its real path under the directory's); a manifest digest is
 * sha256:<64 hex>; a refusal says why. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "err.h"
#include "fuzz.h"
#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "util.h"

#define PARTS 5

static char *dir, *real_dir;

static void put(const char *rel, const void *p, size_t n)
{
	char *path = xasprintf("%s/%s", dir, rel);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FUZZ_CHECK(fd >= 0 && cap_write_all(fd, p, n) == 0, "cannot write %s", path);
	close(fd);
	free(path);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	dir = xasprintf("%s/fuzz-image.XXXXXX", tmp && *tmp ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	FUZZ_CHECK(mkdtemp(dir), "mkdtemp %s", dir);
	char *blobs = xasprintf("%s/blobs", dir), *sha = xasprintf("%s/blobs/sha256", dir);
	FUZZ_CHECK(mkdir(blobs, 0755) == 0 && mkdir(sha, 0755) == 0, "mkdir %s", sha);
	free(blobs);
	free(sha);
	put("oci-layout", "{\"imageLayoutVersion\": \"1.0.0\"}", 31);
	real_dir = realpath(dir, NULL);
}

static void check_layers(const char *how, int r, char **layers, size_t n, const struct cap_err *err)
{
	if (r < 0)
		FUZZ_CHECK(err->msg[0], "%s refused (%d) without a message", how, r);
	for (size_t i = 0; layers && i < n; i++) {
		if (!layers[i]) {
			FUZZ_CHECK(r < 0, "%s: layer %zu missing", how, i);
			continue;
		}
		size_t dl = strlen(dir);
		FUZZ_CHECK(strncmp(layers[i], dir, dl) == 0 && layers[i][dl] == '/', "%s: layer %s outside %s", how,
			   layers[i], dir);
		struct stat st;
		FUZZ_CHECK(lstat(layers[i], &st) == 0 && S_ISREG(st.st_mode), "%s: layer %s not a file", how, layers[i]);
		char *real = realpath(layers[i], NULL);
		FUZZ_CHECK(real && strncmp(real, real_dir, strlen(real_dir)) == 0 && real[strlen(real_dir)] == '/',
			   "%s: layer %s is really %s", how, layers[i], real ? real : "(nothing)");
		free(real);
		free(layers[i]);
	}
	free(layers);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!dir)
		setup();
	/* The documents. */
	const uint8_t *part[PARTS];
	size_t plen[PARTS], np = 0;
	for (const uint8_t *p = data, *end = data + size; np < PARTS;) {
		const uint8_t *sep = np + 1 < PARTS && end > p ? memmem(p, (size_t)(end - p), "\n##\n", 4) : NULL;
		part[np] = p;
		plen[np++] = sep ? (size_t)(sep - p) : (size_t)(end - p);
		if (!sep)
			break;
		p = sep + 4;
	}
	/* "@k" becomes document k's digest, the last document first. */
	struct cap_buf doc[PARTS];
	char digest[PARTS][72];
	for (size_t k = np; k-- > 0;) {
		cap_buf_init(&doc[k]);
		for (size_t i = 0; i < plen[k]; i++) {
			size_t ref = i + 1 < plen[k] && part[k][i] == '@' ? (size_t)(part[k][i + 1] - '0') : 0;
			if (ref > k && ref < np) {
				cap_buf_append(&doc[k], digest[ref], 71);
				i++;
			} else {
				cap_buf_append(&doc[k], part[k] + i, 1);
			}
		}
		struct cap_sha256 h;
		char hex[65];
		cap_sha256_init(&h);
		cap_sha256_update(&h, cap_buf_head(&doc[k]), cap_buf_used(&doc[k]));
		cap_sha256_final_hex(&h, hex);
		snprintf(digest[k], sizeof(digest[k]), "sha256:%s", hex);
	}
	char *names[PARTS][2];
	for (size_t k = 0; k < np; k++) {
		const void *p = cap_buf_used(&doc[k]) ? (const void *)cap_buf_head(&doc[k]) : "";
		size_t n = cap_buf_used(&doc[k]);
		if (k == 0) {
			names[k][0] = xstrdup("index.json");
			names[k][1] = xstrdup("manifest.json");
		} else {
			names[k][0] = xasprintf("blobs/sha256/%s", digest[k] + 7);
			names[k][1] = xasprintf("p%zu", k);
		}
		put(names[k][0], p, n);
		put(names[k][1], p, n);
	}

	char **layers = NULL;
	size_t n = 0;
	struct cap_err err = { 0 };
	int r = cap_store_oci_layers(dir, &layers, &n, &err);
	check_layers("the layout", r, layers, n, &err);
	layers = NULL;
	n = 0;
	memset(&err, 0, sizeof(err));
	r = cap_store_docker_layers(dir, &layers, &n, &err);
	check_layers("the docker directory", r, layers, n, &err);

	char *m = NULL;
	memset(&err, 0, sizeof(err));
	r = cap_store_layout_manifest(dir, "linux", "amd64", &m, &err);
	if (r == 0) {
		FUZZ_CHECK(m && strlen(m) == 71 && strncmp(m, "sha256:", 7) == 0 &&
				   strspn(m + 7, "0123456789abcdef") == 64,
			   "a manifest digest %s", m ? m : "(none)");
		free(m);
	} else {
		FUZZ_CHECK(err.msg[0], "the manifest refused (%d) without a message", r);
	}

	for (size_t k = 0; k < np; k++) {
		for (int j = 0; j < 2; j++) {
			char *path = xasprintf("%s/%s", dir, names[k][j]);
			unlink(path);
			free(path);
			free(names[k][j]);
		}
		cap_buf_fini(&doc[k]);
	}
	return 0;
}

__attribute__((destructor)) static void at_end(void)
{
	if (dir)
		cap_remove_tree(dir);
}
