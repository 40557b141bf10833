#include "client.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util.h"

void cap_client_init(struct cap_client *c)
{
	memset(c, 0, sizeof(*c));
	cap_buf_init(&c->in);
	cap_buf_init(&c->out);
	c->next_id = 1;
	/* The host speaks first; the peer answers with its own HELLO. */
	cap_proto_hello_encode(&c->out, "capsule host " CAPSULE_VERSION);
}

void cap_client_adopt(struct cap_client *c, uint32_t version, const char *agent_version, uint32_t next_id)
{
	cap_client_fini(c);
	memset(c, 0, sizeof(*c));
	cap_buf_init(&c->in);
	cap_buf_init(&c->out);
	c->hello = true;
	c->version = version;
	snprintf(c->agent_version, sizeof(c->agent_version), "%s", agent_version);
	c->setup_state = CAP_SETUP_DONE;
	c->next_id = next_id ? next_id : 1;
}

void cap_client_fini(struct cap_client *c)
{
	cap_buf_fini(&c->in);
	cap_buf_fini(&c->out);
	free(c->listeners);
	c->listeners = NULL;
	c->nlisteners = 0;
}

static struct cap_client_stream *find(struct cap_client *c, uint32_t id)
{
	if (id == 0)
		return NULL;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(c->streams); i++)
		if (c->streams[i].id == id)
			return &c->streams[i];
	return NULL;
}

static void close_stream(struct cap_client *c, struct cap_client_stream *s)
{
	memset(s, 0, sizeof(*s));
	c->nactive--;
}

/* Deliver output within the cap (plus room for the guest's marker). */
static void deliver(struct cap_client_stream *s, int fd, const uint8_t *p,
		    size_t n)
{
	if (s->cap) {
		uint64_t limit = (uint64_t)s->cap + 128;
		if (s->out_bytes >= limit) {
			s->truncated = true;
			return;
		}
		if (n > limit - s->out_bytes) {
			n = (size_t)(limit - s->out_bytes);
			s->truncated = true;
		}
	}
	s->out_bytes += n;
	/* A CONNECT stream's empty STDOUT is the guest side's half-close. */
	if ((n || s->connect) && s->ev->output)
		s->ev->output(s->ud, s->id, fd, p, n);
}

static int dispatch(struct cap_client *c, const struct cap_frame *f,
		    struct cap_err *err)
{
	struct cap_client_stream *s;

