/* What the policy process does to one intercepted HTTPS request and its
 * response (docs/network.md, "Secrets"): pure HTTP/1.1 rewriting, bytes
 * in and bytes out, no I/O, no TLS (netd-tls.c decrypts around it).
 *
 * One request per connection: the request parser stops at the end of
 * the first request (bytes after it are never forwarded) and the guest's
 * connection ends after the response. So every request is judged alone,
 * on a fresh upstream connection: a second request on a kept-alive
 * connection cannot ride on the first one's check (seed 003's leak).
 *
 * The request, as it goes upstream:
 *  - the request line and the header values get each applicable secret's
 *    value in place of its placeholder; a secret applies when the
 *    connection's verified name (host) is one of its hosts; others keep
 *    their placeholder, wherever they are sent;
 *  - Connection, Keep-Alive and Proxy-Connection (every instance) and the
 *    headers a Connection header names (except the framing headers Host,
 *    Content-Length and Transfer-Encoding) are dropped, and exactly one
 *    "Connection: close" is added as the last header;
 *  - every Accept-Encoding is dropped and exactly one "Accept-Encoding:
 *    identity" added (before Connection), whether or not anything was
 *    substituted: an echoed value must come back as it was sent to be
 *    seen and replaced, also one stored by an earlier request;
 *  - the body (Content-Length, or Transfer-Encoding: chunked) streams
 *    through unchanged, its framing checked, unless a secret marked body
 *    applies: then the whole body is read (at most CAP_HTTP_BODY_MAX),
 *    its placeholders replaced, and it goes with a Content-Length (a
 *    chunked body is de-chunked, its trailers dropped) after the head,
 *    which waits for it. Then "Expect: 100-continue" is dropped too: the
 *    server gets head and body at once, and the guest, which may wait
 *    for a 100 before it sends its body, gets it from the caller
 *    (cap_http_req_continue); with a streamed body Expect goes as it
 *    came, and the server's 100 comes back as an interim response.
 * Refused, nothing forwarded: a malformed request line or header (bare
 * LF, obsolete line folding, a control character, a header name that is
 * not a token, whitespace before the colon) 400; a Host header missing,
 * repeated or naming another host (or port) than the connection's 421
 * (an absolute-form target too; the name's root dot, "api.test.", is the
 * same name); Content-Length with Transfer-Encoding,
 * several differing Content-Lengths, a bad chunk 400; a transfer coding
 * other than chunked 501; a head over CAP_HTTP_HEAD_MAX 431; a body to
 * rewrite over CAP_HTTP_BODY_MAX 413; HTTP other than 1.0/1.1 505. The
 * same two bounds hold for what is built upstream, counted as it is
 * sent: a head over CAP_HTTP_HEAD_MAX 431 with the values in (a value
 * can be 160 times as long as its placeholder), the blank written after
 * each colon, the framing, Accept-Encoding and Connection fields added (a
 * held body's Content-Length counted at CAP_HTTP_BODY_MAX's digits); a
 * held body over CAP_HTTP_BODY_MAX with the values in 413; refused
 * before anything is built. (So a guest's head a little under the bound
 * may be refused: 46 bytes are added to a GET's.)
 *
 * The response, as it goes to the guest: 1xx interim responses pass
 * unchanged (101 is refused: the upgrade was not asked for, Connection
 * having been dropped). The final response's head loses Connection,
 * Keep-Alive, Proxy-Connection, Content-Length and Transfer-Encoding and
 * gets exactly one "Connection: close"; its body (unless HEAD, 204 or
 * 304) is de-chunked and ends when the connection does. (A response to
 * HEAD and a 304 keep one Content-Length: it describes the
 * representation, and there is no body to delimit.) In head and body
 * every secret's value (whichever its host) becomes its placeholder, also
 * across the boundaries of what is fed. A head (interim or final) over
 * CAP_HTTP_HEAD_MAX as it goes to the guest, with the placeholders in
 * (51 bytes, where a value may have 8) and Connection added, is refused
 * (502). A final response with a body (not HEAD, 204 or 304) whose
 * Content-Encoding names a coding other than identity is refused (502):
 * a value in an encoded body could not be seen.
 *
 * What reaches the guest and the log (the oracle of tests/fuzz: "no
 * secret's value reaches anything the guest or the log receives unless
 * the input already held it"):
 *  - a response's out, for the guest: never a value, of any secret,
 *    whatever the server sent, however it is fed (values are replaced
 *    across feeds; a tail that may begin one is dropped when the
 *    response is cut short). An oracle picks values that share no byte
 *    with a placeholder ("capsule-ph-" and lower-case hex: say, upper-case
 *    letters), else a value could be spelt by a placeholder put in and
 *    the server's bytes beside it;
 *  - a refusal's reason (struct cap_http_refusal: the guest's 502 or 4xx
 *    body, and net.log), of a request or a response: one of this file's
 *    fixed texts, which quote no byte of the guest's or the server's (a
 *    content coding is named only from the registry's list, in this
 *    file's spelling). It holds no value, nor a piece of one: an oracle
 *    looks for every 8-byte piece of each value (no fixed text holds 8
 *    upper-case letters in a row);
 *  - cap_http_req_method() and cap_http_req_target(), logged: the
 *    request's as the guest sent them, placeholders and not values, so
 *    a value only when the guest's input held it;
 *  - a request's out goes to the server, not to the guest: the values of
 *    the secrets that apply in place of their placeholders, and no
 *    other secret's value than the guest's input held. */
