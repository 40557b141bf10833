#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include "layout.h"
#include "proto-int.h"
#include "util.h"

static const char *const msg_names[] = {
	[CAP_MSG_HELLO] = "HELLO",	 [CAP_MSG_EXEC] = "EXEC",
	[CAP_MSG_STDIN] = "STDIN",	 [CAP_MSG_STDOUT] = "STDOUT",
	[CAP_MSG_STDERR] = "STDERR",	 [CAP_MSG_EXIT] = "EXIT",
	[CAP_MSG_SIGNAL] = "SIGNAL",	 [CAP_MSG_SHUTDOWN] = "SHUTDOWN",
	[CAP_MSG_ERROR] = "ERROR",	 [CAP_MSG_SETUP] = "SETUP",
	[CAP_MSG_RESIZE] = "RESIZE",	 [CAP_MSG_PAUSE] = "PAUSE",
	[CAP_MSG_RESUME] = "RESUME",	 [CAP_MSG_FILE] = "FILE",
	[CAP_MSG_LISTENERS] = "LISTENERS",
	[CAP_MSG_SYNCING] = "SYNCING",	 [CAP_MSG_CLOCK] = "CLOCK",
	[CAP_MSG_UPDATE] = "UPDATE",	 [CAP_MSG_STATS] = "STATS",
	[CAP_MSG_CONNECT] = "CONNECT",	 [CAP_MSG_SNAPSHOT] = "SNAPSHOT",
};

const char *cap_msg_name(unsigned type)
{
	if (type < CAP_ARRAY_SIZE(msg_names) && msg_names[type])
		return msg_names[type];
	return "unknown";
}

int cap_proto_parse(const uint8_t *buf, size_t n, struct cap_frame *f)
{
	if (n < CAP_PROTO_HEADER)
		return 0;
	uint32_t len = cap_get_u32(buf);
	uint16_t type = cap_get_u16(buf + 4);
	uint16_t flags = cap_get_u16(buf + 6);

	/* Validate the header before waiting for the payload, so that a
	 * hostile length is refused at once rather than buffered for. */
	if (len > CAP_PROTO_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (type == 0 || type > CAP_MSG_MAX_ || flags != 0)
		return -EBADMSG;
	if (n - CAP_PROTO_HEADER < len)
		return 0;
	f->type = type;
	f->flags = flags;
	f->stream = cap_get_u32(buf + 8);
	f->len = len;
	f->payload = buf + CAP_PROTO_HEADER;
	return (int)(CAP_PROTO_HEADER + len);
}

static void put_header(uint8_t *h, enum cap_msg type, uint32_t stream,
		       size_t len)
{
	cap_put_u32(h, (uint32_t)len);
	cap_put_u16(h + 4, (uint16_t)type);
	cap_put_u16(h + 6, 0);
	cap_put_u32(h + 8, stream);
}

void cap_proto_put(struct cap_buf *out, enum cap_msg type, uint32_t stream,
		   const void *payload, size_t len)
{
	CAP_BUG_ON(len > CAP_PROTO_MAX_PAYLOAD);
	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + len);
	put_header(h, type, stream, len);
	if (len)
		memcpy(h + CAP_PROTO_HEADER, payload, len);
	cap_buf_commit(out, CAP_PROTO_HEADER + len);
}

/* --- EXEC ------------------------------------------------------------ */

/* Whether a CAP_EXEC_USER request's user section is one the decoder
 * takes: counts within their bounds, known resources, soft <= hard, a
 * umask of permission bits only. */
static bool user_ok(const struct cap_exec_req *req)
{
	if (req->ngroups > CAP_EXEC_MAX_GROUPS || req->nrlimits > CAP_EXEC_MAX_RLIMITS ||
	    req->umask > 0777)
		return false;
	for (uint32_t i = 0; i < req->nrlimits; i++) {
		const struct cap_exec_rlimit *l = &req->rlimits[i];
		if (l->resource >= RLIMIT_NLIMITS || l->soft > l->hard)
			return false;
	}
	return true;
}

/* The user section's size: uid, gid, ngroups, groups, nrlimits, rlimits
 * (resource u32, soft u64, hard u64), umask. */
static size_t user_size(const struct cap_exec_req *req)
{
	return 4 * 3 + 4 * (size_t)req->ngroups + 4 + 20 * (size_t)req->nrlimits + 4;
}

