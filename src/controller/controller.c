/* The controller: identities, their queues of calls, the idle lifecycle,
 * capacity, shutdown and recovery. One thread, one poll loop; sandboxes
 * are named sandboxes run by their shims (src/sandbox), attached over
 * their control sockets, so a controller that dies leaves them running for
 * the next one to reattach. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "controller-internal.h"
#include "engine.h"
#include "named.h"
#include "paths.h"
#include "sha256.h"
#include "utf8.h"
#include "util.h"

void cap_controller_cfg_init(struct cap_controller_cfg *c)
{
	memset(c, 0, sizeof(*c));
	cap_lifecycle_cfg_init(&c->lc);
	c->image = "base";
	c->stop_grace_ms = 10000;
}

bool cap_controller_id_valid(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("._@+=:-", c)))
			return false;
	}
	return true;
}

int64_t ctl_now(const struct ctl *c)
{
	return cap_now_ms() + c->clock_offset;
}

/* --- identities ---------------------------------------------------------- */

/* The sandbox of an identity is named by a hash of it: stable, short, and
 * never derived from anything a model writes. */
static void sandbox_name(const char *agent, const char *peer, char out[CAP_NAME_MAX + 1])
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, agent, strlen(agent) + 1);
	cap_sha256_update(&h, peer, strlen(peer) + 1);
	cap_sha256_final_hex(&h, hex);
	snprintf(out, CAP_NAME_MAX + 1, "v-%.20s", hex);
}

static char *record_path(const struct ctl *c, const char *agent, const char *peer)
{
	return xasprintf("%s/workspaces/%s/%s/record.json", c->home, agent, peer);
}

struct ident *ctl_find(struct ctl *c, const char *agent, const char *peer)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (!i->pool && strcmp(i->agent, agent) == 0 && strcmp(i->peer, peer) == 0)
			return i;
	return NULL;
}

static struct ident *ident_new(struct ctl *c, const char *agent, const char *peer);

/* An identity known to this controller, made on first use (no VM yet). */
struct ident *ctl_ident(struct ctl *c, const char *agent, const char *peer)
{
	struct ident *i = ctl_find(c, agent, peer);
	return i ? i : ident_new(c, agent, peer);
}

static struct ident *ident_new(struct ctl *c, const char *agent, const char *peer)
{
	struct ident *i = xcalloc(1, sizeof(*i));
	snprintf(i->agent, sizeof(i->agent), "%s", agent);
	snprintf(i->peer, sizeof(i->peer), "%s", peer);
	/* The recorded sandbox if there is one (a warm-pool VM it was given),
	 * else the name derived from the identity. */
	_cleanup_free_ char *rp = record_path(c, agent, peer);
	json_t *j = *agent ? json_load_file(rp, 0, NULL) : NULL;
	const char *recorded = json_string_value(json_object_get(j, "sandbox"));
	if (recorded && cap_named_check_name(recorded, NULL) == 0)
		snprintf(i->name, sizeof(i->name), "%s", recorded);
	else
		sandbox_name(agent, peer, i->name);
	json_decref(j);
	i->lc.state = CAP_VM_NONE;
	i->ready_fd = -1;
	i->ctl = c;
	i->next = c->idents;
	c->idents = i;
	return i;
}

static int write_workspace(struct ctl *c, struct ident *i, struct cap_err *err)
{
	_cleanup_free_ char *path = record_path(c, i->agent, i->peer);
	_cleanup_free_ char *dir = xstrdup(path);
	*strrchr(dir, '/') = '\0';
	int r = cap_mkdir_p(dir, 0700);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", dir, strerror(-r));
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:I}", "schema", 1, "agent", i->agent,
			      "peer", i->peer, "sandbox", i->name, "created", (json_int_t)time(NULL));
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

/* --- calls ----------------------------------------------------------------- */

void call_free(struct call *k)
{
	if (!k)
		return;
	json_decref(k->id);
	for (uint32_t a = 0; a < k->req.argc; a++)
		free(k->req.argv[a]);
	free(k->req.argv);
	for (uint32_t a = 0; a < k->req.envc; a++)
		free(k->req.env[a]);
	free(k->req.env);
	free(k->req.cwd);
	free(k->stdin_data);
	cap_buf_fini(&k->out);
	cap_buf_fini(&k->err);
	free(k);
}

struct call *ctl_new_call(enum call_kind kind, struct conn *conn, json_t *id)
{
	struct call *k = xcalloc(1, sizeof(*k));
	k->kind = kind;
	k->conn = conn;
	k->id = id ? json_incref(id) : NULL;
	cap_buf_init(&k->out);
	cap_buf_init(&k->err);
	return k;
}

