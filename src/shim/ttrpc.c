/* ttrpc framing, its messages and a small client (ttrpc.h). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ttrpc.h"
#include "util.h"

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void cap_ttrpc_header_encode(uint8_t out[CAP_TTRPC_HEADER_LEN], const struct cap_ttrpc_header *h)
{
	put_be32(out, h->length);
	put_be32(out + 4, h->stream);
	out[8] = h->type;
	out[9] = h->flags;
}

int cap_ttrpc_header_decode(const uint8_t *in, struct cap_ttrpc_header *h)
{
	h->length = get_be32(in);
	h->stream = get_be32(in + 4);
	h->type = in[8];
	h->flags = in[9];
	if (h->length > CAP_TTRPC_MAX_BODY)
		return -EMSGSIZE;
	if (h->type != CAP_TTRPC_REQUEST && h->type != CAP_TTRPC_RESPONSE)
		return -EPROTO;
	return 0;
}

Ttrpc__Request *cap_ttrpc_request_decode(const uint8_t *body, size_t len)
{
	if (len > CAP_TTRPC_MAX_BODY)
		return NULL;
	return ttrpc__request__unpack(NULL, len, body);
}

Ttrpc__Response *cap_ttrpc_response_decode(const uint8_t *body, size_t len)
{
	if (len > CAP_TTRPC_MAX_BODY)
		return NULL;
	return ttrpc__response__unpack(NULL, len, body);
}

/* The frame of one packed message: header then body. */
static uint8_t *frame(uint32_t stream, uint8_t type, const ProtobufCMessage *m, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	if (n > CAP_TTRPC_MAX_BODY)
		return NULL;
	uint8_t *buf = xmalloc(CAP_TTRPC_HEADER_LEN + n + 1);
	struct cap_ttrpc_header h = { .length = (uint32_t)n, .stream = stream, .type = type };
	cap_ttrpc_header_encode(buf, &h);
	protobuf_c_message_pack(m, buf + CAP_TTRPC_HEADER_LEN);
	*len = CAP_TTRPC_HEADER_LEN + n;
	return buf;
}

uint8_t *cap_ttrpc_request_frame(uint32_t stream, const char *service, const char *method,
				 const uint8_t *payload, size_t n, int64_t timeout_ns, size_t *len)
{
	Ttrpc__Request r = TTRPC__REQUEST__INIT;
	r.service = (char *)service;
	r.method = (char *)method;
	r.payload.data = (uint8_t *)payload;
	r.payload.len = n;
	r.timeout_nano = timeout_ns;
	return frame(stream, CAP_TTRPC_REQUEST, &r.base, len);
}

uint8_t *cap_ttrpc_response_frame(uint32_t stream, int code, const char *message,
				  const uint8_t *payload, size_t n, size_t *len)
{
	Ttrpc__Response r = TTRPC__RESPONSE__INIT;
	Ttrpc__Status st = TTRPC__STATUS__INIT;
	st.code = code;
	st.message = (char *)(message ? message : "");
	r.status = &st;
	r.payload.data = (uint8_t *)payload;
	r.payload.len = n;
	return frame(stream, CAP_TTRPC_RESPONSE, &r.base, len);
}

long cap_ttrpc_split(const uint8_t *buf, size_t len, cap_ttrpc_frame_fn fn, void *ud)
{
	size_t off = 0;
	while (len - off >= CAP_TTRPC_HEADER_LEN) {
		struct cap_ttrpc_header h;
		int r = cap_ttrpc_header_decode(buf + off, &h);
		if (r < 0)
			return r;
		if (len - off - CAP_TTRPC_HEADER_LEN < h.length)
			break;
		const uint8_t *body = buf + off + CAP_TTRPC_HEADER_LEN;
		off += CAP_TTRPC_HEADER_LEN + h.length;
		if (fn(ud, &h, body))
			break;
	}
	return (long)off;
}