int cap_proto_exec_encode(struct cap_buf *out, uint32_t stream,
			  const struct cap_exec_req *req)
{
	bool user = req->flags & CAP_EXEC_USER;
	bool ctr = req->flags & CAP_EXEC_CONTAINER;
	size_t ctr_size = ctr && req->ctr ? cap_proto_ctr_size(req->ctr) : 0;
	if (req->argc == 0 || req->argc > CAP_PROTO_MAX_ARGS ||
	    req->envc > CAP_PROTO_MAX_ARGS || (user && !user_ok(req)) ||
	    (ctr && (!user || ctr_size == 0)))
		return -EINVAL;
	/* With the user section pids_max is always sent (it comes first);
	 * without it, only when nonzero, byte for byte what older agents
	 * parse. */
	size_t size = 4 * 6 + str_size(req->cwd) + (req->pids_max || user ? 4 : 0) +
		      (user ? user_size(req) : 0) + ctr_size;
	for (uint32_t i = 0; i < req->argc; i++)
		size += str_size(req->argv[i]);
	for (uint32_t i = 0; i < req->envc; i++)
		size += str_size(req->env[i]);
	if (size > CAP_PROTO_MAX_PAYLOAD)
		return -E2BIG;

	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	uint8_t *p = h + CAP_PROTO_HEADER;
	put_header(h, CAP_MSG_EXEC, stream, size);
	cap_put_u32(p, req->timeout_ms);
	cap_put_u32(p + 4, req->output_cap);
	cap_put_u32(p + 8, req->flags);
	cap_put_u16(p + 12, req->rows);
	cap_put_u16(p + 14, req->cols);
	cap_put_u32(p + 16, req->argc);
	p += 20;
	for (uint32_t i = 0; i < req->argc; i++)
		p = put_str(p, req->argv[i]);
	cap_put_u32(p, req->envc);
	p += 4;
	for (uint32_t i = 0; i < req->envc; i++)
		p = put_str(p, req->env[i]);
	p = put_str(p, req->cwd);
	if (req->pids_max || user) {
		cap_put_u32(p, req->pids_max);
		p += 4;
	}
	if (user) {
		cap_put_u32(p, req->uid);
		cap_put_u32(p + 4, req->gid);
		cap_put_u32(p + 8, req->ngroups);
		p += 12;
		for (uint32_t i = 0; i < req->ngroups; i++, p += 4)
			cap_put_u32(p, req->groups[i]);
		cap_put_u32(p, req->nrlimits);
		p += 4;
		for (uint32_t i = 0; i < req->nrlimits; i++) {
			cap_put_u32(p, req->rlimits[i].resource);
			p = put_u64(p + 4, req->rlimits[i].soft);
			p = put_u64(p, req->rlimits[i].hard);
		}
		cap_put_u32(p, req->umask);
		p += 4;
	}
	if (ctr)
		p = cap_proto_ctr_put(p, req->ctr);
	CAP_BUG_ON((size_t)(p - h) != CAP_PROTO_HEADER + size);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

/* Read one length-prefixed string into a new NUL-terminated copy. */
static int rd_str(struct reader *r, char **out)
{
	uint32_t n;
	if (rd_u32(r, &n) < 0 || n > r->left)
		return -EBADMSG;
	if (memchr(r->p, '\0', n))
		return -EBADMSG;
	*out = xstrndup((const char *)r->p, n);
	r->p += n;
	r->left -= n;
	return 0;
}

static void free_strv(char **v, uint32_t n)
{
	if (!v)
		return;
	for (uint32_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* Read a counted list of strings. The count is checked against the bytes
 * left (each string takes at least 4) before anything is allocated. */
static int rd_strv(struct reader *r, uint32_t max, char ***out, uint32_t *count)
{
	uint32_t n;
	if (rd_u32(r, &n) < 0 || n > max || n > r->left / 4)
		return -EBADMSG;
	char **v = xcalloc((size_t)n + 1, sizeof(char *));
	for (uint32_t i = 0; i < n; i++) {
		if (rd_str(r, &v[i]) < 0) {
			free_strv(v, i);
			return -EBADMSG;
		}
	}
	*out = v;
	*count = n;
	return 0;
}

/* The user section of a CAP_EXEC_USER request (after pids_max): every
 * count checked against its bound and the bytes left, every value
 * against what setrlimit, setgroups and umask take. */
static int rd_user(struct reader *r, struct cap_exec_req *req, struct cap_err *err)
{
	if (rd_u32(r, &req->uid) < 0 || rd_u32(r, &req->gid) < 0 ||
	    rd_u32(r, &req->ngroups) < 0)
		return cap_err_set(err, EBADMSG, "exec request's user section is shorter than uid, gid and the group count");
	if (req->ngroups > CAP_EXEC_MAX_GROUPS || req->ngroups > r->left / 4)
		return cap_err_set(err, EBADMSG, "exec request has %u supplementary groups (at most %d, and as many as its bytes hold)",
				   req->ngroups, CAP_EXEC_MAX_GROUPS);
	for (uint32_t i = 0; i < req->ngroups; i++)
		rd_u32(r, &req->groups[i]);
	if (rd_u32(r, &req->nrlimits) < 0)
		return cap_err_set(err, EBADMSG, "exec request's user section ends before its rlimit count");
	if (req->nrlimits > CAP_EXEC_MAX_RLIMITS || req->nrlimits > r->left / 20)
		return cap_err_set(err, EBADMSG, "exec request has %u rlimits (at most %d, and as many as its bytes hold)",
				   req->nrlimits, CAP_EXEC_MAX_RLIMITS);
	for (uint32_t i = 0; i < req->nrlimits; i++) {
		struct cap_exec_rlimit *l = &req->rlimits[i];
		rd_u32(r, &l->resource);
		rd_u64(r, &l->soft);
		rd_u64(r, &l->hard);
		if (l->resource >= RLIMIT_NLIMITS)
			return cap_err_set(err, EBADMSG, "exec request's rlimit %u names resource %u (at most %d)",
					   i, l->resource, RLIMIT_NLIMITS - 1);
		if (l->soft > l->hard)
			return cap_err_set(err, EBADMSG, "exec request's rlimit %u (resource %u) has a soft limit over its hard limit",
					   i, l->resource);
	}
	if (rd_u32(r, &req->umask) < 0)
		return cap_err_set(err, EBADMSG, "exec request's user section ends before its umask");
	if (req->umask > 0777)
		return cap_err_set(err, EBADMSG, "exec request's umask %#o has bits beyond 0777", req->umask);
	return 0;
}

int cap_proto_exec_decode(const uint8_t *p, size_t n,
			  struct cap_exec_req *out, struct cap_err *err)
{
	struct reader r = { p, n };
	struct cap_exec_req req = { 0 };

	uint32_t winsize;
	if (rd_u32(&r, &req.timeout_ms) < 0 || rd_u32(&r, &req.output_cap) < 0 ||
	    rd_u32(&r, &req.flags) < 0 || rd_u32(&r, &winsize) < 0)
		return cap_err_set(err, EBADMSG, "exec request shorter than its fixed fields (%zu bytes)", n);
	req.rows = (uint16_t)(winsize & 0xffff);
	req.cols = (uint16_t)(winsize >> 16);
	if (req.flags & ~(CAP_EXEC_STDIN | CAP_EXEC_PTY | CAP_EXEC_USER | CAP_EXEC_NO_SYNC | CAP_EXEC_CONTAINER))
		return cap_err_set(err, EBADMSG, "exec request has unknown flags 0x%x", req.flags);
	if ((req.flags & CAP_EXEC_CONTAINER) && !(req.flags & CAP_EXEC_USER))
		return cap_err_set(err, EBADMSG, "exec request has a container section without CAP_EXEC_USER");
	if (rd_strv(&r, CAP_PROTO_MAX_ARGS, &req.argv, &req.argc) < 0)
		return cap_err_set(err, EBADMSG, "exec request has a malformed argument list");
	if (req.argc == 0) {
		free_strv(req.argv, 0);
		return cap_err_set(err, EBADMSG, "exec request has no command");
	}
	if (rd_strv(&r, CAP_PROTO_MAX_ARGS, &req.env, &req.envc) < 0) {
		free_strv(req.argv, req.argc);
		return cap_err_set(err, EBADMSG, "exec request has a malformed environment");
	}
	for (uint32_t i = 0; i < req.envc; i++) {
		if (!strchr(req.env[i], '=') || req.env[i][0] == '=') {
			int e = cap_err_set(err, EBADMSG, "exec environment entry %u is not NAME=value", i);
			cap_exec_req_fini(&req);
			return e;
		}
	}
	if (rd_str(&r, &req.cwd) < 0) {
		cap_exec_req_fini(&req);
		return cap_err_set(err, EBADMSG, "exec request has a malformed working directory");
	}
	int e = 0;
	if (req.flags & CAP_EXEC_USER) {
		if (rd_u32(&r, &req.pids_max) < 0)
			e = cap_err_set(err, EBADMSG, "exec request with CAP_EXEC_USER lacks its pids_max and user section");
		else
			e = rd_user(&r, &req, err);
		if (e == 0 && (req.flags & CAP_EXEC_CONTAINER)) {
			size_t used = 0;
			req.ctr = xmalloc(sizeof(*req.ctr));
			e = cap_proto_ctr_read(r.p, r.left, req.ctr, &used, err);
			r.p += used;
			r.left -= used;
		}
	} else if (r.left == 4) {
		rd_u32(&r, &req.pids_max);
	}
	if (e == 0 && r.left != 0)
		e = cap_err_set(err, EBADMSG, "exec request has %zu trailing bytes", r.left);
	if (e < 0) {
		cap_exec_req_fini(&req);
		return e;
	}
	*out = req;
	return 0;
}

void cap_exec_req_fini(struct cap_exec_req *req)
{
	free_strv(req->argv, req->argc);
	free_strv(req->env, req->envc);
	free(req->cwd);
	free(req->ctr);
	memset(req, 0, sizeof(*req));
}

/* --- EXIT ------------------------------------------------------------ */

void cap_proto_exit_encode(struct cap_buf *out, uint32_t stream,
			   const struct cap_exit *ex)
{
	uint8_t p[12];
	p[0] = ex->kind;
	p[1] = ex->flags;
	cap_put_u16(p + 2, ex->sync_ms);
	cap_put_u32(p + 4, (uint32_t)ex->value);
	cap_put_u32(p + 8, ex->duration_ms);
	cap_proto_put(out, CAP_MSG_EXIT, stream, p, sizeof(p));
}

int cap_proto_exit_decode(const uint8_t *p, size_t n, struct cap_exit *out)
{
	if (n != 12)
		return -EBADMSG;
	struct cap_exit ex = {
		.kind = p[0],
		.flags = p[1],
		.value = (int32_t)cap_get_u32(p + 4),
		.duration_ms = cap_get_u32(p + 8),
		.sync_ms = cap_get_u16(p + 2),
	};
	if (ex.flags & ~(CAP_EXIT_TIMED_OUT | CAP_EXIT_TRUNCATED | CAP_EXIT_DURABLE | CAP_EXIT_OOM))
		return -EBADMSG;
	switch (ex.kind) {
	case CAP_EXIT_CODE:
		if (ex.value < 0 || ex.value > 255)
			return -EBADMSG;
		break;
	case CAP_EXIT_SIGNAL:
		if (ex.value < 1 || ex.value > 64)
			return -EBADMSG;
		break;
	case CAP_EXIT_START_FAILED:
		if (ex.value < 1 || ex.value > 4095)
			return -EBADMSG;
		break;
	default:
		return -EBADMSG;
	}
	*out = ex;
	return 0;
}

int cap_exit_status(const struct cap_exit *ex)
{
	if (ex->flags & CAP_EXIT_TIMED_OUT)
		return 124;
	switch (ex->kind) {
	case CAP_EXIT_CODE:
		return ex->value;
	case CAP_EXIT_SIGNAL:
		return 128 + ex->value;
	default:
		return ex->value == ENOENT ? 127 : 126;
	}
}

/* --- HELLO, CLOCK, ERROR ---------------------------------------------------- */

void cap_proto_hello_encode_flags(struct cap_buf *out, const char *version, uint32_t flags)
{
	size_t vn = CAP_MIN(strlen(version), (size_t)CAP_PROTO_MAX_STRING);
	uint8_t p[8 + CAP_PROTO_MAX_STRING];
	cap_put_u32(p, CAP_PROTO_VERSION);
	cap_put_u32(p + 4, flags);
	memcpy(p + 8, version, vn);
	cap_proto_put(out, CAP_MSG_HELLO, 0, p, 8 + vn);
}

void cap_proto_hello_encode(struct cap_buf *out, const char *agent_version)
{
	cap_proto_hello_encode_flags(out, agent_version, 0);
}

int cap_proto_hello_flags(const uint8_t *p, size_t n, uint32_t *flags)
{
	if (n < 8)
		return -EBADMSG;
	*flags = cap_get_u32(p + 4);
	return 0;
}

void cap_proto_clock_encode(struct cap_buf *out, int64_t realtime_ns)
{
	uint8_t p[8];
	cap_put_u32(p, (uint32_t)((uint64_t)realtime_ns & 0xffffffffu));
	cap_put_u32(p + 4, (uint32_t)((uint64_t)realtime_ns >> 32));
	cap_proto_put(out, CAP_MSG_CLOCK, 0, p, sizeof(p));
}

int cap_proto_clock_decode(const uint8_t *p, size_t n, int64_t *realtime_ns)
{
	if (n != 8)
		return -EBADMSG;
	int64_t ns = (int64_t)(((uint64_t)cap_get_u32(p + 4) << 32) | cap_get_u32(p));
	if (ns <= 0)
		return -EBADMSG;
	*realtime_ns = ns;
	return 0;
}

/* Copy untrusted text into a bounded C string, replacing control bytes. */
static void copy_text(char *dst, size_t dlen, const uint8_t *src, size_t n)
{
	if (dlen == 0)
		return;
	size_t k = CAP_MIN(n, dlen - 1);
	for (size_t i = 0; i < k; i++) {
		uint8_t c = src[i];
		dst[i] = (c < 0x20 && c != '\t') || c == 0x7f ? '?' : (char)c;
	}
	dst[k] = '\0';
}

int cap_proto_hello_decode(const uint8_t *p, size_t n, uint32_t *version,
			   char *agent_version, size_t vlen)
{
	if (n < 8)
		return -EBADMSG;
	*version = cap_get_u32(p);
	copy_text(agent_version, vlen, p + 8, n - 8);
	return 0;
}

void cap_proto_error_encode(struct cap_buf *out, uint32_t stream, int errnum,
			    const char *msg)
{
	size_t mn = CAP_MIN(strlen(msg), (size_t)CAP_PROTO_MAX_STRING);
	uint8_t p[4 + CAP_PROTO_MAX_STRING];
	cap_put_u32(p, (uint32_t)errnum);
	memcpy(p + 4, msg, mn);
	cap_proto_put(out, CAP_MSG_ERROR, stream, p, 4 + mn);
}

int cap_proto_error_decode(const uint8_t *p, size_t n, int *errnum,
			   char *msg, size_t mlen)
{
	if (n < 4)
		return -EBADMSG;
	*errnum = (int)cap_get_u32(p);
	copy_text(msg, mlen, p + 4, n - 4);
	return 0;
}

/* --- SETUP ----------------------------------------------------------- */

bool cap_proto_valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 20)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* The network fields after the seed: u32 addr, u32 gateway, u32 dns,
 * u8 prefix, u16 proxy_port, u8 auto_publish. */
#define SETUP_NET_SIZE 16
/* Bounds of the secrets' fields (proto.h; docs/protocol.md). */
#define SETUP_MAX_CA_PEM (16 * 1024)
#define SETUP_MAX_ENV_STRING (8 * 1024)

/* A certificate's PEM text: printable ASCII, tabs and line ends only, so
 * that what the agent writes into the trust store stays lines of text. */
static bool ca_pem_ok(const char *s)
{
	size_t n = strlen(s);
	if (n > SETUP_MAX_CA_PEM)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c >= 0x7f)
			return false;
	}
	return true;
}

