/* serve's image_check: the registry is asked in a thread of its own (a
 * check takes up to its timeout, and the loop serves everyone else
 * meanwhile); the thread says it is done on an eventfd the loop polls,
 * and the loop answers. A check whose connection went away is still
 * waited for (bounded by its timeout) and its answer dropped. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "serve-conn.h"
#include "serve.h"
#include "store.h"
#include "util.h"

struct check_job {
	struct conn *conn;	/* NULL once the client went away */
	json_t *id;
	char *owned_ref;
	struct cap_check_opts o;
	int efd;
	size_t mi;	/* its method's figures (serve_pending_begin), SIZE_MAX: none */
	int64_t start_ns;
	pthread_t thread;
	/* Written by the thread before it signals; read by the loop after. */
	int r;
	struct cap_image_check c;
	struct cap_err err;
	bool done;
	struct check_job *next;
};

static void *run(void *arg)
{
	struct check_job *j = arg;
	j->r = cap_store_image_check(j->owned_ref, &j->o, &j->c, &j->err);
	__atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
	uint64_t one = 1;
	ssize_t w = write(j->efd, &one, sizeof(one));
	(void)w;
	return NULL;
}

void serve_image_check(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *ref = json_string_value(json_object_get(params, "ref"));
	json_t *t = json_object_get(params, "timeout");
	if (!ref)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.ref must be a string: a registry reference such as registry.example.com/org/image:tag");
	if (t && (!json_is_number(t) || json_number_value(t) < 1 || json_number_value(t) > 3600))
		return serve_error(k, id, CAP_RPC_PARAMS, "params.timeout must be a number of seconds from 1 to 3600 (default %d)",
				   CAP_CHECK_TIMEOUT_S);
	if (s->check_efd < 0 && (s->check_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		s->check_efd = -1;
		return serve_error(k, id, CAP_RPC_INTERNAL, "eventfd: %s", strerror(errno));
	}
	struct check_job *j = xcalloc(1, sizeof(*j));
	j->conn = k;
	j->id = id ? json_incref(id) : NULL;
	j->owned_ref = xstrdup(ref);
	j->o.timeout_s = t ? (unsigned)(json_number_value(t) + 0.999) : CAP_CHECK_TIMEOUT_S;
	j->efd = s->check_efd;
	j->mi = SIZE_MAX;
	if (pthread_create(&j->thread, NULL, run, j) != 0) {
		serve_error(k, id, CAP_RPC_INTERNAL, "cannot start a thread for the check");
		json_decref(j->id);
		free(j->owned_ref);
		free(j);
		return;
	}
	/* Counted when answered, as a call submitted to the controller is. */
	j->mi = s->cur.open ? s->cur.mi : SIZE_MAX;
	j->start_ns = s->cur.start_ns;
	s->cur.open = false;
	j->next = s->checks;
	s->checks = j;
}

static void answer(struct cap_rpc_server *s, struct check_job *j)
{
	struct conn *k = j->conn;
	int code = j->r == 0 ? 0 : j->r == -EINVAL ? CAP_RPC_PARAMS : CAP_RPC_TOOL;
	serve_stats_note(&s->stats, j->mi, code, cap_now_ns() - j->start_ns);
	if (!k || k->closing || !j->id)
		return;
	if (j->r == 0) {
		serve_result(k, j->id, cap_rpc_image_check_json(&j->c));
		return;
	}
	cap_rpc_put_error(&k->out, j->id, code, j->err.msg, cap_rpc_check_error_data(j->r, j->owned_ref));
}

static void job_free(struct check_job *j)
{
	pthread_join(j->thread, NULL);
	if (j->r == 0)
		cap_image_check_fini(&j->c);
	json_decref(j->id);
	free(j->owned_ref);
	free(j);
}

void serve_checks_ready(struct cap_rpc_server *s)
{
	uint64_t v;
	ssize_t rd = read(s->check_efd, &v, sizeof(v));
	(void)rd;
	for (struct check_job **q = &s->checks; *q;) {
		struct check_job *j = *q;
		if (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE)) {
			q = &j->next;
			continue;
		}
		*q = j->next;
		answer(s, j);
		job_free(j);
	}
}

void serve_checks_forget(struct cap_rpc_server *s, struct conn *k)
{
	for (struct check_job *j = s->checks; j; j = j->next)
		if (j->conn == k)
			j->conn = NULL;
}

void serve_checks_fini(struct cap_rpc_server *s)
{
	while (s->checks) {
		struct check_job *j = s->checks;
		s->checks = j->next;
		job_free(j);
	}
	if (s->check_efd >= 0)
		close(s->check_efd);
	s->check_efd = -1;
}