/* Read exactly len bytes: 0, -EPIPE at end of stream before any byte
 * when first, -EPROTO at one mid-way, -errno. */
static int read_full(int fd, uint8_t *p, size_t len, int first)
{
	size_t got = 0;
	while (got < len) {
		ssize_t r = read(fd, p + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return got == 0 && first ? -EPIPE : -EPROTO;
		got += (size_t)r;
	}
	return 0;
}

int cap_ttrpc_read_frame(int fd, struct cap_ttrpc_header *h, uint8_t **body)
{
	uint8_t hb[CAP_TTRPC_HEADER_LEN];
	*body = NULL;
	int r = read_full(fd, hb, sizeof(hb), 1);
	if (r < 0)
		return r;
	r = cap_ttrpc_header_decode(hb, h);
	if (r == -EMSGSIZE) {
		/* Skip it, as ttrpc's channel does, to answer its stream. */
		uint8_t skip[4096];
		for (uint32_t left = h->length; left > 0;) {
			uint32_t n = left < sizeof(skip) ? left : (uint32_t)sizeof(skip);
			int e = read_full(fd, skip, n, 0);
			if (e < 0)
				return e;
			left -= n;
		}
		return -EMSGSIZE;
	}
	if (r < 0)
		return r;
	if (h->length == 0)
		return 0;
	uint8_t *b = xmalloc(h->length);
	r = read_full(fd, b, h->length, 0);
	if (r < 0) {
		free(b);
		return r;
	}
	*body = b;
	return 0;
}

struct cap_ttrpc_client {
	int fd;
	uint32_t next_stream;
};

struct cap_ttrpc_client *cap_ttrpc_client_new(const char *address)
{
	if (strncmp(address, "unix://", 7) == 0)
		address += 7;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(address) >= sizeof(sa.sun_path)) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	strcpy(sa.sun_path, address);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return NULL;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return NULL;
	}
	struct cap_ttrpc_client *c = xcalloc(1, sizeof(*c));
	c->fd = fd;
	c->next_stream = 1;
	return c;
}

void cap_ttrpc_client_free(struct cap_ttrpc_client *c)
{
	if (!c)
		return;
	close(c->fd);
	free(c);
}

int cap_ttrpc_call(struct cap_ttrpc_client *c, const char *service, const char *method,
		   const uint8_t *payload, size_t n, int timeout_ms, uint8_t **out, size_t *out_len,
		   char *msg, size_t msg_len)
{
	uint32_t stream = c->next_stream;
	c->next_stream += 2;
	size_t len;
	uint8_t *f = cap_ttrpc_request_frame(stream, service, method, payload, n,
					     (int64_t)timeout_ms * 1000000, &len);
	if (!f)
		return -EMSGSIZE;
	int r = cap_write_all(c->fd, f, len);
	free(f);
	if (r < 0)
		return r;
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int pr = poll(&p, 1, timeout_ms);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return -errno;
		if (pr == 0)
			return -ETIMEDOUT;
		struct cap_ttrpc_header h;
		uint8_t *body;
		r = cap_ttrpc_read_frame(c->fd, &h, &body);
		if (r < 0)
			return r;
		if (h.type != CAP_TTRPC_RESPONSE || h.stream != stream) {
			free(body);
			continue;
		}
		Ttrpc__Response *resp = cap_ttrpc_response_decode(body, h.length);
		free(body);
		if (!resp)
			return -EPROTO;
		int code = resp->status ? resp->status->code : 0;
		if (msg && msg_len)
			snprintf(msg, msg_len, "%s", resp->status && resp->status->message ? resp->status->message : "");
		if (out) {
			*out = NULL;
			*out_len = resp->payload.len;
			if (resp->payload.len) {
				*out = xmalloc(resp->payload.len);
				memcpy(*out, resp->payload.data, resp->payload.len);
			}
		}
		ttrpc__response__free_unpacked(resp, NULL);
		return code;
	}
}