void ctl_file_call(struct call *k, enum cap_file_op op, const char *root,
		   const char *path, const void *data, size_t len)
{
	snprintf(k->root, sizeof(k->root), "%s", root);
	snprintf(k->path, sizeof(k->path), "%s", path);
	if (len) {
		k->stdin_data = xmalloc(len);
		memcpy(k->stdin_data, data, len);
		k->stdin_len = len;
	}
	k->file = (struct cap_file_req){
		.op = op, .limit = READ_MAX, .limit_entries = LIST_MAX,
		.root = k->root, .path = k->path,
		.data = (const uint8_t *)k->stdin_data, .len = len,
	};
}

/* Answer a call (if its client is still there) and free it. */
static void finish(struct ctl *c, struct call *k, json_t *result, int code,
		   const char *msg, json_t *data)
{
	if (k->reply)
		k->reply(c, k, result, code, msg, data);
	else if (k->conn && k->id)
		rpc_reply(c, k->conn, k->id, result, code, msg, data);
	else {
		json_decref(result);
		json_decref(data);
	}
	call_free(k);
}

static void unlink_call(struct ident *i, struct call *k)
{
	for (struct call **p = &i->queue; *p; p = &(*p)->next)
		if (*p == k) {
			*p = k->next;
			i->lc.queued--;
			return;
		}
}

static json_t *text_json(struct cap_buf *b)
{
	size_t n;
	char *s = cap_utf8_sanitize((const char *)cap_buf_head(b), cap_buf_used(b), &n);
	json_t *j = json_stringn(s, n);
	free(s);
	return j;
}

/* The active call ended (or failed): answer it and move the queue on. */
static void active_done(struct ctl *c, struct ident *i, json_t *result, int code,
			const char *msg, json_t *data)
{
	struct call *k = i->active;
	i->active = NULL;
	i->lc.active = 0;
	i->lc.idle_since = ctl_now(c);
	if (k)
		finish(c, k, result, code, msg, data);
	c->kick = true;
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct call *k = ud;
	(void)id;
	cap_buf_append(fd == 1 ? &k->out : &k->err, p, n);
}

/* Parse the agent's listing lines into [{name, type, size?}]. */
static json_t *parse_listing(struct cap_buf *b)
{
	json_t *a = json_array();
	size_t n;
	char *text = cap_utf8_sanitize((const char *)cap_buf_head(b), cap_buf_used(b), &n);
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		const char *type = line[0] == 'd' ? "directory" : line[0] == 'f' ? "file" :
				   line[0] == 'l' ? "symlink" : "other";
		char *name = line + 2;
		json_t *e = json_pack("{s:s}", "type", type);
		if (line[0] == 'f') {
			char *sp = strchr(name, ' ');
			if (!sp)
				continue;
			*sp = '\0';
			json_object_set_new(e, "size", json_integer(strtoll(name, NULL, 10)));
			name = sp + 1;
		}
		json_object_set_new(e, "name", json_string(name));
		json_array_append_new(a, e);
	}
	free(text);
	return a;
}

static void file_done(struct ctl *c, struct ident *i, struct call *k,
		      const struct cap_exit *ex)
{
	if (ex->kind != CAP_EXIT_CODE) {
		size_t n;
		char *why = cap_utf8_sanitize((const char *)cap_buf_head(&k->err),
					      CAP_MIN(cap_buf_used(&k->err), (size_t)800), &n);
		while (n > 0 && why[n - 1] == '\n')
			why[--n] = '\0';
		active_done(c, i, NULL, RPC_TOOL, *why ? why : "the file operation failed",
			    json_pack("{s:i}", "errno", ex->value));
		free(why);
		return;
	}
	if (k->file.op == CAP_FILE_WRITE) {
		active_done(c, i, json_pack("{s:s, s:s, s:I}", "sandbox", i->name, "path", k->path,
					    "bytes", (json_int_t)k->file.len), 0, NULL, NULL);
		return;
	}
	if (ex->value == 1) {
		active_done(c, i, json_pack("{s:s, s:s, s:o, s:b}", "sandbox", i->name, "kind", "directory",
					    "entries", parse_listing(&k->out),
					    "truncated", (ex->flags & CAP_EXIT_TRUNCATED) != 0), 0, NULL, NULL);
		return;
	}
	if (!cap_utf8_valid((const char *)cap_buf_head(&k->out), cap_buf_used(&k->out))) {
		active_done(c, i, NULL, RPC_TOOL, "the file is not UTF-8 text; read_file reads text only",
			    NULL);
		return;
	}
	active_done(c, i, json_pack("{s:s, s:s, s:s%}", "sandbox", i->name, "kind", "file", "content",
				    (const char *)cap_buf_head(&k->out), cap_buf_used(&k->out)), 0, NULL, NULL);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum,
		    const char *msg)
{
	struct call *k = ud;
	struct ident *i = k->ident;
	struct ctl *c = i->ctl;
	(void)id;
	if (k->cancelled) {
		active_done(c, i, NULL, RPC_CANCELLED, "request cancelled", NULL);
		return;
	}
	if (!ex) {
		active_done(c, i, NULL, RPC_SANDBOX, msg, json_pack("{s:i}", "errno", errnum));
		return;
	}
	if (k->kind == CALL_FILE) {
		file_done(c, i, k, ex);
		return;
	}
	json_t *r = json_pack("{s:s, s:o, s:o, s:b, s:b, s:o, s:o, s:i}", "sandbox", i->name,
			      "exit_code", ex->kind == CAP_EXIT_SIGNAL ? json_null() : json_integer(cap_exit_status(ex)),
			      "signal", ex->kind == CAP_EXIT_SIGNAL ? json_integer(ex->value) : json_null(),
			      "timed_out", (ex->flags & CAP_EXIT_TIMED_OUT) != 0,
			      "truncated", (ex->flags & CAP_EXIT_TRUNCATED) != 0,
			      "stdout", text_json(&k->out), "stderr", text_json(&k->err),
			      "duration_ms", (int)ex->duration_ms);
	active_done(c, i, r, 0, NULL, NULL);
}