/* "NAME=value": NAME a shell variable name ([A-Za-z_][A-Za-z0-9_]*), the
 * whole at most SETUP_MAX_ENV_STRING bytes. The value is any bytes but
 * NUL (the decoder has refused those already). */
static bool env_string_ok(const char *s)
{
	size_t n = strlen(s);
	size_t name = strcspn(s, "=");
	return n <= SETUP_MAX_ENV_STRING && name < n && cap_env_name_ok(s, name);
}

/* Whether s has the optional secrets section (ca_pem, env): sent only
 * then, so that a SETUP without secrets still reaches older agents. */
static bool has_secrets(const struct cap_setup *s)
{
	return (s->ca_pem && *s->ca_pem) || s->envc > 0;
}

/* Linux's values, which the wire carries. */
_Static_assert(CAP_SETUP_TMPFS_FLAGS == (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME),
	       "CAP_SETUP_TMPFS_FLAGS");

bool cap_proto_setup_tmpfs_ok(const struct cap_setup_tmpfs *t)
{
	const char *d = t->destination;
	size_t n = strnlen(d, sizeof(t->destination));
	if (n == 0 || n >= sizeof(t->destination) || d[0] != '/' ||
	    strnlen(t->data, sizeof(t->data)) >= sizeof(t->data) ||
	    (t->flags & ~CAP_SETUP_TMPFS_FLAGS))
		return false;
	if (n == 1)
		return true;	/* "/": the agent refuses it, by name */
	if (d[n - 1] == '/')
		return false;
	for (const char *c = d + 1;;) {
		size_t k = strcspn(c, "/");
		if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.'))
			return false;
		c += k;
		if (!*c)
			return true;
		c++;
	}
}

