/* JSON-RPC 2.0, one message per line: the envelope layer shared by the
 * front ends that speak it (`capsule serve`'s socket, `capsule mcp` on
 * stdio, and mcp as a client of serve). It reads lines off a descriptor,
 * parses and checks envelopes, and writes replies; what the methods mean
 * is the front end's business. */
#ifndef CAP_JSONRPC_H
#define CAP_JSONRPC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

/* Error codes of JSON-RPC 2.0 and of capsule (docs/serve.md). */
enum {
	CAP_RPC_PARSE = -32700,
	CAP_RPC_INVALID = -32600,
	CAP_RPC_METHOD = -32601,
	CAP_RPC_PARAMS = -32602,
	CAP_RPC_INTERNAL = -32603,
	CAP_RPC_SANDBOX = -32000,	/* the sandbox failed: message says why */
	CAP_RPC_CAPACITY = -32001,	/* every slot busy: retryable */
	CAP_RPC_TOOL = -32002,	/* the tool refused (file too big, not text...) */
	CAP_RPC_CANCELLED = -32800,
};

#define CAP_RPC_LINE_MAX (4u << 20)

/* One parsed message. Everything but owned_root is borrowed from it. */
struct cap_rpc_msg {
	json_t *owned_root;
	const char *method;	/* requests and notifications */
	json_t *id;	/* NULL for a notification */
	json_t *params;	/* an object, or NULL when absent */
	json_t *result;	/* responses: one of result and error */
	json_t *error;
};

/* A JSON string of text, its invalid UTF-8 (a message cut mid-character,
 * a parser's quote of the input) turned into U+FFFD. */
json_t *cap_json_text(const char *s);
json_t *cap_json_textn(const void *p, size_t n);

/* Parse one line. 0 with *m filled, or a JSON-RPC error code (negative)
 * with a message in msg and, when the line had a usable id, *bad_id set
 * (borrowed from a root kept in m->owned_root; NULL otherwise: the reply
 * goes to id null). Requests need "jsonrpc": "2.0", a string method, an
 * id that is a string, an integer or absent, and object params; a
 * response needs an id and exactly one of result and error. Batches are
 * refused, and so is a line holding a NUL byte. */
int cap_rpc_parse(const char *line, size_t n, struct cap_rpc_msg *m,
		  json_t **bad_id, char *msg, size_t msgsz);
void cap_rpc_msg_fini(struct cap_rpc_msg *m);

/* Append one message and its newline to out. result and data are stolen;
 * id is borrowed (NULL: null). */
void cap_rpc_put_result(struct cap_buf *out, json_t *id, json_t *result);
void cap_rpc_put_error(struct cap_buf *out, json_t *id, int code,
		       const char *msg, json_t *data);
/* A request (params stolen, may be NULL); notification when id < 0. */
void cap_rpc_put_request(struct cap_buf *out, long long id,
			 const char *method, json_t *params);

/* Reading lines (of at most CAP_RPC_LINE_MAX bytes) from a descriptor. */
struct cap_rpc_reader {
	struct cap_buf in;
	struct cap_lines st;
	/* The longest line taken; 0 (set by _init): CAP_RPC_LINE_MAX. A
	 * client reading a trusted server's answers sets more. */
	size_t max;
};
void cap_rpc_reader_init(struct cap_rpc_reader *r);
void cap_rpc_reader_fini(struct cap_rpc_reader *r);
/* Read what fd has and hand each complete line to line(); too_long() is
 * called once per line over the limit. 1 when data was read, 0 when the
 * peer closed (or failed), -EAGAIN when nothing was there. */
int cap_rpc_read(struct cap_rpc_reader *r, int fd,
		 void (*line)(void *ud, const char *p, size_t n),
		 void (*too_long)(void *ud), void *ud);
/* The same for bytes already in hand (fuzzing, tests). */
void cap_rpc_feed(struct cap_rpc_reader *r, const void *p, size_t n,
		  void (*line)(void *ud, const char *p, size_t n),
		  void (*too_long)(void *ud), void *ud);

/* Write as much of out as fd takes. 0, or -errno when the peer is gone. */
int cap_rpc_flush(struct cap_buf *out, int fd);

#endif
