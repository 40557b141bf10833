/* The codec of a pod's containers (docs/protocol.md, "Containers"): an
 * EXEC's container section, UPDATE, STATS and its answer. Every count
 * and length is checked against its bound and the bytes left before it
 * is used; nothing is allocated for what the peer claims. */
#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proto-int.h"
#include "util.h"

bool cap_proto_ctr_name_ok(const char *s)
{
	size_t n = strnlen(s, CAP_CTR_NAME_MAX + 1);
	if (n == 0 || n > CAP_CTR_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
		if (!alnum && (i == 0 || !strchr("_.+-", c)))
			return false;
	}
	return true;
}

bool cap_proto_limits_ok(const struct cap_limits *l)
{
	if (l->set & ~CAP_LIMIT_ALL)
		return false;
	if ((l->set & CAP_LIMIT_MEMORY) && l->memory_max < 4096)
		return false;
	if ((l->set & CAP_LIMIT_CPU) &&
	    (l->cpu_quota < 1000 || l->cpu_period < 1000 || l->cpu_period > 1000000))
		return false;
	if ((l->set & CAP_LIMIT_CPU_WEIGHT) && (l->cpu_weight < 1 || l->cpu_weight > 10000))
		return false;
	if ((l->set & CAP_LIMIT_PIDS) && l->pids_max < 1)
		return false;
	return true;
}

/* --- the bytes ----------------------------------------------------------- */

/* limits: u32 set, then five u64: memory_max, cpu_quota, cpu_period,
 * cpu_weight, pids_max (0 when not set). */
#define LIMITS_SIZE (4 + 5 * 8)

static uint8_t *wr_limits(uint8_t *p, const struct cap_limits *l)
{
	cap_put_u32(p, l->set);
	p = put_u64(p + 4, l->set & CAP_LIMIT_MEMORY ? l->memory_max : 0);
	p = put_u64(p, l->set & CAP_LIMIT_CPU ? l->cpu_quota : 0);
	p = put_u64(p, l->set & CAP_LIMIT_CPU ? l->cpu_period : 0);
	p = put_u64(p, l->set & CAP_LIMIT_CPU_WEIGHT ? l->cpu_weight : 0);
	return put_u64(p, l->set & CAP_LIMIT_PIDS ? l->pids_max : 0);
}

static int rd_limits(struct reader *r, struct cap_limits *l)
{
	memset(l, 0, sizeof(*l));
	if (rd_u32(r, &l->set) < 0 || rd_u64(r, &l->memory_max) < 0 || rd_u64(r, &l->cpu_quota) < 0 ||
	    rd_u64(r, &l->cpu_period) < 0 || rd_u64(r, &l->cpu_weight) < 0 || rd_u64(r, &l->pids_max) < 0)
		return -EBADMSG;
	/* One spelling per value: a limit not set is sent as 0. */
	if ((!(l->set & CAP_LIMIT_MEMORY) && l->memory_max) ||
	    (!(l->set & CAP_LIMIT_CPU) && (l->cpu_quota || l->cpu_period)) ||
	    (!(l->set & CAP_LIMIT_CPU_WEIGHT) && l->cpu_weight) || (!(l->set & CAP_LIMIT_PIDS) && l->pids_max))
		return -EBADMSG;
	return cap_proto_limits_ok(l) ? 0 : -EBADMSG;
}

static bool mount_ok(const struct cap_ctr_mount *m)
{
	struct cap_setup_tmpfs t = { .flags = m->flags };
	if (m->kind < CAP_CTR_PROC || m->kind > CAP_CTR_MOUNT_MAX_ ||
	    strnlen(m->destination, sizeof(m->destination)) >= sizeof(m->destination) ||
	    strnlen(m->data, sizeof(m->data)) >= sizeof(m->data))
		return false;
	memcpy(t.destination, m->destination, sizeof(t.destination));
	memcpy(t.data, m->data, sizeof(t.data));
	if (!cap_proto_setup_tmpfs_ok(&t) || strcmp(m->destination, "/") == 0)
		return false;
	return m->kind != CAP_CTR_VOLUME || cap_proto_ctr_name_ok(m->data);
}