static const struct cap_exec_events events = { on_output, on_done };

/* --- the VM of an identity -------------------------------------------------- */

static void detach(struct ident *i)
{
	cap_sandbox_free(i->sb);
	i->sb = NULL;
}

/* The VM went away under a call (crash, kill): fail what was running. */
static void vm_lost(struct ctl *c, struct ident *i, const char *why)
{
	fprintf(stderr, "capsule serve: sandbox %s (%s/%s): %s\n", i->name, i->agent, i->peer, why);
	detach(i);
	i->lc.state = CAP_VM_STOPPED;
	if (i->active && i->active->kind != CALL_STOP && i->active->kind != CALL_REMOVE)
		active_done(c, i, NULL, RPC_SANDBOX, why, NULL);
	c->kick = true;
}

void ctl_begin_stop(struct ctl *c, struct ident *i)
{
	if (i->lc.state == CAP_VM_STARTING) {
		i->stop_after_start = true;
		return;
	}
	if (!i->sb) {
		i->lc.state = CAP_VM_STOPPED;
		return;
	}
	cap_sandbox_stop_async(i->sb);
	i->lc.state = CAP_VM_STOPPING;
	i->stop_deadline = cap_now_ms() + c->cfg.stop_grace_ms + 5000;
}

/* Attach to the running shim of i. */
static int attach(struct ident *i, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(i->name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ECHILD, "the sandbox stopped while starting; see its shim.log");
	if ((r = cap_sandbox_attach(st.control, &i->sb, err)) < 0)
		return r;
	i->shim_pid = st.shim_pid;
	i->lc.state = st.state == CAP_NAMED_PAUSED ? CAP_VM_PAUSED : CAP_VM_RUNNING;
	return 0;
}

/* Make sure the identity has a sandbox and begin starting it. Returns 0
 * when starting or started, or -errno with err. */
static int begin_start(struct ctl *c, struct ident *i, struct cap_err *err)
{
	int r;
	if (i->lc.state == CAP_VM_NONE) {
		struct cap_record rec;
		if (cap_named_load(i->name, &rec, NULL) < 0) {
			cap_record_init(&rec);
			snprintf(rec.name, sizeof(rec.name), "%s", i->name);
			snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", c->cfg.image);
			if (c->cfg.source)
				snprintf(rec.source, sizeof(rec.source), "%s", c->cfg.source);
			/* The mapping first: a crash after it leaves a known
			 * sandbox, never an orphan disk. */
			if ((r = write_workspace(c, i, err)) < 0 || (r = cap_named_create(&rec, NULL, NULL, err)) < 0)
				return r;
		}
		i->lc.state = CAP_VM_STOPPED;
	}
	bool changed;
	bool has_source;
	if ((r = cap_named_refresh_source(i->name, &changed, &has_source, err)) < 0)
		return r;
	i->no_source = !has_source;
	if ((r = cap_named_start_begin(i->name, &i->ready_fd, err)) < 0)
		return r;
	if (i->ready_fd < 0)	/* already running (another client started it) */
		return attach(i, err);
	i->lc.state = CAP_VM_STARTING;
	return 0;
}

