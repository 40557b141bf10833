/* Fuzz target for the MANIFEST parser (cap_tree_parse, src/tree/tree.c):
 * the input is manifest text as a guest's agent sends it for a diff, a
 * merge or a workspace (hostile).
 * Checked for a manifest that parses: every path is one cap_tree_path_ok
 * takes, the entries are sorted and unique, each entry's parent is
 * listed before it as a directory, a link's size is its target's length,
 * a directory or special file has size 0, the byte total is the sum of
 * the file sizes; formatted again (cap_tree_format) it parses back to
 * the same entries; it differs from itself in nothing (cap_tree_diff).
 * A refusal names its rule (a message). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "err.h"
#include "fuzz.h"
#include "tree.h"

static void check_tree(const struct cap_tree *t)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct cap_tree_entry *e = &t->v[i];
		FUZZ_CHECK(cap_tree_path_ok(e->path), "entry %zu: path %.200s", i, e->path);
		FUZZ_CHECK(i == 0 || strcmp(t->v[i - 1].path, e->path) < 0, "entry %zu out of order: %.200s", i, e->path);
		FUZZ_CHECK(e->type == CAP_TREE_FILE || e->type == CAP_TREE_DIR || e->type == CAP_TREE_LINK ||
			   e->type == CAP_TREE_OTHER, "type %#x", (unsigned char)e->type);
		FUZZ_CHECK(e->mode <= 07777, "mode %o", e->mode);
		FUZZ_CHECK((e->type == CAP_TREE_LINK) == (e->target != NULL), "a target for %.200s", e->path);
		if (e->type == CAP_TREE_LINK)
			FUZZ_CHECK(e->size == strlen(e->target), "a link of size %llu with a target of %zu bytes",
				   (unsigned long long)e->size, strlen(e->target));
		if (e->type == CAP_TREE_DIR || e->type == CAP_TREE_OTHER)
			FUZZ_CHECK(e->size == 0, "size %llu for %.200s", (unsigned long long)e->size, e->path);
		if (e->type == CAP_TREE_FILE)
			bytes += e->size;
		const char *slash = strrchr(e->path, '/');
		if (slash) {
			char parent[CAP_TREE_MAX_PATH + 1];
			snprintf(parent, sizeof(parent), "%.*s", (int)(slash - e->path), e->path);
			const struct cap_tree_entry *p = cap_tree_find(t, parent);
			FUZZ_CHECK(p && p->type == CAP_TREE_DIR && p < e, "%.200s without its directory", e->path);
		}
	}
	FUZZ_CHECK(bytes == t->bytes, "bytes %llu, files add up to %llu", (unsigned long long)t->bytes,
		   (unsigned long long)bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cap_tree t;
	struct cap_err err = { 0 };
	cap_tree_init(&t);
	int r = cap_tree_parse((const char *)data, size, 0, &t, &err);
	if (r < 0) {
		FUZZ_CHECK(err.msg[0], "refused (%d) without a message", r);
		return 0;
	}
	check_tree(&t);

	struct cap_buf text;
	cap_buf_init(&text);
	cap_tree_format(&t, &text);
	struct cap_tree again;
	cap_tree_init(&again);
	r = cap_tree_parse((const char *)cap_buf_head(&text), cap_buf_used(&text), 0, &again, &err);
	FUZZ_CHECK(r == 0, "the manifest formatted again does not parse: %s", err.msg);
	FUZZ_CHECK(again.n == t.n && again.bytes == t.bytes, "formatted again: %zu entries of %zu", again.n, t.n);
	for (size_t i = 0; i < t.n; i++) {
		const struct cap_tree_entry *a = &t.v[i], *b = &again.v[i];
		FUZZ_CHECK(strcmp(a->path, b->path) == 0 && cap_tree_entry_same(a, b) && a->size == b->size &&
				   (!a->target || strcmp(a->target, b->target) == 0),
			   "entry %.200s formatted again reads otherwise", a->path);
	}
	struct cap_tree_change *ch = NULL;
	size_t nch = 1;
	FUZZ_CHECK(cap_tree_diff(&t, &again, &ch, &nch) == 0 && nch == 0, "%zu changes from itself", nch);
	free(ch);
	cap_tree_fini(&again);
	cap_buf_fini(&text);
	cap_tree_fini(&t);
	return 0;
}
