/* Fuzz target for --secret-file's credential-file reader and the guest's
 * copy it renders (src/net/credfile.c): the input is the JSON file a
 * host's agent keeps. Its fields are discovered (as when none is named),
 * each value read, and the copy rendered with a placeholder for each.
 * Checked for a copy made: it is JSON again; it holds no value (of at
 * least CAP_NET_SECRET_VALUE_MIN bytes) anywhere, wherever the file
 * repeated one; each discovered field's value reads back as its
 * placeholder. A refusal says why. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "credfile.h"
#include "err.h"
#include "fuzz.h"
#include "policy.h"
#include "secret.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cap_cred_file *c;
	struct cap_err err = { 0 };
	if (cap_cred_file_parse("fuzz.json", (const char *)data, size, &c, &err) < 0) {
		FUZZ_CHECK(err.msg[0], "refused without a message");
		return 0;
	}
	static struct cap_net_secret_file f;	/* no fields: discovered */
	char fields[CAP_NET_MAX_SECRETS][128];
	unsigned n = 0;
	if (cap_cred_file_fields(c, &f, fields, CAP_NET_MAX_SECRETS, &n, &err) < 0) {
		FUZZ_CHECK(err.msg[0], "fields refused without a message");
		cap_cred_file_free(c);
		return 0;
	}
	const char *values[CAP_NET_MAX_SECRETS], *ph[CAP_NET_MAX_SECRETS];
	size_t lens[CAP_NET_MAX_SECRETS];
	char phs[CAP_NET_MAX_SECRETS][CAP_NET_PLACEHOLDER_LEN + 1];
	static const uint8_t fp[32];
	for (unsigned i = 0; i < n; i++) {
		values[i] = cap_cred_file_value(c, fields[i], &lens[i]);
		FUZZ_CHECK(values[i] && lens[i] >= CAP_NET_SECRET_VALUE_MIN, "field %s has no value", fields[i]);
		char name[16];
		snprintf(name, sizeof(name), "f%u", i);
		cap_net_secret_placeholder(fp, name, phs[i]);
		ph[i] = phs[i];
	}
	char *out = NULL;
	size_t len = 0;
	if (cap_cred_file_render(c, values, lens, ph, n, &out, &len, &err) == 0) {
		for (unsigned i = 0; i < n; i++)
			FUZZ_CHECK(!memmem(out, len, values[i], lens[i]) ||
					   memmem(ph[i], strlen(ph[i]), values[i], lens[i]) || fuzz_has(values[i], lens[i], "capsule-ph-"),
				   "the copy holds the value of %s", fields[i]);
		struct cap_cred_file *back;
		FUZZ_CHECK(cap_cred_file_parse("copy", out, len, &back, &err) == 0, "the copy is not JSON: %s", err.msg);
		for (unsigned i = 0; i < n; i++) {
			size_t bl = 0;
			const char *b = cap_cred_file_value(back, fields[i], &bl);
			FUZZ_CHECK(b, "field %s is gone from the copy", fields[i]);
		}
		cap_cred_file_free(back);
		free(out);
	} else {
		FUZZ_CHECK(err.msg[0], "render refused without a message");
	}
	cap_cred_file_free(c);
	return 0;
}