/* The tmpfs list's size on the wire: u32 n, then per mount two strings
 * and u32 flags; 0 when a mount is not one the decoder takes. */
/* The static network on the wire: mac, u32 mtu, u32 n, then per route
 * u32 dst, u8 dst_len, u32 gateway. */
#define STATIC_FIXED 14
#define ROUTE_SIZE 9

bool cap_proto_setup_static_ok(const struct cap_setup *s)
{
	static const uint8_t zero[6];
	if (!s->net_addr || s->net_dns || s->proxy_port || s->net_prefix == 0 ||
	    s->net_prefix > 32 || (s->net_mac[0] & 1) || !memcmp(s->net_mac, zero, 6) ||
	    s->net_mtu < 68 || s->net_mtu > 65535 || s->nroutes > CAP_SETUP_MAX_ROUTES)
		return false;
	for (uint32_t i = 0; i < s->nroutes; i++) {
		const struct cap_setup_route *r = &s->routes[i];
		uint32_t mask = r->dst_len >= 32 ? 0xffffffffu : ~(0xffffffffu >> r->dst_len);
		if (r->dst_len == 0 || r->dst_len > 32 || (r->dst & ~mask))
			return false;
	}
	return true;
}

/* The options section's static network into out (bit 2 of its flags). */
static int rd_static(struct reader *r, struct cap_setup *out)
{
	uint32_t n;
	if (r->left < STATIC_FIXED)
		return -EBADMSG;
	memcpy(out->net_mac, r->p, 6);
	out->net_mtu = cap_get_u32(r->p + 6);
	n = cap_get_u32(r->p + 10);
	r->p += STATIC_FIXED;
	r->left -= STATIC_FIXED;
	if (n > CAP_SETUP_MAX_ROUTES || r->left < (size_t)n * ROUTE_SIZE)
		return -EBADMSG;
	for (uint32_t i = 0; i < n; i++) {
		out->routes[i].dst = cap_get_u32(r->p);
		out->routes[i].dst_len = r->p[4];
		out->routes[i].gateway = cap_get_u32(r->p + 5);
		r->p += ROUTE_SIZE;
		r->left -= ROUTE_SIZE;
	}
	out->nroutes = n;
	out->net_static = true;
	return 0;
}