/* Whether c is one the decoder takes. */
static bool ctr_ok(const struct cap_exec_container *c)
{
	if (!cap_proto_ctr_name_ok(c->name) || (c->options & ~(CAP_CTR_ROOT | CAP_CTR_READONLY | CAP_CTR_JOIN)) ||
	    ((c->options & CAP_CTR_READONLY) && !(c->options & CAP_CTR_ROOT)) ||
	    c->nmounts > CAP_CTR_MAX_MOUNTS || !cap_proto_limits_ok(&c->limits))
		return false;
	if ((c->options & CAP_CTR_JOIN) && (c->limits.set || c->nmounts || (c->options & CAP_CTR_READONLY)))
		return false;
	if (c->nmounts && !(c->options & CAP_CTR_ROOT))
		return false;
	for (uint32_t i = 0; i < c->nmounts; i++)
		if (!mount_ok(&c->mounts[i]))
			return false;
	return true;
}

size_t cap_proto_ctr_size(const struct cap_exec_container *c)
{
	if (!ctr_ok(c))
		return 0;
	size_t n = str_size(c->name) + 4 + LIMITS_SIZE + 4;
	for (uint32_t i = 0; i < c->nmounts; i++)
		n += 4 + str_size(c->mounts[i].destination) + str_size(c->mounts[i].data) + 4;
	return n;
}

uint8_t *cap_proto_ctr_put(uint8_t *p, const struct cap_exec_container *c)
{
	p = put_str(p, c->name);
	cap_put_u32(p, c->options);
	p = wr_limits(p + 4, &c->limits);
	cap_put_u32(p, c->nmounts);
	p += 4;
	for (uint32_t i = 0; i < c->nmounts; i++) {
		cap_put_u32(p, c->mounts[i].kind);
		p = put_str(p + 4, c->mounts[i].destination);
		p = put_str(p, c->mounts[i].data);
		cap_put_u32(p, c->mounts[i].flags);
		p += 4;
	}
	return p;
}

int cap_proto_ctr_read(const uint8_t *p, size_t n, struct cap_exec_container *out, size_t *used,
		       struct cap_err *err)
{
	struct reader r = { p, n };
	memset(out, 0, sizeof(*out));
	if (rd_str_into(&r, out->name, sizeof(out->name)) < 0 || rd_u32(&r, &out->options) < 0)
		return cap_err_set(err, EBADMSG, "exec request's container section lacks its name or options");
	if (rd_limits(&r, &out->limits) < 0)
		return cap_err_set(err, EBADMSG, "exec request's container section has malformed limits");
	if (rd_u32(&r, &out->nmounts) < 0 || out->nmounts > CAP_CTR_MAX_MOUNTS || out->nmounts > r.left / 16)
		return cap_err_set(err, EBADMSG, "exec request's container section has a bad mount count (at most %d)",
				   CAP_CTR_MAX_MOUNTS);
	for (uint32_t i = 0; i < out->nmounts; i++) {
		struct cap_ctr_mount *m = &out->mounts[i];
		if (rd_u32(&r, &m->kind) < 0 || rd_str_into(&r, m->destination, sizeof(m->destination)) < 0 ||
		    rd_str_into(&r, m->data, sizeof(m->data)) < 0 || rd_u32(&r, &m->flags) < 0)
			return cap_err_set(err, EBADMSG, "exec request's container mount %u is malformed", i);
	}
	if (!ctr_ok(out))
		return cap_err_set(err, EBADMSG, "exec request's container section breaks a rule (its name, options, limits or a mount)");
	*used = n - r.left;
	return 0;
}

/* --- UPDATE ---------------------------------------------------------------- */