static void start_finished(struct ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	int fd = i->ready_fd;
	i->ready_fd = -1;
	if (cap_named_start_end(i->name, fd, &err) < 0 || attach(i, &err) < 0) {
		i->lc.state = CAP_VM_STOPPED;
		if (i->pool) {	/* do not retry in a tight loop */
			fprintf(stderr, "capsule %s: warm sandbox %s did not start: %s\n", c->fe->name, i->name, err.msg);
			c->pool_retry_at = cap_now_ms() + 30000;
		}
		/* Everything queued for it fails with the reason. */
		while (i->queue) {
			struct call *k = i->queue;
			unlink_call(i, k);
			finish(c, k, NULL, RPC_SANDBOX, err.msg, NULL);
		}
		i->lc.idle_since = ctl_now(c);
		return;
	}
	i->lc.idle_since = ctl_now(c);
	if (i->stop_after_start) {
		i->stop_after_start = false;
		ctl_begin_stop(c, i);
	}
	c->kick = true;
}

/* --- running the queue ------------------------------------------------------- */

static struct ident *ident_at(struct ctl *c, size_t idx)
{
	struct ident *i = c->idents;
	while (idx-- && i)
		i = i->next;
	return i;
}

/* Capacity: -1 room, 0 waiting for an eviction, -2 full of busy VMs. */
static int make_room(struct ctl *c)
{
	const struct cap_lc *v[512];
	size_t n = 0;
	bool stopping = false;
	for (struct ident *i = c->idents; i && n < CAP_ARRAY_SIZE(v); i = i->next) {
		v[n++] = &i->lc;
		stopping |= i->lc.state == CAP_VM_STOPPING;
	}
	int k = cap_lc_make_room(v, n, &c->cfg.lc);
	if (k >= 0) {
		struct ident *victim = ident_at(c, (size_t)k);
		fprintf(stderr, "capsule serve: at capacity (%u); stopping %s, idle the longest\n",
			c->cfg.lc.capacity, victim->name);
		ctl_begin_stop(c, victim);
		return 0;
	}
	if (k == -2 && stopping)
		return 0;	/* an eviction is under way: wait for it */
	return k;
}

static void start_call(struct ctl *c, struct ident *i, struct call *k)
{
	struct cap_err err = { 0 };
	unlink_call(i, k);
	i->active = k;
	i->lc.active = 1;
	k->start_ms = cap_now_ms();
	if (k->kind == CALL_STOP || k->kind == CALL_REMOVE) {
		ctl_begin_stop(c, i);
		return;	/* finished when the VM is gone (ctl_step) */
	}
	if (i->lc.state == CAP_VM_PAUSED) {
		cap_sandbox_vm_op(i->sb, false);
		i->lc.state = CAP_VM_RUNNING;
	}
	int r = k->kind == CALL_FILE
			? cap_sandbox_file(i->sb, &k->file, READ_MAX + LIST_MAX * 700 + 4096, &events, k, &k->stream, &err)
			: cap_sandbox_exec(i->sb, &k->req, &events, k, &k->stream, &err);
	if (r < 0) {
		active_done(c, i, NULL, err.code == EINVAL ? RPC_TOOL : RPC_SANDBOX, err.msg, NULL);
		return;
	}
	if (k->stdin_data && k->kind == CALL_EXEC) {
		cap_sandbox_stdin(i->sb, k->stream, k->stdin_data, k->stdin_len);
		cap_sandbox_stdin(i->sb, k->stream, NULL, 0);
	}
}

/* --- the warm pool ---------------------------------------------------------- */

static unsigned count_resident(struct ctl *c)
{
	unsigned n = 0;
	for (struct ident *i = c->idents; i; i = i->next)
		n += cap_vm_state_resident(i->lc.state);
	return n;
}

static struct ident *pool_ready(struct ctl *c)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (i->pool && i->sb && (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED))
			return i;
	return NULL;
}

static void unlink_ident(struct ctl *c, struct ident *x)
{
	for (struct ident **p = &c->idents; *p; p = &(*p)->next)
		if (*p == x) {
			*p = x->next;
			return;
		}
}

/* Give identity i (which has no sandbox) the ready pool VM p. */
static int take_from_pool(struct ctl *c, struct ident *i, struct ident *p, struct cap_err *err)
{
	char old[sizeof(i->name)];
	memcpy(old, i->name, sizeof(old));
	snprintf(i->name, sizeof(i->name), "%s", p->name);
	int r = write_workspace(c, i, err);	/* the mapping is the assignment */
	if (r < 0) {
		memcpy(i->name, old, sizeof(old));
		return r;
	}
	i->sb = p->sb;
	i->shim_pid = p->shim_pid;
	i->lc.state = p->lc.state;
	i->lc.idle_since = ctl_now(c);
	unlink_ident(c, p);
	free(p);
	fprintf(stderr, "capsule %s: %s/%s gets warm sandbox %s\n", c->fe->name, i->agent, i->peer, i->name);
	return 0;
}