static size_t tmpfs_size(const struct cap_setup *s)
{
	size_t size = 4;
	if (s->ntmpfs > CAP_SETUP_MAX_TMPFS || !s->tmpfs)
		return 0;
	for (uint32_t i = 0; i < s->ntmpfs; i++) {
		if (!cap_proto_setup_tmpfs_ok(&s->tmpfs[i]))
			return 0;
		size += str_size(s->tmpfs[i].destination) + str_size(s->tmpfs[i].data) + 4;
	}
	return size;
}

int cap_proto_setup_encode(struct cap_buf *out, const struct cap_setup *s)
{
	const char *v[] = { s->root_image, s->root_upper, s->work, s->source, s->hostname };
	uint32_t flags = (s->root_readonly ? CAP_SETUP_ROOT_READONLY : 0) |
			 (s->ntmpfs ? CAP_SETUP_TMPFS : 0) | (s->net_static ? CAP_SETUP_STATIC_NET : 0) |
			 (s->tools_root ? CAP_SETUP_TOOLS_ROOT : 0) | (s->forked ? CAP_SETUP_FORKED : 0);
	size_t tmpfs = s->ntmpfs ? tmpfs_size(s) : 0;
	bool has_ws = s->workspace && *s->workspace;
	bool workspace = has_ws || flags;	/* the section, its serial "" without one */
	bool secrets = has_secrets(s) || workspace;
	if (s->net_prefix > 32 || s->envc > CAP_SETUP_MAX_ENV || (s->envc && !s->env))
		return -EINVAL;
	if (has_ws && !cap_proto_valid_name(s->workspace))
		return -EINVAL;
	if (s->ntmpfs && !tmpfs)
		return -EINVAL;
	if (s->net_static && !cap_proto_setup_static_ok(s))
		return -EINVAL;
	size_t size = 8 + sizeof(s->seed) + SETUP_NET_SIZE;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		if (v[i] && *v[i] && !cap_proto_valid_name(v[i]))
			return -EINVAL;
		size += str_size(v[i]);
	}
	if (secrets) {
		if (s->ca_pem && !ca_pem_ok(s->ca_pem))
			return -EINVAL;
		size += str_size(s->ca_pem) + 4;
		for (uint32_t i = 0; i < s->envc; i++) {
			if (!s->env[i] || !env_string_ok(s->env[i]))
				return -EINVAL;
			size += str_size(s->env[i]);
		}
	}
	if (workspace)
		size += str_size(has_ws ? s->workspace : "");
	if (flags)
		size += 4 + tmpfs;
	if (s->net_static)
		size += STATIC_FIXED + ROUTE_SIZE * (size_t)s->nroutes;
	if (size > CAP_PROTO_MAX_PAYLOAD)
		return -E2BIG;

	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	uint8_t *q = h + CAP_PROTO_HEADER;
	put_header(h, CAP_MSG_SETUP, 0, size);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++)
		q = put_str(q, v[i]);
	cap_put_u32(q, (uint32_t)((uint64_t)s->realtime_ns & 0xffffffffu));
	cap_put_u32(q + 4, (uint32_t)((uint64_t)s->realtime_ns >> 32));
	memcpy(q + 8, s->seed, sizeof(s->seed));
	q += 8 + sizeof(s->seed);
	cap_put_u32(q, s->net_addr);
	cap_put_u32(q + 4, s->net_gateway);
	cap_put_u32(q + 8, s->net_dns);
	q[12] = s->net_prefix;
	cap_put_u16(q + 13, s->proxy_port);
	q[15] = s->auto_publish ? 1 : 0;
	q += SETUP_NET_SIZE;
	if (secrets) {
		q = put_str(q, s->ca_pem);
		cap_put_u32(q, s->envc);
		q += 4;
		for (uint32_t i = 0; i < s->envc; i++)
			q = put_str(q, s->env[i]);
	}
	if (workspace)
		q = put_str(q, has_ws ? s->workspace : "");
	if (flags) {
		cap_put_u32(q, flags);
		q += 4;
	}
	if (s->ntmpfs) {
		cap_put_u32(q, s->ntmpfs);
		q += 4;
		for (uint32_t i = 0; i < s->ntmpfs; i++) {
			q = put_str(q, s->tmpfs[i].destination);
			q = put_str(q, s->tmpfs[i].data);
			cap_put_u32(q, s->tmpfs[i].flags);
			q += 4;
		}
	}
	if (s->net_static) {
		memcpy(q, s->net_mac, 6);
		cap_put_u32(q + 6, s->net_mtu);
		cap_put_u32(q + 10, s->nroutes);
		q += STATIC_FIXED;
		for (uint32_t i = 0; i < s->nroutes; i++) {
			cap_put_u32(q, s->routes[i].dst);
			q[4] = s->routes[i].dst_len;
			cap_put_u32(q + 5, s->routes[i].gateway);
			q += ROUTE_SIZE;
		}
	}
	CAP_BUG_ON((size_t)(q - h) != CAP_PROTO_HEADER + size);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

