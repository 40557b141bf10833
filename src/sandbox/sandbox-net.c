/* A sandbox's NIC from the owner's side (docs/network.md): what the
 * engine needs to start it (the denied ranges, the published ports bound
 * on the host, the policy process and, with secrets, their values, the
 * sandbox's CA and the host's trust store), policy changes while it runs,
 * and auto-publish of the guest's listeners. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ca.h"
#include "netd.h"
#include "sandbox-internal.h"
#include "secret.h"
#include "util.h"

#define MAX_DENY (2 * CAP_NET_MAX_RULES + 16)
#define MAX_AUTO 256

struct cap_sandbox_net {
	struct cap_net_policy policy;	/* in force */
	char name[64];
	int log_fd;	/* -1: stderr */
	int counters_fd;	/* -1: none */
	bool verbose;
	int publish_fds[CAP_NET_MAX_PUBLISH];
	unsigned npublish;
	uint16_t forward[CAP_NET_MAX_PUBLISH];	/* distinct guest ports */
	unsigned nforward;
	uint32_t deny[MAX_DENY][2];
	int keep[CAP_NET_MAX_PUBLISH + 2];
	struct cap_vm_net vmnet;
	uint16_t autos[MAX_AUTO];	/* guest ports auto-published now */
	unsigned nauto;
	/* Secrets, from cap_sandbox_net_new until the VM runs: the policy
	 * process is forked with a copy of them, then cap_sandbox_net_started
	 * wipes the owner's (values, CA key, trust). secrets[i].decl points
	 * into the policy as it was at start (the policy process's copy). */
	struct cap_netd_secret secrets[CAP_NET_MAX_SECRETS];
	char *owned_values[CAP_NET_MAX_SECRETS];
	unsigned nsecrets;
	struct cap_net_ca ca;
	char *owned_trust;
	size_t trust_len;
	/* What SETUP gives the guest: "NAME=<placeholder>" (never a value). */
	char env[CAP_NET_MAX_SECRETS][sizeof(((struct cap_net_secret *)0)->name) + 1 + CAP_NET_PLACEHOLDER_LEN + 1];
	char *envp[CAP_NET_MAX_SECRETS];
};

/* A timeout of the policy process from the owner's environment (whole
 * seconds, 1 to 86400), in ms; 0 (netd's default) when unset or not one. */
static unsigned env_timeout_ms(const char *name)
{
	const char *v = getenv(name);
	char *end = NULL;
	long s = v && *v ? strtol(v, &end, 10) : 0;

	return s > 0 && s <= 86400 && *end == '\0' ? (unsigned)s * 1000u : 0;
}

/* Runs in the policy process (forked and confined by the engine). */
static int policy_main(void *ud, const struct cap_vm_net_fds *fds)
{
	const struct cap_sandbox_net *n = ud;
	struct cap_netd_config c = {
		.name = n->name,
		.policy = &n->policy,
		.tcp_listen = fds->tcp_listen,
		.dns = fds->dns,
		.connector = fds->connector,
		.control = fds->control,
		.nflog = fds->nflog,
		.publish_fds = n->publish_fds,
		.npublish = n->npublish,
		.log_fd = n->log_fd >= 0 ? n->log_fd : STDERR_FILENO,
		.counters_fd = n->counters_fd,
		.verbose = n->verbose,
		.head_timeout_ms = env_timeout_ms("CAPSULE_NET_HEAD_TIMEOUT_S"),
		.idle_timeout_ms = env_timeout_ms("CAPSULE_NET_IDLE_TIMEOUT_S"),
		.seccomp = true,
		.https_proxy = getenv("HTTPS_PROXY") ? getenv("HTTPS_PROXY") : getenv("https_proxy"),
		.http_proxy = getenv("HTTP_PROXY") ? getenv("HTTP_PROXY") : getenv("http_proxy"),
		.all_proxy = getenv("ALL_PROXY") ? getenv("ALL_PROXY") : getenv("all_proxy"),
		.no_proxy = getenv("NO_PROXY") ? getenv("NO_PROXY") : getenv("no_proxy"),
		.secrets = n->nsecrets ? n->secrets : NULL,
		.nsecrets = n->nsecrets,
		.ca_key_pem = n->nsecrets ? n->ca.owned_key_pem : NULL,
		.ca_cert_pem = n->nsecrets ? n->ca.owned_cert_pem : NULL,
		.trust_pem = n->nsecrets ? n->owned_trust : NULL,
		.trust_len = n->nsecrets ? n->trust_len : 0,
	};
	return cap_netd_main(&c);
}

