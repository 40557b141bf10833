/* Fuzz target for the QMP reader (src/engine/engine-qemu.c): a jailed
 * QEMU is untrusted, so what its monitor sends is hostile. The input
 * (after a first byte picking the line buffer's size) is the stream QEMU
 * writes: cut into messages by cap_qmp_take_line as qmp_read does, each
 * read by cap_qmp_reply as the answer awaited (events, errors, the
 * answer) and, for an answer, its value read as migration_done reads
 * query-migrate's.
 * Checked: a line taken is NUL-terminated inside its buffer, without a
 * newline; every call takes something unless it asks for more, and what
 * is left at the end is less than the buffer without a newline; an event
 * counts at most one I/O error, whose reason is NUL-terminated; an
 * answer gives its value, an error a message naming the command. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "engine-ops.h"
#include "err.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t len = 2 + (size_t)data[0] * 32;	/* 2 to 8162; QEMU's reader uses 8192 */
	struct cap_buf in;
	cap_buf_init(&in);
	cap_buf_append(&in, data + 1, size - 1);
	char *line = malloc(len);
	unsigned io_errors = 0;
	struct cap_vm_io_error last;
	memset(&last, 0, sizeof(last));
	for (;;) {
		size_t before = cap_buf_used(&in);
		memset(line, 0x55, len);
		int r = cap_qmp_take_line(&in, line, len);
		if (r == -EAGAIN) {
			FUZZ_CHECK(before < len && !(before && memchr(cap_buf_head(&in), '\n', before)),
				   "more asked for with %zu bytes held", before);
			break;
		}
		FUZZ_CHECK(cap_buf_used(&in) < before, "a line taken, nothing consumed");
		if (r == -EMSGSIZE)
			continue;
		FUZZ_CHECK(r == 0, "cap_qmp_take_line: %d", r);
		FUZZ_CHECK(memchr(line, '\0', len) && !strchr(line, '\n'), "a line without its NUL or with a newline");
		size_t took = before - cap_buf_used(&in);
		FUZZ_CHECK(took >= strlen(line) + 1 && took <= len, "a line of %zu bytes took %zu", strlen(line), took);
		unsigned was = io_errors;
		json_t *ret = NULL;
		struct cap_err err = { 0 };
		r = cap_qmp_reply(line, "query-migrate", &io_errors, &last, &ret, &err);
		FUZZ_CHECK(r == 1 || r == 0 || r == -EIO || r == -EPROTO, "cap_qmp_reply: %d", r);
		FUZZ_CHECK(io_errors - was <= 1, "one message, %u I/O errors", io_errors - was);
		FUZZ_CHECK(memchr(last.reason, '\0', sizeof(last.reason)), "an I/O error's reason without its NUL");
		if (r < 0)
			FUZZ_CHECK(strstr(err.msg, "QMP query-migrate"), "an error not naming the command: %s", err.msg);
		if (r == 0) {
			FUZZ_CHECK(ret != NULL, "an answer without its value");
			const char *st = json_string_value(json_object_get(ret, "status"));
			const char *why = json_string_value(json_object_get(ret, "error-desc"));
			char status[32], desc[256];
			snprintf(status, sizeof(status), "%s", st ? st : "none");
			snprintf(desc, sizeof(desc), "%s", why ? why : "");
		}
		json_decref(ret);
	}
	free(line);
	cap_buf_fini(&in);
	return 0;
}