	if (!c->hello && f->type != CAP_MSG_HELLO)
		return cap_err_set(err, EPROTO, "agent sent %s before HELLO",
				   cap_msg_name(f->type));
	switch (f->type) {
	case CAP_MSG_HELLO:
		if (c->hello || f->stream != 0)
			return cap_err_set(err, EPROTO, "agent sent an unexpected HELLO");
		if (cap_proto_hello_decode(f->payload, f->len, &c->version,
					   c->agent_version,
					   sizeof(c->agent_version)) < 0)
			return cap_err_set(err, EPROTO, "agent sent a malformed HELLO (%u bytes)", f->len);
		if (c->version != CAP_PROTO_VERSION)
			return cap_err_set(err, EPROTONOSUPPORT,
					   "guest agent speaks protocol v%u, this capsule speaks v%u; rebuild the initramfs with `make`",
					   c->version, CAP_PROTO_VERSION);
		c->hello = true;
		return 0;
	case CAP_MSG_STDOUT:
	case CAP_MSG_STDERR:
		s = find(c, f->stream);
		if (!s)
			return cap_err_set(err, EPROTO, "agent sent %s for stream %u, which is not open",
					   cap_msg_name(f->type), f->stream);
		deliver(s, f->type == CAP_MSG_STDOUT ? 1 : 2, f->payload, f->len);
		return 0;
	case CAP_MSG_SYNCING:
		s = find(c, f->stream);
		if (!s || f->len != 0)
			return cap_err_set(err, EPROTO, "agent sent SYNCING for stream %u, which is not open, or with %u bytes",
					   f->stream, f->len);
		if (s->ev->syncing)
			s->ev->syncing(s->ud, s->id);
		return 0;
	case CAP_MSG_EXIT: {
		struct cap_exit ex;
		s = find(c, f->stream);
		if (!s)
			return cap_err_set(err, EPROTO, "agent sent EXIT for stream %u, which is not open", f->stream);
		if (cap_proto_exit_decode(f->payload, f->len, &ex) < 0)
			return cap_err_set(err, EPROTO, "agent sent a malformed EXIT for stream %u", f->stream);
		if (s->truncated)
			ex.flags |= CAP_EXIT_TRUNCATED;
		struct cap_client_stream done = *s;
		close_stream(c, s);
		if (done.ev->done)
			done.ev->done(done.ud, done.id, &ex, 0, NULL);
		return 0;
	}
	case CAP_MSG_ERROR: {
		int errnum;
		char msg[256];
		if (cap_proto_error_decode(f->payload, f->len, &errnum, msg, sizeof(msg)) < 0)
			return cap_err_set(err, EPROTO, "agent sent a malformed ERROR");
		if (f->stream == 0)
			return cap_err_set(err, EPROTO, "agent reported a connection error: %s", msg);
		s = find(c, f->stream);
		if (!s)
			return cap_err_set(err, EPROTO, "agent sent ERROR for stream %u, which is not open", f->stream);
		struct cap_client_stream done = *s;
		close_stream(c, s);
		if (done.ev->done)
			done.ev->done(done.ud, done.id, NULL,
				      errnum > 0 && errnum < 4096 ? errnum : EIO, msg);
		return 0;
	}
	case CAP_MSG_SETUP: {
		int errnum;
		if (f->stream != 0 || c->setup_state != CAP_SETUP_PENDING ||
		    cap_proto_error_decode(f->payload, f->len, &errnum, c->setup_msg,
					   sizeof(c->setup_msg)) < 0)
			return cap_err_set(err, EPROTO, "agent sent an unexpected or malformed SETUP answer");
		c->setup_errno = errnum >= 0 && errnum < 4096 ? errnum : EIO;
		c->setup_state = CAP_SETUP_DONE;
		return 0;
	}
	case CAP_MSG_PAUSE:
	case CAP_MSG_RESUME:
	case CAP_MSG_SNAPSHOT: {
		int errnum;
		char msg[256];
		if (f->stream != 0 || c->vm_ops_pending == 0 ||
		    cap_proto_error_decode(f->payload, f->len, &errnum, msg, sizeof(msg)) < 0)
			return cap_err_set(err, EPROTO, "unexpected or malformed %s answer", cap_msg_name(f->type));
		c->vm_ops_pending--;
		c->vm_op_errno = errnum;
		return 0;
	}
	case CAP_MSG_LISTENERS: {
		uint16_t *ports;
		uint32_t n;
		if (f->stream != 0 || cap_proto_listeners_decode(f->payload, f->len, &ports, &n) < 0)
			return cap_err_set(err, EPROTO, "agent sent a malformed LISTENERS (%u bytes on stream %u)",
					   f->len, f->stream);
		free(c->listeners);
		c->listeners = ports;
		c->nlisteners = n;
		c->listeners_changed = true;
		return 0;
	}
	case CAP_MSG_SHUTDOWN:
		if (f->stream != 0 || f->len != 0)
			return cap_err_set(err, EPROTO, "agent sent a malformed SHUTDOWN");
		c->shutdown_acked = true;
		return 0;
	default:
		return cap_err_set(err, EPROTO, "agent sent %s, a message only the host may send",
				   cap_msg_name(f->type));
	}
}

int cap_client_feed(struct cap_client *c, const void *data, size_t n,
		    struct cap_err *err)
{
	cap_buf_append(&c->in, data, n);
	for (;;) {
		struct cap_frame f;
		int r = cap_proto_parse(cap_buf_head(&c->in), cap_buf_used(&c->in), &f);
		if (r == 0)
			return 0;
		if (r == -EMSGSIZE)
			return cap_err_set(err, EPROTO, "agent sent a frame of %u bytes, over the %d-byte limit",
					   cap_get_u32(cap_buf_head(&c->in)), CAP_PROTO_MAX_PAYLOAD);
		if (r < 0)
			return cap_err_set(err, EPROTO, "agent sent a frame with unknown type %u or flags 0x%x",
					   cap_get_u16(cap_buf_head(&c->in) + 4),
					   cap_get_u16(cap_buf_head(&c->in) + 6));
		int d = dispatch(c, &f, err);
		if (d < 0)
			return d;
		cap_buf_consume(&c->in, (size_t)r);
	}
}