/* The options section's tmpfs list: u32 n (1 to CAP_SETUP_MAX_TMPFS),
 * then n of (destination, data, u32 flags), each one
 * cap_proto_setup_tmpfs_ok takes. *out is new (free it). */
static int rd_tmpfs(struct reader *r, struct cap_setup_tmpfs **out, uint32_t *count)
{
	uint32_t n;
	if (rd_u32(r, &n) < 0 || n == 0 || n > CAP_SETUP_MAX_TMPFS || n > r->left / 12)
		return -EBADMSG;
	struct cap_setup_tmpfs *t = xcalloc(n, sizeof(*t));
	for (uint32_t i = 0; i < n; i++) {
		if (rd_str_into(r, t[i].destination, sizeof(t[i].destination)) < 0 ||
		    rd_str_into(r, t[i].data, sizeof(t[i].data)) < 0 ||
		    rd_u32(r, &t[i].flags) < 0 || !cap_proto_setup_tmpfs_ok(&t[i])) {
			free(t);
			return -EBADMSG;
		}
	}
	*out = t;
	*count = n;
	return 0;
}

/* The secrets section: string ca_pem ("" for none), u32 envc, envc
 * strings; then the optional workspace section: one string, the serial of
 * the /workspace disk; then the optional options section: u32 flags, not
 * 0, only known bits, and with CAP_SETUP_TMPFS the tmpfs list. All of it
 * must be used. The secrets section is empty only when the workspace
 * section follows it, the workspace section only when the options section
 * does. */