#ifndef CAP_NET_REWRITE_H
#define CAP_NET_REWRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define CAP_HTTP_HEAD_MAX 32768		/* a request or response head */
#define CAP_HTTP_BODY_MAX ((size_t)8 << 20)	/* a request body to rewrite */
#define CAP_HTTP_MAX_SECRETS 16

struct cap_http_secret {
	const char *name;	/* for the log */
	const char *placeholder;	/* NUL-terminated, what the guest has */
	const char *value;	/* the real value, value_len bytes */
	size_t value_len;
	bool body;		/* also in the request body */
	bool applies;		/* the connection's name is one of its hosts */
};

/* A request or response that cannot go on: the status for the guest
 * (400, 413, 421, 431, 501, 502, 505) and why, for the guest's answer
 * and the log: a fixed text, never the peer's bytes (see above). */
struct cap_http_refusal {
	int status;
	char reason[200];
};

enum {
	CAP_HTTP_MORE = 0,	/* give more bytes */
	CAP_HTTP_DONE = 1,	/* complete */
};

struct cap_http_req;
/* host: the connection's verified name (lowercase), port its port (the
 * Host header may omit it when it is 443). s[0..n) are borrowed for the
 * request's life (n at most CAP_HTTP_MAX_SECRETS). */
struct cap_http_req *cap_http_req_new(const char *host, uint16_t port,
				      const struct cap_http_secret *s, unsigned n);
/* Zero the buffered request (it may hold a value) and free. NULL: no-op. */
void cap_http_req_free(struct cap_http_req *r);
/* Feed p[0..n) of the guest's plaintext; what goes upstream is appended
 * to out (possibly nothing yet). *used: bytes taken from p. Returns
 * CAP_HTTP_MORE (all n used), CAP_HTTP_DONE (the request ended; *used <= n,
 * bytes after it are not the request's), or -1 with why filled (nothing
 * more may be forwarded; out may hold part of the request already
 * appended in earlier calls, which the caller must not send on after a
 * refusal that arrives before the head is complete: out only ever gets
 * the head once it is whole and checked). After DONE or -1, further
 * calls return the same. */
int cap_http_req_feed(struct cap_http_req *r, const uint8_t *p, size_t n, size_t *used,
		      struct cap_buf *out, struct cap_http_refusal *why);
/* The guest closed its side before the request ended: -1 with why (400,
 * "the request ended early"); CAP_HTTP_DONE when it had ended. */
int cap_http_req_eof(struct cap_http_req *r, struct cap_http_refusal *why);
/* Whether the guest waits for "HTTP/1.1 100 Continue" that only the
 * caller can give: the head was accepted, the body is being held (and
 * more of it is to come), and the request, HTTP/1.1, has "Expect:
 * 100-continue" (dropped from what goes upstream). False before the head
 * is whole, after the request ended or was refused. The caller sends the
 * 100 once, the first time this is true after a feed. */
bool cap_http_req_continue(const struct cap_http_req *r);
/* Whether the request's head is no longer being read: it was read whole,
 * or the request was refused (for the caller's limit on how long a guest
 * may take to send it). */
bool cap_http_req_head_read(const struct cap_http_req *r);
/* Which secrets (bit i for s[i]) were put in, for the log. */
uint32_t cap_http_req_substituted(const struct cap_http_req *r);
/* The request's method and target as received (placeholders, not
 * values), for the log; "" until the request line is read. */
const char *cap_http_req_method(const struct cap_http_req *r);
const char *cap_http_req_target(const struct cap_http_req *r);

struct cap_http_resp;
/* head_request: the request was HEAD (the response has no body). */
struct cap_http_resp *cap_http_resp_new(const struct cap_http_secret *s, unsigned n,
					bool head_request);
void cap_http_resp_free(struct cap_http_resp *r);
/* Feed upstream plaintext; what goes to the guest is appended to out.
 * CAP_HTTP_MORE, CAP_HTTP_DONE (the response is complete: a bodiless
 * one, a Content-Length or chunked body ended; later bytes are ignored),
 * or -1 with why (502: a malformed or oversized head, one over the size
 * limit with the placeholders in, a bad chunk, 101, a content coding). */
int cap_http_resp_feed(struct cap_http_resp *r, const uint8_t *p, size_t n,
		       struct cap_buf *out, struct cap_http_refusal *why);
/* Upstream ended: the held tail is flushed to out. CAP_HTTP_DONE, or -1
 * (502) when the head was incomplete or a framed body was cut short
 * (what was already appended has gone; the caller closes). */
int cap_http_resp_eof(struct cap_http_resp *r, struct cap_buf *out,
		      struct cap_http_refusal *why);
/* Which secrets (bit i for s[i]) had their value replaced by their
 * placeholder in what was appended to out so far (head and body), for
 * the log; 0 when none was echoed. */
uint32_t cap_http_resp_echoed_mask(const struct cap_http_resp *r);
/* The status code of the final response, 0 until its head is read. */
int cap_http_resp_status(const struct cap_http_resp *r);

#endif