/* A free stream slot and a new id, or NULL with *rc = -errno (err set). */
static struct cap_client_stream *new_stream(struct cap_client *c, uint32_t *sid,
					    int *rc, struct cap_err *err)
{
	if (!c->hello) {
		*rc = cap_err_set(err, ENOTCONN, "the guest agent has not said HELLO yet");
		return NULL;
	}
	struct cap_client_stream *slot = NULL;
	for (size_t i = 0; !slot && i < CAP_ARRAY_SIZE(c->streams); i++)
		if (c->streams[i].id == 0)
			slot = &c->streams[i];
	if (!slot) {
		*rc = cap_err_set(err, EBUSY, "%d commands already run in this VM; wait for one to finish",
				  CAP_PROTO_MAX_STREAMS);
		return NULL;
	}
	*sid = c->next_id++;
	if (c->next_id == 0)
		c->next_id = 1;
	return slot;
}

static void open_stream(struct cap_client *c, struct cap_client_stream *slot,
			uint32_t sid, uint32_t cap, const struct cap_exec_events *ev,
			void *ud, uint32_t *id)
{
	*slot = (struct cap_client_stream){ .id = sid, .cap = cap, .ev = ev, .ud = ud };
	c->nactive++;
	*id = sid;
}

int cap_client_exec(struct cap_client *c, const struct cap_exec_req *req,
		    const struct cap_exec_events *ev, void *ud, uint32_t *id,
		    struct cap_err *err)
{
	uint32_t sid;
	int rc;
	struct cap_client_stream *slot = new_stream(c, &sid, &rc, err);
	if (!slot)
		return rc;
	int r = cap_proto_exec_encode(&c->out, sid, req);
	if (r == -E2BIG)
		return cap_err_set(err, E2BIG, "the command line and environment exceed %d bytes",
				   CAP_PROTO_MAX_PAYLOAD);
	if (r < 0)
		return cap_err_set(err, -r, "the command cannot be sent: empty, over %d arguments, or a string holds a NUL byte",
				   CAP_PROTO_MAX_ARGS);
	open_stream(c, slot, sid, req->output_cap, ev, ud, id);
	return 0;
}

int cap_client_connect(struct cap_client *c, uint16_t port, const struct cap_exec_events *ev,
		       void *ud, uint32_t *id, struct cap_err *err)
{
	uint32_t sid;
	int rc;
	if (port == 0)
		return cap_err_set(err, EINVAL, "port 0 cannot be connected to");
	struct cap_client_stream *slot = new_stream(c, &sid, &rc, err);
	if (!slot)
		return rc;
	cap_proto_connect_encode(&c->out, sid, port);
	open_stream(c, slot, sid, 0, ev, ud, id);
	slot->connect = true;
	return 0;
}

int cap_client_file(struct cap_client *c, const struct cap_file_req *req,
		    uint32_t cap, const struct cap_exec_events *ev, void *ud,
		    uint32_t *id, struct cap_err *err)
{
	uint32_t sid;
	int rc;
	struct cap_client_stream *slot = new_stream(c, &sid, &rc, err);
	if (!slot)
		return rc;
	int r = cap_proto_file_encode(&c->out, sid, req);
	if (r == -E2BIG)
		return cap_err_set(err, E2BIG, "the file operation exceeds %d bytes", CAP_PROTO_MAX_PAYLOAD);
	if (r < 0)
		return cap_err_set(err, EINVAL, "path '%s' is not allowed: it must be relative to its root, without '..'",
				   req->path);
	open_stream(c, slot, sid, cap, ev, ud, id);
	return 0;
}

int cap_client_update(struct cap_client *c, const struct cap_update *u,
		      const struct cap_exec_events *ev, void *ud, uint32_t *id,
		      struct cap_err *err)
{
	uint32_t sid;
	int rc;
	struct cap_client_stream *slot = new_stream(c, &sid, &rc, err);
	if (!slot)
		return rc;
	if (cap_proto_update_encode(&c->out, sid, u) < 0)
		return cap_err_set(err, EINVAL, "the update of container '%s' cannot be sent: a bad name or limit", u->name);
	open_stream(c, slot, sid, 4096, ev, ud, id);
	return 0;
}