static int begin_start(struct ctl *c, struct ident *i, struct cap_err *err);

/* Keep cfg.warm_pool sandboxes starting or ready, within capacity. */
static void pool_fill(struct ctl *c)
{
	if (c->shutting_down || !c->cfg.warm_pool || cap_now_ms() < c->pool_retry_at)
		return;
	unsigned members = 0;
	for (struct ident *i = c->idents; i; i = i->next) {
		if (!i->pool)
			continue;
		members++;
		if (i->lc.state == CAP_VM_STOPPED && count_resident(c) < c->cfg.lc.capacity) {
			struct cap_err err = { 0 };
			if (begin_start(c, i, &err) < 0) {
				fprintf(stderr, "capsule %s: warm sandbox %s: %s\n", c->fe->name, i->name, err.msg);
				c->pool_retry_at = cap_now_ms() + 30000;
				return;
			}
		}
	}
	while (members < c->cfg.warm_pool && count_resident(c) < c->cfg.lc.capacity) {
		uint8_t rnd[8];
		struct cap_err err = { 0 };
		struct cap_record rec;
		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
			return;
		struct ident *i = ident_new(c, "", "");
		i->pool = true;
		snprintf(i->name, sizeof(i->name), "pool-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
			 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
		cap_record_init(&rec);
		snprintf(rec.name, sizeof(rec.name), "%s", i->name);
		snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", c->cfg.image);
		if (c->cfg.source)
			snprintf(rec.source, sizeof(rec.source), "%s", c->cfg.source);
		if (cap_named_create(&rec, NULL, NULL, &err) < 0 || (i->lc.state = CAP_VM_STOPPED,
								      begin_start(c, i, &err)) < 0) {
			fprintf(stderr, "capsule %s: cannot prepare a warm sandbox: %s\n", c->fe->name, err.msg);
			unlink_ident(c, i);
			free(i);
			c->pool_retry_at = cap_now_ms() + 30000;
			return;
		}
		members++;
	}
}

/* Move one identity's queue forward as far as its VM allows. */
static void pump(struct ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	if (i->active || !i->queue)
		return;
	struct call *k = i->queue;
	switch (i->lc.state) {
	case CAP_VM_RUNNING:
	case CAP_VM_PAUSED:
		if ((k->kind == CALL_EXEC || k->kind == CALL_FILE) && !i->no_source) {
			/* Public data changed? Then restart before the call. */
			bool changed = false, has_source;
			if (cap_named_refresh_source(i->name, &changed, &has_source, &err) < 0) {
				unlink_call(i, k);
				finish(c, k, NULL, RPC_SANDBOX, err.msg, NULL);
				c->kick = true;
				return;
			}
			i->no_source = !has_source;
			if (changed) {
				detach(i);
				i->lc.state = CAP_VM_STOPPED;
				c->kick = true;
				return;
			}
		}
		start_call(c, i, k);
		return;
	case CAP_VM_NONE:
	case CAP_VM_STOPPED:
		if (k->kind == CALL_STOP || k->kind == CALL_REMOVE) {
			start_call(c, i, k);
			return;
		}
		struct ident *warm;
		if (i->lc.state == CAP_VM_NONE && (warm = pool_ready(c)) &&
		    cap_named_load(i->name, &(struct cap_record){ 0 }, NULL) < 0 &&
		    take_from_pool(c, i, warm, &err) == 0) {
			c->kick = true;	/* running now: the call starts next round */
			return;
		}
		switch (make_room(c)) {
		case -1:
			break;
		case 0:
			return;	/* wait for the eviction */
		default:
			unlink_call(i, k);
			finish(c, k, NULL, RPC_CAPACITY,
			       "every sandbox slot is busy with running calls; retry later",
			       json_pack("{s:b, s:i}", "retryable", 1, "capacity", c->cfg.lc.capacity));
			c->kick = true;
			return;
		}
		if (begin_start(c, i, &err) < 0) {
			unlink_call(i, k);
			finish(c, k, NULL, RPC_SANDBOX, err.msg, NULL);
			c->kick = true;
		}
		return;
	default:
		return;	/* starting or stopping: wait */
	}
}

/* The VM of i is gone after a stop: finish a stop/remove call. */
static void stopped(struct ctl *c, struct ident *i)
{
	detach(i);
	i->lc.state = CAP_VM_STOPPED;
	i->lc.idle_since = ctl_now(c);
	struct call *k = i->active;
	if (k && k->kind == CALL_STOP) {
		active_done(c, i, json_pack("{s:s, s:s}", "sandbox", i->name, "state", "stopped"), 0, NULL, NULL);
	} else if (k && k->kind == CALL_REMOVE) {
		struct cap_err err = { 0 };
		if (cap_named_remove(i->name, true, &err) < 0) {
			active_done(c, i, NULL, RPC_SANDBOX, err.msg, NULL);
		} else {
			_cleanup_free_ char *rec = record_path(c, i->agent, i->peer);
			unlink(rec);
			i->lc.state = CAP_VM_NONE;
			active_done(c, i, json_pack("{s:s, s:s}", "sandbox", i->name, "state", "removed"), 0, NULL, NULL);
		}
	}
	c->kick = true;
}

/* --- cancellation ------------------------------------------------------------ */

bool ctl_cancel(struct ctl *c, struct call *k, bool reply)
{
	struct ident *i = k->ident;
	if (i->active == k) {
		if (k->kind == CALL_STOP || k->kind == CALL_REMOVE)
			return false;	/* a stop is not taken back */
		k->cancelled = true;
		if (!reply)
			k->conn = NULL;
		if (i->sb)
			cap_sandbox_signal(i->sb, k->stream, SIGKILL);
		return true;
	}
	unlink_call(i, k);
	if (!reply)
		k->conn = NULL;
	finish(c, k, NULL, RPC_CANCELLED, "request cancelled", NULL);
	c->kick = true;
	return true;
}

struct call *ctl_find_call(struct ctl *c, struct conn *conn, json_t *id)
{
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->active && i->active->conn == conn && json_equal(i->active->id, id))
			return i->active;
		for (struct call *k = i->queue; k; k = k->next)
			if (k->conn == conn && json_equal(k->id, id))
				return k;
	}
	return NULL;
}

