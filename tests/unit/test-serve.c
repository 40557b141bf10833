/* serve's metrics endpoint: the request decoder (serve-http.c) and the
 * Prometheus text of the figures (serve-metrics.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "serve-http.h"
#include "serve-metrics.h"

/* The status s answers (0: needs more bytes). */
static int status_of(const char *s, bool *head)
{
	struct serve_http_req q;
	int r = serve_http_parse(s, strlen(s), &q);
	if (head)
		*head = q.head;
	if (r == 1 && q.status != 200)
		assert_non_null(q.why);
	return r == 0 ? 0 : q.status;
}

static void http_answers(void **state)
{
	(void)state;
	bool head = true;
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &head), 200);
	assert_false(head);
	assert_int_equal(status_of("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &head), 200);
	assert_true(head);
	assert_int_equal(status_of("GET /metrics HTTP/1.0\r\n\r\n", NULL), 200);
	assert_int_equal(status_of("GET /metrics?name[]=up HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", NULL), 200);
	assert_int_equal(status_of("GET http://127.0.0.1:9/metrics HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 200);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", NULL), 200);
	/* Paths, then methods. */
	assert_int_equal(status_of("GET / HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("GET /metricsx HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("GET /Metrics HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("GET /metrics/ HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("GET http://h HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("POST /x HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 404);
	assert_int_equal(status_of("POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 405);
	assert_int_equal(status_of("get /metrics HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 405);
	assert_int_equal(status_of("DELETE /metrics HTTP/1.0\r\n\r\n", NULL), 405);
	/* Malformed. */
	assert_int_equal(status_of("GARBAGE\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\n\r\n", NULL), 400);	/* no Host */
	assert_int_equal(status_of("GET /metrics HTTP/1.1\nHost: x\n\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET * HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET https://h/metrics HTTP/1.1\r\nHost: x\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.2\r\nHost: x\r\n\r\n", NULL), 400);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /\n", NULL), 200);	/* after the head: not read */
	/* Not yet a head. */
	assert_int_equal(status_of("", NULL), 0);
	assert_int_equal(status_of("GET /metrics HTTP/1.1\r\nHost: x\r\n", NULL), 0);
	assert_int_equal(status_of("GET /met", NULL), 0);
}

static void http_bounds(void **state)
{
	(void)state;
	size_t n = SERVE_HTTP_MAX + 100;
	char *big = malloc(n + 1);
	struct serve_http_req q;
	/* A field that never ends within the bound. */
	snprintf(big, n + 1, "GET /metrics HTTP/1.1\r\nX: ");
	memset(big + strlen(big), 'a', n - strlen(big));
	big[n] = '\0';
	assert_int_equal(serve_http_parse(big, SERVE_HTTP_MAX - 1, &q), 0);
	assert_int_equal(serve_http_parse(big, SERVE_HTTP_MAX, &q), 1);
	assert_int_equal(q.status, 431);
	assert_int_equal(serve_http_parse(big, n, &q), 1);
	assert_int_equal(q.status, 431);
	/* A head just within it is read; what follows it is not looked at. */
	const char *h = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
	memcpy(big, h, strlen(h));
	assert_int_equal(serve_http_parse(big, n, &q), 1);
	assert_int_equal(q.status, 200);
	assert_int_equal(q.len, strlen(h));
	free(big);
}

static void outcomes_and_buckets(void **state)
{
	(void)state;
	struct serve_stats st;
	serve_stats_init(&st, 2);
	assert_string_equal(serve_outcome_name(serve_outcome(0)), "ok");
	assert_string_equal(serve_outcome_name(serve_outcome(-32602)), "invalid_params");
	assert_string_equal(serve_outcome_name(serve_outcome(-32000)), "sandbox_error");
	assert_string_equal(serve_outcome_name(serve_outcome(-32800)), "cancelled");
	assert_string_equal(serve_outcome_name(serve_outcome(12345)), "internal_error");
	serve_stats_note(&st, 1, 0, 0);	/* the first bucket */
	serve_stats_note(&st, 1, 0, serve_bucket_ns[0]);	/* on its bound: still in it */
	serve_stats_note(&st, 1, -32602, serve_bucket_ns[0] + 1);
	serve_stats_note(&st, 1, 0, (int64_t)1000 * 1000000000);	/* over the last: +Inf only */
	serve_stats_note(&st, 7, 0, 0);	/* no such method: not counted */
	const struct serve_method_stats *m = &st.owned_methods[1];
	assert_int_equal(m->count, 4);
	assert_int_equal(m->outcomes[serve_outcome(0)], 3);
	assert_int_equal(m->outcomes[serve_outcome(-32602)], 1);
	assert_int_equal(m->buckets[0], 2);
	assert_int_equal(m->buckets[1], 1);
	uint64_t in = 0;
	for (size_t b = 0; b < SERVE_NBUCKETS; b++)
		in += m->buckets[b];
	assert_int_equal(in, 3);
	assert_int_equal(st.owned_methods[0].count, 0);
	for (size_t b = 1; b < SERVE_NBUCKETS; b++)
		assert_true(serve_bucket_ns[b] > serve_bucket_ns[b - 1]);
	serve_stats_fini(&st);
}

static char *text_of(const struct serve_metrics_in *in)
{
	struct cap_buf b;
	cap_buf_init(&b);
	serve_metrics_text(in, &b);
	assert_true(cap_buf_used(&b) > 0 && cap_buf_head(&b)[cap_buf_used(&b) - 1] == '\n');
	cap_buf_append(&b, "", 1);
	char *s = strdup((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	return s;
}

static void text_format(void **state)
{
	(void)state;
	struct cap_ctl_metrics cm = { .start_unix_ms = 1000000, .capacity = 4 };
	cm.sandboxes[CAP_VM_RUNNING] = 2;
	cm.prepares[CAP_CTL_PREP_FAILED] = 3;
	cm.evictions[CAP_CTL_EVICT_CAPACITY] = 1;
	cm.net_bytes_in = 77;
	cm.memory_bytes = 123456789;
	struct serve_stats st;
	serve_stats_init(&st, 3);
	serve_stats_note(&st, 0, 0, 2 * 1000000);
	serve_stats_note(&st, 0, -32002, 20 * 1000000);
	serve_stats_note(&st, 2, 0, 1);	/* not served: no series */
	const char *names[] = { "exec", "status", NULL };
	struct serve_metrics_in in = {
		.ctl = &cm, .st = &st, .method_names = names, .version = "1.\"2\"\\\n",
		.now_unix_ms = 1005500, .cpu_seconds = -1, .resident_bytes = 4096, .open_fds = -1, .max_fds = 1024,
	};
	char *t = text_of(&in);
	assert_non_null(strstr(t, "# HELP capsule_build_info "));
	assert_non_null(strstr(t, "# TYPE capsule_build_info gauge\n"));
	assert_non_null(strstr(t, "capsule_build_info{version=\"1.\\\"2\\\"\\\\\\n\"} 1\n"));
	assert_non_null(strstr(t, "\ncapsule_start_time_seconds 1000\n"));
	assert_non_null(strstr(t, "\ncapsule_uptime_seconds 5.5\n"));
	assert_non_null(strstr(t, "\ncapsule_calls_total{method=\"exec\",outcome=\"ok\"} 1\n"));
	assert_non_null(strstr(t, "\ncapsule_calls_total{method=\"exec\",outcome=\"tool_error\"} 1\n"));
	assert_null(strstr(t, "outcome=\"sandbox_error\""));	/* zero: not shown */
	assert_null(strstr(t, "method=\"status\""));	/* never called */
	assert_null(strstr(t, "method=\"\""));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_bucket{method=\"exec\",le=\"0.001\"} 0\n"));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_bucket{method=\"exec\",le=\"0.005\"} 1\n"));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_bucket{method=\"exec\",le=\"0.025\"} 2\n"));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_bucket{method=\"exec\",le=\"+Inf\"} 2\n"));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_sum{method=\"exec\"} 0.022000000\n"));
	assert_non_null(strstr(t, "\ncapsule_call_duration_seconds_count{method=\"exec\"} 2\n"));
	assert_non_null(strstr(t, "# TYPE capsule_call_duration_seconds histogram\n"));
	assert_non_null(strstr(t, "\ncapsule_sandboxes{state=\"running\"} 2\n"));
	assert_non_null(strstr(t, "\ncapsule_sandboxes{state=\"stopped\"} 0\n"));
	assert_null(strstr(t, "state=\"none\""));
	assert_non_null(strstr(t, "\ncapsule_prepares_total{outcome=\"failed\"} 3\n"));
	assert_non_null(strstr(t, "\ncapsule_evictions_total{reason=\"capacity\"} 1\n"));
	assert_non_null(strstr(t, "\ncapsule_evictions_total{reason=\"idle_stop\"} 0\n"));
	assert_non_null(strstr(t, "\ncapsule_network_bytes_total{direction=\"in\"} 77\n"));
	assert_non_null(strstr(t, "\ncapsule_memory_held_bytes 123456789\n"));
	assert_non_null(strstr(t, "\nprocess_resident_memory_bytes 4096\n"));
	assert_non_null(strstr(t, "\nprocess_max_fds 1024\n"));
	assert_null(strstr(t, "process_open_fds"));	/* unknown: left out */
	assert_null(strstr(t, "process_cpu_seconds_total"));
	/* Every line a comment or a sample; every TYPE after its HELP. */
	for (char *line = t, *next; *line; line = next + 1) {
		next = strchr(line, '\n');
		assert_non_null(next);
		if (!strncmp(line, "# TYPE ", 7)) {
			char name[128];
			assert_int_equal(sscanf(line + 7, "%127s", name), 1);
			char help[160];
			snprintf(help, sizeof(help), "# HELP %s ", name);
			assert_non_null(strstr(t, help));
			assert_true(strstr(t, help) < line);
		} else {
			assert_true(line[0] != '#' || !strncmp(line, "# HELP ", 7));
			assert_true(line[0] != ' ' && next > line);
		}
	}
	free(t);
	serve_stats_fini(&st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(http_answers),
		cmocka_unit_test(http_bounds),
		cmocka_unit_test(outcomes_and_buckets),
		cmocka_unit_test(text_format),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
