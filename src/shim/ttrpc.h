/* ttrpc (github.com/containerd/ttrpc): containerd's RPC over a unix
 * socket, as the shim v2 task API and the events service speak it.
 *
 * A frame is a 10-byte header then a body: u32 big-endian body length,
 * u32 big-endian stream id, u8 type (1 request, 2 response), u8 flags
 * (unused for unary calls), the body at most 4 MiB. A request's body is
 * a protobuf ttrpc.Request {service, method, payload, timeout_nano,
 * metadata}; a response's a ttrpc.Response {status (google.rpc.Status:
 * code, message), payload}. Clients open odd stream ids.
 *
 * The decoders take untrusted bytes (tests/fuzz/fuzz-ttrpc.c). */
#ifndef CAP_SHIM_TTRPC_H
#define CAP_SHIM_TTRPC_H

#include <stddef.h>
#include <stdint.h>

#include "ttrpc.pb-c.h"

#define CAP_TTRPC_HEADER_LEN 10
#define CAP_TTRPC_MAX_BODY (4u << 20)

enum { CAP_TTRPC_REQUEST = 1, CAP_TTRPC_RESPONSE = 2 };

/* google.golang.org/grpc/codes, the ones the shim answers. */
enum cap_grpc_code {
	CAP_GRPC_OK = 0,
	CAP_GRPC_UNKNOWN = 2,
	CAP_GRPC_INVALID_ARGUMENT = 3,
	CAP_GRPC_NOT_FOUND = 5,
	CAP_GRPC_ALREADY_EXISTS = 6,
	CAP_GRPC_RESOURCE_EXHAUSTED = 8,
	CAP_GRPC_FAILED_PRECONDITION = 9,
	CAP_GRPC_UNIMPLEMENTED = 12,
	CAP_GRPC_INTERNAL = 13,
	CAP_GRPC_UNAVAILABLE = 14,
};

struct cap_ttrpc_header {
	uint32_t length;
	uint32_t stream;
	uint8_t type;
	uint8_t flags;
};

void cap_ttrpc_header_encode(uint8_t out[CAP_TTRPC_HEADER_LEN], const struct cap_ttrpc_header *h);
/* Decode the header at in (CAP_TTRPC_HEADER_LEN bytes). -EMSGSIZE when the
 * length is over CAP_TTRPC_MAX_BODY (*h is filled all the same, so that a
 * server can answer that stream), -EPROTO for a type that is neither. */
int cap_ttrpc_header_decode(const uint8_t *in, struct cap_ttrpc_header *h);

/* A request's or response's body; NULL when it is not one (garbage, a
 * truncated field). The caller frees the result with
 * ttrpc__request__free_unpacked / ttrpc__response__free_unpacked. */
Ttrpc__Request *cap_ttrpc_request_decode(const uint8_t *body, size_t len);
Ttrpc__Response *cap_ttrpc_response_decode(const uint8_t *body, size_t len);

/* A whole frame (header and body) in a new buffer the caller frees; its
 * length in *len. NULL when the body would be over CAP_TTRPC_MAX_BODY. */
uint8_t *cap_ttrpc_request_frame(uint32_t stream, const char *service, const char *method,
				 const uint8_t *payload, size_t n, int64_t timeout_ns, size_t *len);
uint8_t *cap_ttrpc_response_frame(uint32_t stream, int code, const char *message,
				  const uint8_t *payload, size_t n, size_t *len);

/* Frames in a byte stream: calls fn for each whole frame at the start of
 * buf (header decoded, body pointer and length) until fn returns non-zero
 * or the bytes left hold no whole frame. Returns the bytes consumed, or
 * -EMSGSIZE / -EPROTO at a header it refuses. What the fuzz target
 * drives, and what the unit tests check the framing with. */
typedef int (*cap_ttrpc_frame_fn)(void *ud, const struct cap_ttrpc_header *h, const uint8_t *body);
long cap_ttrpc_split(const uint8_t *buf, size_t len, cap_ttrpc_frame_fn fn, void *ud);

/* Read one frame from fd (blocking): the header in *h, the body in a new
 * buffer the caller frees (*body, h->length bytes; NULL when empty).
 * 0 on success, -EPIPE at a clean end of stream, -EMSGSIZE for an
 * oversized body (which is skipped: the stream stays in step), -EPROTO,
 * or -errno. */
int cap_ttrpc_read_frame(int fd, struct cap_ttrpc_header *h, uint8_t **body);

/* A small client: connect to a unix socket (ADDRESS, or unix://ADDRESS)
 * and make one call at a time. */
struct cap_ttrpc_client;
/* NULL with errno set when the connection fails. */
struct cap_ttrpc_client *cap_ttrpc_client_new(const char *address);
void cap_ttrpc_client_free(struct cap_ttrpc_client *c);
/* One unary call; the response's status code (0 OK) and payload (a new
 * buffer in *out, *out_len; NULL when empty) on success; the status's
 * message in msg. -errno when the call could not be made or answered. */
int cap_ttrpc_call(struct cap_ttrpc_client *c, const char *service, const char *method,
		   const uint8_t *payload, size_t n, int timeout_ms, uint8_t **out, size_t *out_len,
		   char *msg, size_t msg_len);

#endif