void ctl_conn_gone(struct ctl *c, struct conn *conn)
{
	for (struct ident *i = c->idents; i; i = i->next) {
		struct call *k = i->queue, *next;
		for (; k; k = next) {
			next = k->next;
			if (k->conn == conn)
				ctl_cancel(c, k, false);
		}
		if (i->active && i->active->conn == conn && !ctl_cancel(c, i->active, false))
			i->active->conn = NULL;
	}
}

void ctl_enqueue(struct ctl *c, struct ident *i, struct call *k)
{
	k->ident = i;
	struct call **p = &i->queue;
	while (*p)
		p = &(*p)->next;
	*p = k;
	i->lc.queued++;
	c->kick = true;
}

/* --- recovery ------------------------------------------------------------------ */

/* Leftovers of a sandbox whose shim is gone: a QEMU that survived it (it
 * should not, it has PDEATHSIG) and stale runtime files. Disks stay. */
static void clean_leftovers(const char *name)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *rt = xasprintf("%s/runtime.json", dir);
	json_t *j = json_load_file(rt, 0, NULL);
	if (j) {
		pid_t qemu = (pid_t)json_integer_value(json_object_get(j, "qemu_pid"));
		const char *control = json_string_value(json_object_get(j, "control"));
		char cmd[8192] = "";
		_cleanup_free_ char *procp = xasprintf("/proc/%d/cmdline", (int)qemu);
		int fd = qemu > 0 ? open(procp, O_RDONLY | O_CLOEXEC) : -1;
		if (fd >= 0) {
			ssize_t n = read(fd, cmd, sizeof(cmd) - 1);
			close(fd);
			for (ssize_t k = 0; k < n; k++)
				if (cmd[k] == '\0')
					cmd[k] = ' ';
			if (n > 0 && strstr(cmd, dir)) {
				fprintf(stderr, "capsule serve: killing QEMU %d left by a dead shim of %s\n", (int)qemu, name);
				kill(qemu, SIGKILL);
			}
		}
		if (control)
			unlink(control);
		json_decref(j);
		unlink(rt);
	}
	_cleanup_free_ char *sock = xasprintf("%s/control.sock", dir);
	unlink(sock);
}

static void jail_found(void *ud, const char *what)
{
	(void)ud;
	fprintf(stderr, "capsule serve: %s\n", what);
}

/* Find the identities a previous controller recorded and take their
 * sandboxes back: live shims are reattached, dead ones cleaned up, and
 * jails whose owner died removed. */