/* The owner's copies of what only the policy process may keep. */
static void wipe_secrets(struct cap_sandbox_net *n)
{
	for (unsigned i = 0; i < n->nsecrets; i++) {
		cap_net_secret_wipe(n->owned_values[i], n->secrets[i].value_len);
		n->owned_values[i] = NULL;
		n->secrets[i].value = NULL;
		n->secrets[i].value_len = 0;
	}
	cap_net_ca_fini(&n->ca);
	free(n->owned_trust);
	n->owned_trust = NULL;
	n->trust_len = 0;
}

/* In another helper of the VM (the connector), first thing: its copy of
 * the owner's memory loses what only the policy process may hold (the
 * values, the CA, the trust store, the env: sources' variables). */
static void helper_scrub(void *ud)
{
	struct cap_sandbox_net *n = ud;
	for (unsigned i = 0; i < n->nsecrets; i++)
		cap_net_secret_forget_source(n->secrets[i].decl);
	wipe_secrets(n);
}

/* With secrets in the policy: the sandbox's CA (kept in o->ca_dir, or
 * made for this start), the host's trust store, each value read from
 * its source now, and the placeholders. Any failure fails the start. */
static int load_secrets(struct cap_sandbox_net *n, const struct cap_sandbox_opts *o,
			struct cap_err *err)
{
	const struct cap_net_policy *p = &n->policy;
	int r;

	if (p->nsecrets == 0)
		return 0;
	CAP_BUG_ON(p->nsecrets > CAP_NET_MAX_SECRETS);
	if ((r = cap_net_ca_ensure(o->ca_dir, n->name, &n->ca, err)) < 0) {
		cap_err_prefix(err, "secrets: ");
		return r;
	}
	if ((r = cap_net_trust_load(&n->owned_trust, &n->trust_len, err)) < 0) {
		cap_err_prefix(err, "secrets: the certificates to verify the secrets' hosts against: ");
		return r;
	}
	for (unsigned i = 0; i < p->nsecrets; i++) {
		struct cap_netd_secret *s = &n->secrets[i];
		char *v;
		size_t len;
		if ((r = cap_net_secret_value(&p->secrets[i], &v, &len, err)) < 0)
			return r;
		n->owned_values[i] = v;
		s->decl = &p->secrets[i];
		s->value = v;
		s->value_len = len;
		cap_net_secret_placeholder(n->ca.fp, p->secrets[i].name, s->placeholder);
		/* NAME=placeholder (both inside n: no snprintf from n into n). */
		size_t nl = strnlen(p->secrets[i].name, sizeof(p->secrets[i].name) - 1);
		memcpy(n->env[i], p->secrets[i].name, nl);
		n->env[i][nl] = '=';
		memcpy(n->env[i] + nl + 1, s->placeholder, sizeof(s->placeholder));
		n->envp[i] = n->env[i];
		n->nsecrets = i + 1;
	}
	return 0;
}

static int bind_publish(const struct cap_net_publish *p, struct cap_err *err)
{
	char a[16];
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(p->host_port),
				  .sin_addr.s_addr = htonl(p->bind) };
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return cap_err_set(err, errno, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		int e = errno;
		close(fd);
		return cap_err_set(err, e, "cannot publish %s:%u (--publish %s:%u:%u): %s%s",
				   cap_net_addr_str(p->bind, a), p->host_port, a, p->host_port, p->guest_port,
				   strerror(e), e == EADDRINUSE ? "; choose another host port" : "");
	}
	return fd;
}

