/* The requests of serve's metrics endpoint (docs/serve.md, "Metrics"):
 * an HTTP/1.x request head, from whoever reaches the address, decoded
 * into the one answer it gets. A pure function over bytes; the head
 * itself is read by the policy process's parser (src/net/sniff.h). */
#ifndef CAP_SERVE_HTTP_H
#define CAP_SERVE_HTTP_H

#include <stdbool.h>
#include <stddef.h>

/* The longest request head taken; a longer one is answered 431. */
#define SERVE_HTTP_MAX 8192

struct serve_http_req {
	/* 200 for GET or HEAD of /metrics (a query is ignored); else the
	 * error to answer: 400 malformed (a bad head, a bare LF, a version
	 * other than HTTP/1.0 and HTTP/1.1, an HTTP/1.1 request without
	 * Host, a request with a body, a target that is neither a path nor
	 * an http:// URL), 404 another path, 405 another method on
	 * /metrics, 431 no head within SERVE_HTTP_MAX bytes. */
	int status;
	bool head;	/* HEAD: the answer without its body */
	size_t len;	/* bytes of the head (0 with 431) */
	const char *why;	/* for an error: what was wrong (static) */
};

/* Decode the request at buf (len bytes: what the client sent so far).
 * 0: a head may still come, read more; 1: *out says what to answer (the
 * bytes after the head are not looked at: the connection closes after
 * the answer). */
int serve_http_parse(const char *buf, size_t len, struct serve_http_req *out);

#endif