static void recover(struct ctl *c)
{
	cap_jail_sweep(jail_found, NULL);
	_cleanup_free_ char *ws = xasprintf("%s/workspaces", c->home);
	DIR *da = opendir(ws);
	struct dirent *a;
	while (da && (a = readdir(da))) {
		if (!cap_controller_id_valid(a->d_name) ||
		    (c->cfg.recover_agent && strcmp(a->d_name, c->cfg.recover_agent) != 0))
			continue;
		_cleanup_free_ char *adir = xasprintf("%s/%s", ws, a->d_name);
		DIR *dp = opendir(adir);
		struct dirent *p;
		while (dp && (p = readdir(dp))) {
			if (!cap_controller_id_valid(p->d_name))
				continue;
			struct ident *i = ctl_ident(c, a->d_name, p->d_name);
			struct cap_named_status st;
			struct cap_err err = { 0 };
			if (cap_named_status(i->name, &st, &err) < 0) {
				i->lc.state = CAP_VM_NONE;	/* mapping without sandbox */
				continue;
			}
			i->lc.idle_since = ctl_now(c);
			if (st.state == CAP_NAMED_STOPPED) {
				clean_leftovers(i->name);
				i->lc.state = CAP_VM_STOPPED;
			} else if (attach(i, &err) < 0) {
				fprintf(stderr, "capsule serve: cannot reattach %s: %s\n", i->name, err.msg);
				i->lc.state = CAP_VM_STOPPED;
			} else {
				fprintf(stderr, "capsule serve: reattached %s (%s/%s, %s)\n", i->name, i->agent,
					i->peer, cap_vm_state_name(i->lc.state));
			}
		}
		if (dp)
			closedir(dp);
	}
	if (da)
		closedir(da);

	/* Warm-pool sandboxes nobody was given: members again. */
	char **names;
	size_t n;
	cap_named_list(&names, &n);
	for (size_t k = 0; k < n; k++) {
		bool taken = strncmp(names[k], "pool-", 5) != 0;
		for (struct ident *i = c->idents; i && !taken; i = i->next)
			taken = strcmp(i->name, names[k]) == 0;
		if (!taken && c->cfg.warm_pool) {
			struct ident *i = ident_new(c, "", "");
			struct cap_named_status st;
			struct cap_err err = { 0 };
			i->pool = true;
			snprintf(i->name, sizeof(i->name), "%s", names[k]);
			i->lc.idle_since = ctl_now(c);
			if (cap_named_status(i->name, &st, &err) == 0 && st.state != CAP_NAMED_STOPPED &&
			    attach(i, &err) == 0) {
				fprintf(stderr, "capsule %s: reattached warm sandbox %s\n", c->fe->name, i->name);
			} else {
				clean_leftovers(i->name);
				i->lc.state = CAP_VM_STOPPED;
			}
		}
		free(names[k]);
	}
	free(names);
}

/* --- the loop ------------------------------------------------------------------- */

/* Lifecycle transitions due now. */
static void lifecycle(struct ctl *c)
{
	int64_t now = ctl_now(c);
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->pool)
			continue;	/* kept ready, not idle */
		switch (cap_lc_due(&i->lc, &c->cfg.lc, now)) {
		case CAP_LC_PAUSE:
			if (i->sb) {
				cap_sandbox_vm_op(i->sb, true);
				i->lc.state = CAP_VM_PAUSED;
			}
			break;
		case CAP_LC_STOP:
			ctl_begin_stop(c, i);
			break;
		case CAP_LC_NONE:
			break;
		}
	}
}

static int next_timeout(struct ctl *c)
{
	int64_t next = INT64_MAX, now = ctl_now(c), real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next) {
		int64_t t = cap_lc_next(&i->lc, &c->cfg.lc);
		if (t < next)
			next = t;
		if (i->lc.state == CAP_VM_STOPPING && i->stop_deadline - real + now < next)
			next = i->stop_deadline - real + now;
	}
	if (next == INT64_MAX)
		return -1;
	if (c->cfg.manual_clock)
		return 1000;	/* the clock moves only when told; look again soon */
	return next <= now ? 0 : (int)CAP_MIN(next - now, (int64_t)60000);
}

static void step_ident(struct ctl *c, struct ident *i, const struct pollfd *pfd)
{
	if (i->lc.state == CAP_VM_STARTING) {
		if (pfd[0].revents)
			start_finished(c, i);
		return;
	}
	if (!i->sb)
		return;
	struct cap_err err = { 0 };
	int r = cap_sandbox_dispatch(i->sb, pfd, &err);
	if (i->lc.state == CAP_VM_STOPPING) {
		if (r < 0 || cap_sandbox_is_dead(i->sb))
			stopped(c, i);
		return;
	}
	if (r < 0)
		vm_lost(c, i, err.msg);
}

/* Stopping takes too long: kill the shim (its QEMU dies with it). */
static void stop_overdue(struct ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->lc.state != CAP_VM_STOPPING || real < i->stop_deadline)
			continue;
		fprintf(stderr, "capsule serve: %s did not stop in time; killing its shim\n", i->name);
		if (i->shim_pid > 0)
			kill(i->shim_pid, SIGKILL);
		stopped(c, i);
	}
}

