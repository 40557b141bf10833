/* Events to containerd: each one an Envelope {timestamp, namespace,
 * topic, event (Any: "containerd.events.TaskExit", ...)} sent with
 * containerd.services.events.ttrpc.v1.Events/Forward to TTRPC_ADDRESS,
 * in order, by one thread, as the runc shim's publisher does (a failed
 * send is retried a few times, then dropped with a log line). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "events-task.pb-c.h"
#include "events-ttrpc.pb-c.h"
#include "shim.h"
#include "util.h"

struct event {
	char *topic;
	char *type_url;
	uint8_t *value;
	size_t len;
	struct timespec at;
	struct event *next;
};

static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcond = PTHREAD_COND_INITIALIZER;
static struct event *head, **tail = &head;
static bool sending;

void shim_publish(const char *topic, const ProtobufCMessage *m)
{
	struct event *e = xcalloc(1, sizeof(*e));
	e->topic = xstrdup(topic);
	/* typeurl's name for a gogo message it has not registered: the
	 * proto's full name. */
	e->type_url = xstrdup(m->descriptor->name);
	e->len = protobuf_c_message_get_packed_size(m);
	e->value = xmalloc(e->len + 1);
	protobuf_c_message_pack(m, e->value);
	clock_gettime(CLOCK_REALTIME, &e->at);
	pthread_mutex_lock(&qmu);
	*tail = e;
	tail = &e->next;
	pthread_cond_broadcast(&qcond);
	pthread_mutex_unlock(&qmu);
}

static int forward(struct cap_ttrpc_client **client, const struct event *e)
{
	if (!shim.ttrpc_address || !*shim.ttrpc_address)
		return 0;
	if (!*client)
		*client = cap_ttrpc_client_new(shim.ttrpc_address);
	if (!*client)
		return -errno;
	Containerd__Services__Events__Ttrpc__V1__ForwardRequest req =
		CONTAINERD__SERVICES__EVENTS__TTRPC__V1__FORWARD_REQUEST__INIT;
	Containerd__Services__Events__Ttrpc__V1__Envelope env = CONTAINERD__SERVICES__EVENTS__TTRPC__V1__ENVELOPE__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
	shim_timestamp(&ts, &e->at);
	any.type_url = e->type_url;
	any.value.data = e->value;
	any.value.len = e->len;
	env.timestamp = &ts;
	env.namespace_ = shim.namespace_;
	env.topic = e->topic;
	env.event = &any;
	req.envelope = &env;
	size_t n = protobuf_c_message_get_packed_size(&req.base);
	uint8_t *buf = xmalloc(n + 1);
	protobuf_c_message_pack(&req.base, buf);
	char msg[256];
	int r = cap_ttrpc_call(*client, "containerd.services.events.ttrpc.v1.Events", "Forward", buf, n, 5000,
			       NULL, NULL, msg, sizeof(msg));
	free(buf);
	if (r < 0) {
		cap_ttrpc_client_free(*client);
		*client = NULL;
		return r;
	}
	if (r > 0) {
		shim_log("warning", "containerd refused event %s: code %d: %s", e->topic, r, msg);
		return 0; /* an answer: not retried */
	}
	return 0;
}

static void *publisher(void *arg)
{
	(void)arg;
	struct cap_ttrpc_client *client = NULL;
	for (;;) {
		pthread_mutex_lock(&qmu);
		while (!head)
			pthread_cond_wait(&qcond, &qmu);
		struct event *e = head;
		sending = true;
		pthread_mutex_unlock(&qmu);

		int r = -1;
		for (int attempt = 0; attempt < 6; attempt++) {
			r = forward(&client, e);
			if (r == 0)
				break;
			struct timespec d = { .tv_sec = attempt + 1 };
			nanosleep(&d, NULL);
		}
		if (r < 0)
			shim_log("error", "dropping event %s: cannot send it to %s: %s", e->topic, shim.ttrpc_address,
				 strerror(-r));
		pthread_mutex_lock(&qmu);
		head = e->next;
		if (!head)
			tail = &head;
		sending = false;
		pthread_cond_broadcast(&qcond);
		pthread_mutex_unlock(&qmu);
		free(e->topic);
		free(e->type_url);
		free(e->value);
		free(e);
	}
	return NULL;
}

void shim_events_start(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, publisher, NULL) != 0)
		abort();
	pthread_detach(t);
}

void shim_events_drain(int timeout_ms)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	pthread_mutex_lock(&qmu);
	while ((head || sending) && pthread_cond_timedwait(&qcond, &qmu, &until) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&qmu);
}