int cap_proto_update_encode(struct cap_buf *out, uint32_t stream, const struct cap_update *u)
{
	if ((u->op != CAP_UPDATE_LIMITS && u->op != CAP_UPDATE_REMOVE) || !cap_proto_ctr_name_ok(u->name) ||
	    !cap_proto_limits_ok(&u->limits) || (u->op == CAP_UPDATE_REMOVE && u->limits.set))
		return -EINVAL;
	size_t size = 4 + str_size(u->name) + LIMITS_SIZE;
	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	cap_put_u32(h, (uint32_t)size);
	cap_put_u16(h + 4, CAP_MSG_UPDATE);
	cap_put_u16(h + 6, 0);
	cap_put_u32(h + 8, stream);
	uint8_t *p = h + CAP_PROTO_HEADER;
	cap_put_u32(p, u->op);
	p = put_str(p + 4, u->name);
	p = wr_limits(p, &u->limits);
	CAP_BUG_ON((size_t)(p - h) != CAP_PROTO_HEADER + size);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

int cap_proto_update_decode(const uint8_t *p, size_t n, struct cap_update *out)
{
	struct reader r = { p, n };
	struct cap_update u;
	memset(&u, 0, sizeof(u));
	if (rd_u32(&r, &u.op) < 0 || rd_str_into(&r, u.name, sizeof(u.name)) < 0 || rd_limits(&r, &u.limits) < 0 ||
	    r.left != 0)
		return -EBADMSG;
	if ((u.op != CAP_UPDATE_LIMITS && u.op != CAP_UPDATE_REMOVE) || !cap_proto_ctr_name_ok(u.name) ||
	    (u.op == CAP_UPDATE_REMOVE && u.limits.set))
		return -EBADMSG;
	*out = u;
	return 0;
}

/* --- STATS ----------------------------------------------------------------- */

int cap_proto_stats_req_encode(struct cap_buf *out, uint32_t stream, const char *name)
{
	if (*name && !cap_proto_ctr_name_ok(name))
		return -EINVAL;
	size_t size = str_size(name);
	uint8_t *h = cap_buf_reserve(out, CAP_PROTO_HEADER + size);
	cap_put_u32(h, (uint32_t)size);
	cap_put_u16(h + 4, CAP_MSG_STATS);
	cap_put_u16(h + 6, 0);
	cap_put_u32(h + 8, stream);
	put_str(h + CAP_PROTO_HEADER, name);
	cap_buf_commit(out, CAP_PROTO_HEADER + size);
	return 0;
}

int cap_proto_stats_req_decode(const uint8_t *p, size_t n, char *name, size_t len)
{
	struct reader r = { p, n };
	if (len < CAP_CTR_NAME_MAX + 1 || rd_str_into(&r, name, CAP_CTR_NAME_MAX + 1) < 0 || r.left != 0 ||
	    (*name && !cap_proto_ctr_name_ok(name)))
		return -EBADMSG;
	return 0;
}

static bool key_ok(const char *k)
{
	size_t n = strnlen(k, CAP_STATS_KEY_MAX + 1);
	if (n == 0 || n > CAP_STATS_KEY_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_' || k[i] == '.'))
			return false;
	return true;
}

const uint64_t *cap_stats_get(const struct cap_stats *s, const char *key)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i].key, key) == 0)
			return &s->v[i].value;
	return NULL;
}

bool cap_stats_put(struct cap_stats *s, const char *key, uint64_t value)
{
	if (!key_ok(key))
		return false;
	for (uint32_t i = 0; i < s->n; i++) {
		if (strcmp(s->v[i].key, key) == 0) {
			s->v[i].value = value;
			return true;
		}
	}
	if (s->n == CAP_STATS_MAX)
		return false;
	snprintf(s->v[s->n].key, sizeof(s->v[s->n].key), "%s", key);
	s->v[s->n++].value = value;
	return true;
}

void cap_proto_stats_encode(struct cap_buf *out, const struct cap_stats *s)
{
	size_t size = 4;
	for (uint32_t i = 0; i < s->n; i++)
		size += str_size(s->v[i].key) + 8;
	uint8_t *p = cap_buf_reserve(out, size), *start = p;
	cap_put_u32(p, s->n);
	p += 4;
	for (uint32_t i = 0; i < s->n; i++) {
		p = put_str(p, s->v[i].key);
		p = put_u64(p, s->v[i].value);
	}
	CAP_BUG_ON((size_t)(p - start) != size);
	cap_buf_commit(out, size);
}

int cap_proto_stats_decode(const uint8_t *p, size_t n, struct cap_stats *out)
{
	struct reader r = { p, n };
	uint32_t count;
	/* Each pair takes at least 13 bytes: a 1-byte key and its value. */
	if (rd_u32(&r, &count) < 0 || count > CAP_STATS_MAX || count > r.left / 13)
		return -EBADMSG;
	out->n = 0;
	for (uint32_t i = 0; i < count; i++) {
		char key[CAP_STATS_KEY_MAX + 1];
		uint64_t v;
		if (rd_str_into(&r, key, sizeof(key)) < 0 || rd_u64(&r, &v) < 0 || !key_ok(key) || cap_stats_get(out, key))
			return -EBADMSG;
		cap_stats_put(out, key, v);
	}
	return r.left == 0 ? 0 : -EBADMSG;
}