static bool any_resident(struct ctl *c)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (cap_vm_state_resident(i->lc.state))
			return true;
	return false;
}

/* Every VM is asked to stop; the loop ends when none is resident. */
static void begin_shutdown(struct ctl *c, const char *why)
{
	if (c->shutting_down)
		return;
	fprintf(stderr, "capsule %s: %s: stopping every sandbox\n", c->fe->name, why);
	c->shutting_down = true;
	c->fe->shutdown(c);
	for (struct ident *i = c->idents; i; i = i->next)
		if (cap_vm_state_resident(i->lc.state))
			ctl_begin_stop(c, i);
}

int ctl_run(const struct cap_controller_cfg *cfg, const struct ctl_frontend *fe,
	    void *fe_state, struct cap_err *err)
{
	struct ctl c = { .cfg = *cfg, .fe = fe, .fe_state = fe_state,
			 .listen_fd = -1, .signal_fd = -1, .lock_fd = -1 };
	int r;

	c.home = cap_home_dir();
	if ((r = cap_mkdir_p(c.home, 0700)) < 0) {
		r = cap_err_set(err, -r, "cannot create %s: %s", c.home, strerror(-r));
		goto out;
	}
	if ((r = fe->setup(&c, err)) < 0)
		goto out;

	static const int stops[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t sigs;
	c.signal_fd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);

	recover(&c);
	fprintf(stderr, "capsule %s: ready (capacity %u, idle pause %lld ms, idle stop %lld ms%s)\n",
		fe->name, cfg->lc.capacity, (long long)cfg->lc.idle_pause_ms,
		(long long)cfg->lc.idle_stop_ms, cfg->manual_clock ? ", manual clock" : "");

	for (;;) {
		while (c.kick) {
			c.kick = false;
			for (struct ident *i = c.idents; i; i = i->next)
				pump(&c, i);
		}
		if (c.frontend_done)
			begin_shutdown(&c, "the client went away");
		pool_fill(&c);
		if (!c.shutting_down)
			lifecycle(&c);
		stop_overdue(&c);
		if (c.shutting_down && !any_resident(&c))
			break;

		enum { MAXP = 4096 };
		static struct pollfd pfd[MAXP];
		static void *owner[MAXP];
		int n = 0;
		pfd[n++] = (struct pollfd){ .fd = c.signal_fd, .events = POLLIN };
		int first_fe = n;
		n = fe->pollfds(&c, pfd, owner, n, MAXP - 2 * 512);
		int first_ident = n;
		for (struct ident *i = c.idents; i && n + CAP_SANDBOX_NPOLL <= MAXP; i = i->next) {
			owner[n] = i;
			if (i->lc.state == CAP_VM_STARTING) {
				pfd[n] = (struct pollfd){ .fd = i->ready_fd, .events = POLLIN };
				pfd[n + 1] = (struct pollfd){ .fd = -1 };
			} else if (i->sb) {
				cap_sandbox_pollfds(i->sb, &pfd[n]);
			} else {
				pfd[n] = pfd[n + 1] = (struct pollfd){ .fd = -1 };
			}
			n += CAP_SANDBOX_NPOLL;
		}
		if (poll(pfd, (nfds_t)n, next_timeout(&c)) < 0 && errno != EINTR) {
			r = cap_err_set(err, errno, "poll: %s", strerror(errno));
			break;
		}
		if (pfd[0].revents) {
			struct signalfd_siginfo si;
			while (read(c.signal_fd, &si, sizeof(si)) == sizeof(si))
				begin_shutdown(&c, strsignal((int)si.ssi_signo));
		}
		fe->step(&c, pfd, owner, first_fe, first_ident);
		for (int k = first_ident; k < n; k += CAP_SANDBOX_NPOLL)
			if (pfd[k].revents || pfd[k + 1].revents)
				step_ident(&c, owner[k], &pfd[k]);
		fe->flush(&c);
	}
	fprintf(stderr, "capsule %s: every sandbox stopped; bye\n", fe->name);
	r = 0;
out:
	fe->teardown(&c);
	while (c.idents) {
		struct ident *i = c.idents;
		c.idents = i->next;
		detach(i);
		if (i->ready_fd >= 0)
			close(i->ready_fd);
		while (i->queue) {
			struct call *k = i->queue;
			i->queue = k->next;
			call_free(k);
		}
		call_free(i->active);
		free(i);
	}
	if (c.signal_fd >= 0)
		close(c.signal_fd);
	if (c.lock_fd >= 0)
		close(c.lock_fd);
	free(c.home);
	return r;
}