static void compute_deny(struct cap_sandbox_net *n)
{
	n->vmnet.ndeny = (unsigned)cap_net_denied_ranges(&n->policy, n->deny, MAX_DENY);
	n->vmnet.deny = (const uint32_t (*)[2])n->deny;
}

int cap_sandbox_net_new(const struct cap_sandbox_opts *o, struct cap_sandbox_net **out,
			struct cap_err *err)
{
	const struct cap_net_policy *p = &o->spec->net;
	struct cap_sandbox_net *n = xcalloc(1, sizeof(*n));
	n->policy = *p;
	snprintf(n->name, sizeof(n->name), "%s", o->name ? o->name : "run");
	n->log_fd = o->net_log_fd;
	n->counters_fd = o->net_counters_fd;
	n->verbose = o->net_verbose;
	for (unsigned i = 0; i < p->npublish; i++) {
		int fd = bind_publish(&p->publish[i], err);
		if (fd < 0) {
			cap_sandbox_net_free(n);
			return fd;
		}
		n->publish_fds[n->npublish++] = fd;
		n->keep[i] = fd;
		bool seen = false;
		for (unsigned k = 0; k < n->nforward; k++)
			seen |= n->forward[k] == p->publish[i].guest_port;
		if (!seen)
			n->forward[n->nforward++] = p->publish[i].guest_port;
	}
	unsigned nkeep = n->npublish;
	if (n->log_fd >= 0)
		n->keep[nkeep++] = n->log_fd;
	if (n->counters_fd >= 0)
		n->keep[nkeep++] = n->counters_fd;
	compute_deny(n);
	n->vmnet.forward = n->forward;
	n->vmnet.nforward = n->nforward;
	n->vmnet.policy_main = policy_main;
	n->vmnet.policy_ud = n;
	n->vmnet.helper_scrub = helper_scrub;
	n->vmnet.keep = n->keep;
	n->vmnet.nkeep = nkeep;
	n->vmnet.proxy_port = CAP_NET_PROXY_PORT;
	int r = load_secrets(n, o, err);
	if (r < 0) {
		cap_sandbox_net_free(n);
		return r;
	}
	*out = n;
	return 0;
}

int cap_sandbox_net_setup(struct cap_sandbox_net *n, struct cap_setup *s,
			  char *env[CAP_SETUP_MAX_ENV], struct cap_err *err)
{
	if (n->nsecrets == 0)
		return 0;
	CAP_BUG_ON(!n->ca.owned_cert_pem);	/* asked for after cap_sandbox_net_started */
	if (s->envc + n->nsecrets > CAP_SETUP_MAX_ENV)
		return cap_err_set(err, E2BIG, "more than %d variables for the guest's environment",
				   CAP_SETUP_MAX_ENV);
	for (uint32_t i = 0; i < s->envc; i++)
		env[i] = s->env[i];
	for (unsigned i = 0; i < n->nsecrets; i++)
		env[s->envc + i] = n->envp[i];
	s->env = env;
	s->envc += n->nsecrets;
	s->ca_pem = n->ca.owned_cert_pem;
	return 0;
}

const struct cap_vm_net *cap_sandbox_net_vm(const struct cap_sandbox_net *n)
{
	return &n->vmnet;
}

/* The template's NIC: same device, nothing gets out, no policy process. */
const struct cap_vm_net *cap_sandbox_net_template(void)
{
	static const uint32_t all[1][2] = { { 0, UINT32_MAX } };
	static const struct cap_vm_net t = { .deny = all, .ndeny = 1, .proxy_port = CAP_NET_PROXY_PORT };
	return &t;
}

void cap_sandbox_net_started(struct cap_sandbox_net *n)
{
	/* The policy process holds them now: should it die, a client of a
	 * published port is refused instead of waiting in our backlog. */
	for (unsigned i = 0; i < n->npublish; i++)
		close(n->publish_fds[i]);
	n->npublish = 0;
	/* The policy process has its copy: the owner keeps none for the
	 * sandbox's life, not even in the environment it inherited. (Until
	 * now it kept them: a failed template restore falls back to a cold
	 * boot, whose policy process needs them again.) */
	for (unsigned i = 0; i < n->nsecrets; i++)
		cap_net_secret_forget_source(n->secrets[i].decl);
	wipe_secrets(n);
	n->nsecrets = 0;
}

