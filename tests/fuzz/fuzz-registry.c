/* Fuzz target for a registry's documents as `image check` and pull's
 * progress decode them (src/store/store-registry.c: cap_reg_manifest_parse,
 * cap_reg_config_parse, cap_reg_index_pick, cap_reg_manifest_media_ok):
 * the bytes a registry serves for a reference (hostile). The input is
 * one or two documents separated by a line "##"; each is decoded as a
 * manifest and as a config.
 * Checked for a manifest that decodes: its media type is one of the
 * four taken; an index has no layers, at most CAP_REG_ENTRIES_MAX
 * entries, each with a valid digest, a size within 2^53 and a media
 * type; a pick for linux/amd64 is an image manifest for exactly that,
 * and a refusal of it names what the index offers; an image manifest
 * has no entries, a valid config digest, at most CAP_REG_LAYERS_MAX
 * layers whose sizes add up to layers_size; media_ok is 0 or
 * -EMEDIUMTYPE. For a config: os and architecture of 1 to 31 bytes, no
 * strings in a list it does not have. Every refusal has a message. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "fuzz.h"
#include "store.h"

#define TAKEN(m) (strcmp(m, "application/vnd.oci.image.manifest.v1+json") == 0 ||                  \
		  strcmp(m, "application/vnd.oci.image.index.v1+json") == 0 ||                     \
		  strcmp(m, "application/vnd.docker.distribution.manifest.v2+json") == 0 ||         \
		  strcmp(m, "application/vnd.docker.distribution.manifest.list.v2+json") == 0)

static bool digest_ok(const char *d)
{
	return strlen(d) == 71 && strncmp(d, "sha256:", 7) == 0 && strspn(d + 7, "0123456789abcdef") == 64;
}

static void manifest(const uint8_t *p, size_t n)
{
	struct cap_reg_manifest m;
	struct cap_err err = { 0 };
	int r = cap_reg_manifest_parse(p, n, &m, &err);
	if (r < 0) {
		FUZZ_CHECK(err.msg[0], "manifest refused (%d) without a message", r);
		return;
	}
	FUZZ_CHECK(m.owned_media_type && TAKEN(m.owned_media_type), "media type %.100s taken",
		   m.owned_media_type ? m.owned_media_type : "(none)");
	if (m.index) {
		FUZZ_CHECK(m.n_layers == 0 && m.n_entries <= CAP_REG_ENTRIES_MAX, "index with %zu layers, %zu entries",
			   m.n_layers, m.n_entries);
		for (size_t i = 0; i < m.n_entries; i++) {
			const struct cap_reg_entry *e = &m.owned_entries[i];
			FUZZ_CHECK(digest_ok(e->digest) && e->size <= (1ull << 53) && e->owned_media_type,
				   "entry %zu: %s %llu", i, e->digest, (unsigned long long)e->size);
		}
		size_t w;
		memset(&err, 0, sizeof(err));
		r = cap_reg_index_pick(&m, "linux", "amd64", NULL, &w, &err);
		if (r == 0) {
			const struct cap_reg_entry *e = &m.owned_entries[w];
			FUZZ_CHECK(w < m.n_entries && e->owned_os && strcmp(e->owned_os, "linux") == 0 && e->owned_arch &&
				   strcmp(e->owned_arch, "amd64") == 0 && TAKEN(e->owned_media_type) &&
				   !strstr(e->owned_media_type, "index") && !strstr(e->owned_media_type, "list"),
				   "picked entry %zu for linux/amd64", w);
		} else {
			FUZZ_CHECK(r == -ENOEXEC && strstr(err.msg, "it offers"), "pick refused (%d): %s", r, err.msg);
		}
	} else {
		FUZZ_CHECK(m.n_entries == 0 && m.n_layers <= CAP_REG_LAYERS_MAX && digest_ok(m.config_digest) &&
			   m.owned_config_media_type, "manifest: %zu entries, %zu layers, config %s", m.n_entries,
			   m.n_layers, m.config_digest);
		uint64_t sum = 0;
		for (size_t i = 0; i < m.n_layers; i++) {
			FUZZ_CHECK(digest_ok(m.owned_layers[i].digest) && m.owned_layers[i].size <= (1ull << 53) &&
				   m.owned_layers[i].owned_media_type, "layer %zu", i);
			sum += m.owned_layers[i].size;
		}
		FUZZ_CHECK(sum == m.layers_size, "layers add up to %llu, not %llu", (unsigned long long)sum,
			   (unsigned long long)m.layers_size);
	}
	memset(&err, 0, sizeof(err));
	r = cap_reg_manifest_media_ok(&m, &err);
	FUZZ_CHECK(r == 0 || (r == -EMEDIUMTYPE && err.msg[0]), "media_ok %d: %s", r, err.msg);
	cap_reg_manifest_fini(&m);
}

static void config(const uint8_t *p, size_t n)
{
	struct cap_reg_config c;
	struct cap_err err = { 0 };
	int r = cap_reg_config_parse(p, n, &c, &err);
	if (r < 0) {
		FUZZ_CHECK(err.msg[0], "config refused (%d) without a message", r);
		return;
	}
	FUZZ_CHECK(c.owned_os && c.owned_arch && *c.owned_os && *c.owned_arch && strlen(c.owned_os) <= 31 &&
		   strlen(c.owned_arch) <= 31, "config os/arch");
	FUZZ_CHECK((c.has_entrypoint || c.n_entrypoint == 0) && (c.has_cmd || c.n_cmd == 0) && (c.has_env || c.n_env == 0),
		   "strings in a list the config does not have");
	for (size_t i = 0; i < c.n_env; i++)
		FUZZ_CHECK(c.owned_env[i], "env %zu", i);
	cap_reg_config_fini(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *sep = size >= 4 ? memmem(data, size, "\n##\n", 4) : NULL;
	size_t n1 = sep ? (size_t)(sep - data) : size;
	manifest(data, n1);
	config(data, n1);
	if (sep) {
		manifest(sep + 4, size - n1 - 4);
		config(sep + 4, size - n1 - 4);
	}
	return 0;
}