int cap_client_stats(struct cap_client *c, const char *name,
		     const struct cap_exec_events *ev, void *ud, uint32_t *id,
		     struct cap_err *err)
{
	uint32_t sid;
	int rc;
	struct cap_client_stream *slot = new_stream(c, &sid, &rc, err);
	if (!slot)
		return rc;
	if (cap_proto_stats_req_encode(&c->out, sid, name) < 0)
		return cap_err_set(err, EINVAL, "'%s' is not a container's name", name);
	/* The record and a message: at most this much. */
	open_stream(c, slot, sid, 4 + CAP_STATS_MAX * (4 + CAP_STATS_KEY_MAX + 8) + 1024, ev, ud, id);
	return 0;
}

int cap_client_stdin(struct cap_client *c, uint32_t id, const void *p,
		     size_t n)
{
	if (!find(c, id))
		return -ENOENT;
	if (n == 0) {
		cap_proto_put(&c->out, CAP_MSG_STDIN, id, NULL, 0);
		return 0;
	}
	const uint8_t *q = p;
	while (n > 0) {
		size_t k = CAP_MIN(n, (size_t)CAP_PROTO_MAX_PAYLOAD);
		cap_proto_put(&c->out, CAP_MSG_STDIN, id, q, k);
		q += k;
		n -= k;
	}
	return 0;
}

int cap_client_signal(struct cap_client *c, uint32_t id, int sig)
{
	return cap_client_signal_scope(c, id, sig, CAP_SIGNAL_GROUP);
}

int cap_client_signal_scope(struct cap_client *c, uint32_t id, int sig,
			    enum cap_signal_scope scope)
{
	if (!find(c, id))
		return -ENOENT;
	/* The default scope is sent as before (no second word), so that
	 * older agents still take it. */
	uint8_t p[8];
	cap_put_u32(p, (uint32_t)sig);
	cap_put_u32(p + 4, (uint32_t)scope);
	cap_proto_put(&c->out, CAP_MSG_SIGNAL, id, p, scope == CAP_SIGNAL_GROUP ? 4 : 8);
	return 0;
}

int cap_client_resize(struct cap_client *c, uint32_t id, uint16_t rows,
		      uint16_t cols)
{
	if (!find(c, id))
		return -ENOENT;
	uint8_t p[4];
	cap_put_u16(p, rows);
	cap_put_u16(p + 2, cols);
	cap_proto_put(&c->out, CAP_MSG_RESIZE, id, p, sizeof(p));
	return 0;
}

int cap_client_setup(struct cap_client *c, const struct cap_setup *s)
{
	int r = cap_proto_setup_encode(&c->out, s);
	if (r < 0)
		return r;
	c->setup_state = CAP_SETUP_PENDING;
	c->setup_errno = 0;
	c->setup_msg[0] = '\0';
	return 0;
}

void cap_client_clock(struct cap_client *c)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	cap_proto_clock_encode(&c->out, (int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
}

void cap_client_vm_op(struct cap_client *c, enum cap_msg op)
{
	CAP_BUG_ON(op != CAP_MSG_PAUSE && op != CAP_MSG_RESUME);
	cap_proto_put(&c->out, op, 0, NULL, 0);
	c->vm_ops_pending++;
}

void cap_client_snapshot(struct cap_client *c, const char *dir, uint32_t flags)
{
	size_t n = strlen(dir);
	uint8_t *p = xmalloc(4 + n);
	cap_put_u32(p, flags);
	memcpy(p + 4, dir, n);
	cap_proto_put(&c->out, CAP_MSG_SNAPSHOT, 0, p, 4 + n);
	free(p);
	c->vm_ops_pending++;
}

void cap_client_keep(struct cap_client *c)
{
	CAP_BUG_ON(c->hello);
	c->out.off = c->out.len = 0;
	cap_proto_hello_encode_flags(&c->out, "capsule host " CAPSULE_VERSION, CAP_HELLO_KEEP);
}

void cap_client_shutdown(struct cap_client *c)
{
	cap_proto_put(&c->out, CAP_MSG_SHUTDOWN, 0, NULL, 0);
}