static int rd_sections(struct reader *r, char **ca_pem, char ***env, uint32_t *envc,
		       char **workspace, uint32_t *flags, struct cap_setup_tmpfs **tmpfs,
		       uint32_t *ntmpfs, struct cap_setup *st)
{
	char *ca = NULL, *ws = NULL;
	char **v = NULL;
	struct cap_setup_tmpfs *t = NULL;
	uint32_t n = 0, fl = 0, nt = 0;
	if (rd_str(r, &ca) < 0)
		return -EBADMSG;
	if (!ca_pem_ok(ca) || rd_strv(r, CAP_SETUP_MAX_ENV, &v, &n) < 0)
		goto bad;
	for (uint32_t i = 0; i < n; i++)
		if (!env_string_ok(v[i]))
			goto bad;
	if (r->left > 0 && (rd_str(r, &ws) < 0 || (*ws && !cap_proto_valid_name(ws))))
		goto bad;
	if (r->left > 0 && (rd_u32(r, &fl) < 0 || fl == 0 ||
			    (fl & ~(CAP_SETUP_ROOT_READONLY | CAP_SETUP_TMPFS | CAP_SETUP_STATIC_NET |
				    CAP_SETUP_TOOLS_ROOT | CAP_SETUP_FORKED))))
		goto bad;	/* an empty options section is never sent */
	if ((fl & CAP_SETUP_TMPFS) && rd_tmpfs(r, &t, &nt) < 0)
		goto bad;
	if ((fl & CAP_SETUP_STATIC_NET) && rd_static(r, st) < 0)
		goto bad;
	if (r->left != 0)
		goto bad;
	if (ws && !*ws && fl == 0)
		goto bad;	/* an empty workspace section comes only before options */
	if (!*ca && n == 0 && !ws)
		goto bad;	/* an empty secrets section comes only before a workspace */
	if (ws && !*ws) {
		free(ws);
		ws = NULL;
	}
	if (!*ca) {
		free(ca);
		ca = NULL;
	}
	if (n == 0) {
		free(v);
		v = NULL;
	}
	*ca_pem = ca;
	*env = v;
	*envc = n;
	*workspace = ws;
	*flags = fl;
	*tmpfs = t;
	*ntmpfs = nt;
	return 0;
bad:
	free(t);
	free(ca);
	free(ws);
	free_strv(v, n);
	return -EBADMSG;
}

int cap_proto_setup_decode(const uint8_t *p, size_t n, struct cap_setup *out)
{
	struct reader r = { p, n };
	char *v[5] = { 0 };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		if (rd_str(&r, &v[i]) < 0 || (*v[i] && !cap_proto_valid_name(v[i]))) {
			for (size_t j = 0; j <= i; j++)
				free(v[j]);
			return -EBADMSG;
		}
	}
	uint32_t lo, hi;
	const uint8_t *net = NULL, *seed = NULL;
	char *ca_pem = NULL, **env = NULL, *workspace = NULL;
	struct cap_setup_tmpfs *tmpfs = NULL;
	uint32_t envc = 0, flags = 0, ntmpfs = 0;
	struct cap_setup st = { 0 };
	if (rd_u32(&r, &lo) == 0 && rd_u32(&r, &hi) == 0 &&
	    r.left >= sizeof(out->seed) + SETUP_NET_SIZE) {
		seed = r.p;
		net = r.p + sizeof(out->seed);
		r.p += sizeof(out->seed) + SETUP_NET_SIZE;
		r.left -= sizeof(out->seed) + SETUP_NET_SIZE;
	}
	if (!net || net[12] > 32 || net[15] > 1 ||
	    (r.left > 0 && rd_sections(&r, &ca_pem, &env, &envc, &workspace, &flags, &tmpfs,
						&ntmpfs, &st) < 0)) {
		for (size_t j = 0; j < CAP_ARRAY_SIZE(v); j++)
			free(v[j]);
		return -EBADMSG;
	}
	*out = (struct cap_setup){ .root_image = v[0], .root_upper = v[1], .work = v[2],
				   .source = v[3], .hostname = v[4],
				   .realtime_ns = (int64_t)(((uint64_t)hi << 32) | lo),
				   .net_addr = cap_get_u32(net),
				   .net_gateway = cap_get_u32(net + 4),
				   .net_dns = cap_get_u32(net + 8),
				   .net_prefix = net[12],
				   .proxy_port = cap_get_u16(net + 13),
				   .auto_publish = net[15] == 1,
				   .ca_pem = ca_pem, .env = env, .envc = envc,
				   .workspace = workspace ? workspace : xstrdup(""),
				   .root_readonly = flags & CAP_SETUP_ROOT_READONLY,
				   .tools_root = flags & CAP_SETUP_TOOLS_ROOT,
				   .forked = flags & CAP_SETUP_FORKED,
				   .tmpfs = tmpfs, .ntmpfs = ntmpfs };
	memcpy(out->seed, seed, sizeof(out->seed));
	if (st.net_static) {
		out->net_static = true;
		memcpy(out->net_mac, st.net_mac, 6);
		out->net_mtu = st.net_mtu;
		memcpy(out->routes, st.routes, sizeof(st.routes));
		out->nroutes = st.nroutes;
		if (!cap_proto_setup_static_ok(out)) {
			cap_setup_fini(out);
			return -EBADMSG;
		}
	}
	return 0;
}

