/* What the policy process reads in the first bytes of a connection: the
 * server name of a TLS ClientHello, the head of an HTTP proxy request and
 * its target. Pure functions over byte buffers, every offset checked; no
 * I/O, no allocation. */
#ifndef CAP_NET_SNIFF_H
#define CAP_NET_SNIFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cap_tls_sniff {
	CAP_TLS_MORE,		/* could be a ClientHello: read more */
	CAP_TLS_NOT_TLS,	/* the bytes are not a TLS handshake */
	CAP_TLS_SNI,		/* a ClientHello with a server name */
	CAP_TLS_NO_SNI,		/* a ClientHello without one */
	CAP_TLS_MALFORMED,	/* a TLS handshake record that is not a sound ClientHello */
};

/* The largest ClientHello read (handshake message, possibly spread over
 * several records); a longer one is CAP_TLS_MALFORMED. */
#define CAP_TLS_HELLO_MAX 32768
#define CAP_TLS_SNI_MAX 255

/* Read the ClientHello at the start of buf (len bytes: what the client
 * sent so far). On CAP_TLS_SNI, the first host_name of the server_name
 * extension is copied to sni (NUL added; it may hold any byte, NUL
 * included, so use *sni_len) — validate it with cap_net_valid_name. A
 * name longer than CAP_TLS_SNI_MAX, an empty one, a second name or a
 * second server_name extension is CAP_TLS_MALFORMED. */
enum cap_tls_sniff cap_tls_sniff(const uint8_t *buf, size_t len,
				 char sni[CAP_TLS_SNI_MAX + 1], size_t *sni_len);

/* A part of a buffer. */
struct cap_span {
	size_t off, len;
};

/* The head of an HTTP/1.x request: "METHOD SP TARGET SP HTTP/1.x CRLF",
 * header fields "NAME: VALUE CRLF" (NAME a token; VALUE without control
 * characters but tab), then CRLF. Lines end in CRLF only; obsolete line
 * folding, a bare CR or LF and a second Host field are malformed. */
struct cap_http_head {
	struct cap_span method, target, version;
	bool has_host;
	struct cap_span host;	/* the Host field's value, blanks trimmed */
	size_t fields;		/* offset of the first field line */
	size_t len;		/* of the whole head, its empty line included */
};

/* 1 with h filled once buf holds a whole head; 0 when it needs more
 * bytes (and len < max); -EINVAL malformed; -E2BIG when no head ends
 * within max bytes. */
int cap_http_head_parse(const char *buf, size_t len, size_t max, struct cap_http_head *h);

/* The header fields of a parsed head, one per call from *pos (start at
 * h->fields): true with name and value (trimmed) set, false after the
 * last. */
bool cap_http_field_next(const char *buf, const struct cap_http_head *h, size_t *pos,
			 struct cap_span *name, struct cap_span *value);

/* A proxy request's target. */
struct cap_target {
	char host[254];		/* lowercase, no trailing dot; a name or an IPv4 address */
	bool is_addr;		/* host is an IPv4 address, in addr (host order) */
	uint32_t addr;
	uint16_t port;
};

/* Parse "host:port" (a CONNECT target; port required) into t. A host is a
 * name accepted by cap_net_valid_name or a strict dotted IPv4 address (a
 * name whose last label is numeric must be an address). -EINVAL with
 * *why saying what is wrong ("control character in the target",
 * "whitespace in the target", "empty host", "no port", "bad port",
 * "not a valid host name", "not a valid IPv4 address"); static strings. */
int cap_target_parse_authority(const char *s, size_t len, struct cap_target *t,
			       const char **why);

/* Parse an absolute-form target "http://host[:port][/path][?query]" (the
 * scheme in any case; port 80 by default; no user information) into t
 * and *path (the origin form to send: "/" when the URL has no path).
 * -EINVAL with *why as above, "not an http:// URL" (an https:// one says
 * to use CONNECT),
 * "user information in the URL". */
int cap_target_parse_url(const char *s, size_t len, struct cap_target *t,
			 struct cap_span *path, const char **why);

/* s (len bytes) for a log line: in double quotes, '"', '\\' and bytes
 * outside printable ASCII escaped ("\r", "\n", "\t", "\xNN"), cut with
 * "..." to fit out (size bytes, at least 16). Returns out. */
const char *cap_sniff_quote(const char *s, size_t len, char *out, size_t size);

#endif