void cap_sandbox_net_free(struct cap_sandbox_net *n)
{
	if (!n)
		return;
	for (unsigned i = 0; i < n->npublish; i++)
		close(n->publish_fds[i]);
	wipe_secrets(n);
	free(n);
}

/* One line to the policy process; it reads them in order. */
static int tell(struct cap_vm *vm, const char *line, struct cap_err *err)
{
	int fd = cap_vm_net_control_fd(vm);
	if (fd < 0)
		return cap_err_set(err, ENOTCONN, "the sandbox has no policy process");
	/* Never wait for it: a line is small, the socket's buffer holds
	 * hundreds, and a policy process that stopped reading is broken. */
	size_t len = strlen(line);
	ssize_t n;
	while ((n = send(fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (n == (ssize_t)len)
		return 0;
	if (n < 0 && errno == EAGAIN)
		return cap_err_set(err, EAGAIN, "the sandbox's policy process is not reading its control channel: the change was not applied");
	return cap_err_set(err, EPIPE, "the sandbox's policy process is gone (its connections fail): %s",
			   n < 0 ? strerror(errno) : "short write");
}

int cap_sandbox_net_set_policy(struct cap_sandbox_net *n, struct cap_vm *vm,
			       const struct cap_net_policy *p, struct cap_err *err)
{
	struct cap_net_policy old = n->policy;
	n->policy = *p;
	/* Publishing and the NIC itself are fixed for the VM's life. */
	n->policy.enabled = true;
	memcpy(n->policy.publish, old.publish, sizeof(old.publish));
	n->policy.npublish = old.npublish;
	n->policy.auto_publish = old.auto_publish;
	compute_deny(n);
	int r = cap_vm_net_deny(vm, n->vmnet.deny, n->vmnet.ndeny, err);
	if (r == 0) {
		_cleanup_free_ char *words = cap_net_policy_line(&n->policy);
		_cleanup_free_ char *line = xasprintf("policy %s\n", words);
		r = tell(vm, line, err);
	}
	if (r < 0) {
		n->policy = old;
		compute_deny(n);
	}
	return r;
}

static bool has(const uint16_t *v, unsigned n, uint16_t port)
{
	for (unsigned i = 0; i < n; i++)
		if (v[i] == port)
			return true;
	return false;
}

int cap_sandbox_net_listeners(struct cap_sandbox_net *n, struct cap_vm *vm,
			      const uint16_t *ports, uint32_t nports, struct cap_err *err)
{
	char line[64];
	int r = 0;
	if (!n->policy.auto_publish)
		return 0;
	/* Gone first, so a port can come back. */
	for (unsigned i = 0; i < n->nauto;) {
		if (has(ports, nports, n->autos[i])) {
			i++;
			continue;
		}
		snprintf(line, sizeof(line), "unpublish %u\n", n->autos[i]);
		if (!has(n->forward, n->nforward, n->autos[i]))
			cap_vm_net_forward(vm, n->autos[i], false, NULL);
		if (tell(vm, line, err) < 0)
			r = -err->code;
		n->autos[i] = n->autos[--n->nauto];
	}
	for (uint32_t i = 0; i < nports; i++) {
		uint16_t p = ports[i];
		if (has(n->autos, n->nauto, p))
			continue;
		/* A port published explicitly keeps its own host port. */
		bool explicit = false;
		for (unsigned k = 0; k < n->policy.npublish; k++)
			explicit |= n->policy.publish[k].guest_port == p || n->policy.publish[k].host_port == p;
		if (explicit || n->nauto >= MAX_AUTO)
			continue;
		if (cap_vm_net_forward(vm, p, true, err) < 0) {
			r = -err->code;
			continue;
		}
		snprintf(line, sizeof(line), "publish 127.0.0.1 %u %u\n", p, p);
		if (tell(vm, line, err) < 0) {
			r = -err->code;
			continue;
		}
		n->autos[n->nauto++] = p;
	}
	return r;
}