void cap_setup_fini(struct cap_setup *s)
{
	free(s->root_image);
	free(s->root_upper);
	free(s->work);
	free(s->source);
	free(s->hostname);
	free(s->workspace);
	free(s->ca_pem);
	free_strv(s->env, s->envc);
	free(s->tmpfs);
	memset(s, 0, sizeof(*s));
}

/* --- LISTENERS ------------------------------------------------------- */

/* Ports acceptable in LISTENERS: nonzero and strictly increasing. */
static bool ports_ok(const uint16_t *ports, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (ports[i] == 0 || (i > 0 && ports[i] <= ports[i - 1]))
			return false;
	return true;
}

int cap_proto_listeners_encode(struct cap_buf *out, const uint16_t *ports, uint32_t n)
{
	if (n > CAP_PROTO_MAX_LISTENERS || !ports_ok(ports, n))
		return -EINVAL;
	size_t size = 4 + 2 * (size_t)n;
	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	uint8_t *p = h + CAP_PROTO_HEADER;
	put_header(h, CAP_MSG_LISTENERS, 0, size);
	cap_put_u32(p, n);
	for (uint32_t i = 0; i < n; i++)
		cap_put_u16(p + 4 + 2 * i, ports[i]);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

int cap_proto_listeners_decode(const uint8_t *p, size_t n, uint16_t **ports, uint32_t *count)
{
	if (n < 4)
		return -EBADMSG;
	uint32_t k = cap_get_u32(p);
	if (k > CAP_PROTO_MAX_LISTENERS || n != 4 + 2 * (size_t)k)
		return -EBADMSG;
	/* One element even for an empty set: a non-NULL result to free. */
	uint16_t *v = xmalloc(sizeof(uint16_t) * (k ? k : 1));
	for (uint32_t i = 0; i < k; i++)
		v[i] = cap_get_u16(p + 4 + 2 * i);
	if (!ports_ok(v, k)) {
		free(v);
		return -EBADMSG;
	}
	*ports = v;
	*count = k;
	return 0;
}

/* --- CONNECT -------------------------------------------------------- */

void cap_proto_connect_encode(struct cap_buf *out, uint32_t stream, uint16_t port)
{
	uint8_t b[2];
	cap_put_u16(b, port);
	cap_proto_put(out, CAP_MSG_CONNECT, stream, b, sizeof(b));
}

int cap_proto_connect_decode(const uint8_t *p, size_t n, uint16_t *port)
{
	if (n != 2 || cap_get_u16(p) == 0)
		return -EBADMSG;
	*port = cap_get_u16(p);
	return 0;
}

/* --- FILE ------------------------------------------------------------ */

bool cap_proto_file_path_ok(const char *path)
{
	size_t n = strlen(path);
	if (n > 4096 || path[0] == '/')
		return false;
	for (const char *c = path; *c;) {
		size_t k = strcspn(c, "/");
		if (k == 2 && c[0] == '.' && c[1] == '.')
			return false;
		c += k;
		if (*c == '/')
			c++;
	}
	return true;
}

static bool file_root_ok(const char *root)
{
	return cap_guest_file_root(root) != NULL;
}

int cap_proto_file_encode(struct cap_buf *out, uint32_t stream,
			  const struct cap_file_req *req)
{
	if (!file_root_ok(req->root) || !cap_proto_file_path_ok(req->path) ||
	    req->op < CAP_FILE_READ || req->op > CAP_FILE_TAR_IN)
		return -EINVAL;
	size_t size = 12 + str_size(req->root) + str_size(req->path) + req->len;
	if (size > CAP_PROTO_MAX_PAYLOAD)
		return -E2BIG;
	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	uint8_t *p = h + CAP_PROTO_HEADER;
	put_header(h, CAP_MSG_FILE, stream, size);
	cap_put_u32(p, req->op);
	cap_put_u32(p + 4, req->limit);
	cap_put_u32(p + 8, req->limit_entries);
	p = put_str(p + 12, req->root);
	p = put_str(p, req->path);
	if (req->len)
		memcpy(p, req->data, req->len);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

int cap_proto_file_decode(const uint8_t *p, size_t n, struct cap_file_req *out,
			  char *root, size_t rlen, char *path, size_t plen)
{
	struct reader r = { p, n };
	struct cap_file_req req = { 0 };
	if (rd_u32(&r, &req.op) < 0 || rd_u32(&r, &req.limit) < 0 ||
	    rd_u32(&r, &req.limit_entries) < 0 || rd_str_into(&r, root, rlen) < 0 ||
	    rd_str_into(&r, path, plen) < 0)
		return -EBADMSG;
	if (req.op < CAP_FILE_READ || req.op > CAP_FILE_TAR_IN || !file_root_ok(root) ||
	    !cap_proto_file_path_ok(path))
		return -EBADMSG;
	req.root = root;
	req.path = path;
	req.data = r.p;
	req.len = r.left;
	*out = req;
	return 0;
}
