/* What the codec's files share (proto-codec.c, proto-pod.c): the EXEC
 * container section's bytes. Private to src/proto. */
#ifndef CAP_PROTO_INT_H
#define CAP_PROTO_INT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "proto.h"

/* The section's size in bytes, 0 when c breaks a rule (not encodable). */
size_t cap_proto_ctr_size(const struct cap_exec_container *c);
/* Write it at p (cap_proto_ctr_size bytes); returns the end. */
uint8_t *cap_proto_ctr_put(uint8_t *p, const struct cap_exec_container *c);
/* Read one from p[0..n) into out, its length to *used: 0, or -EBADMSG
 * with err set. */
int cap_proto_ctr_read(const uint8_t *p, size_t n, struct cap_exec_container *out, size_t *used,
		       struct cap_err *err);

#endif
