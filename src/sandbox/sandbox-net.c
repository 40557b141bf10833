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
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ca.h"
#include "credfile.h"
#include "sha256.h"
#include "log.h"
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
	unsigned nenv;
	/* Credential files (--secret-file): kept for the VM's life, with no
	 * value in them; the host file is watched (inotify on its
	 * directory, which a rename-over replaces the file in). */
	struct cred_watch {
		struct cap_net_secret_file decl;
		unsigned first, count;	/* its secrets: the policy process's [first, first + count) */
		char fields[CAP_NET_MAX_SECRETS][128];
		char placeholders[CAP_NET_MAX_SECRETS][CAP_NET_PLACEHOLDER_LEN + 1];
		struct stat seen;	/* the file as last read */
		char sent[65];	/* SHA-256 over the values last given, hex */
		int wd;
	} creds[CAP_NET_MAX_SECRET_FILES];
	unsigned ncreds;
	int inotify_fd;
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

/* --- credential files ------------------------------------------------------------ */

/* The name of a credential file's field as a secret: its last part and
 * 8 hex digits of the file's guest path and the field, stable from one
 * start to the next (the placeholder is made from it). */
static void file_secret_name(const struct cap_net_secret_file *f, const char *field, char out[64])
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, f->guest, strlen(f->guest) + 1);
	cap_sha256_update(&h, field, strlen(field));
	cap_sha256_final_hex(&h, hex);
	const char *last = strrchr(field, '.');
	snprintf(out, 64, "%.40s~%.8s", last ? last + 1 : field, hex);
}

static void stat_of(const char *path, struct stat *st)
{
	if (stat(path, st) < 0)
		memset(st, 0, sizeof(*st));
}

static bool same_stat(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Each --secret-file's fields become secrets of this start, after the
 * policy's own: read now, found in the file (or named), each sent to the
 * file's hosts. */
static int derive_file_secrets(struct cap_sandbox_net *n, struct cap_err *err)
{
	struct cap_net_policy *p = &n->policy;
	unsigned own = p->nsecrets;
	for (unsigned i = 0; i < own; i++)
		if (p->secrets[i].from_file)
			own = i;	/* a policy copied from an earlier start's */
	p->nsecrets = own;
	for (unsigned i = 0; i < p->nsecret_files; i++) {
		const struct cap_net_secret_file *f = &p->secret_files[i];
		struct cred_watch *w = &n->creds[n->ncreds];
		struct cap_cred_file *c;
		int r;
		memset(w, 0, sizeof(*w));
		w->decl = *f;
		w->wd = -1;
		stat_of(f->host, &w->seen);
		if ((r = cap_cred_file_read(f->host, &c, err)) < 0) {
			cap_err_prefix(err, "--secret-file %s: ", f->guest);
			return r;
		}
		r = cap_cred_file_fields(c, f, w->fields, CAP_NET_MAX_SECRETS - p->nsecrets, &w->count, err);
		cap_cred_file_free(c);
		if (r < 0) {
			if (r == -E2BIG)
				cap_err_set(err, E2BIG, "--secret-file %s: more than %d secrets with the other secrets and files",
					    f->guest, CAP_NET_MAX_SECRETS);
			return r;
		}
		if (w->count == 0)
			return cap_err_set(err, ENOENT,
					   "--secret-file %s: %s has no field that looks like a credential (a string named like a token, key, secret or password, of %d bytes or more): name them, GUESTPATH=HOSTFILE:FIELD,...",
					   f->guest, f->host, CAP_NET_SECRET_VALUE_MIN);
		w->first = p->nsecrets;
		for (unsigned k = 0; k < w->count; k++) {
			struct cap_net_secret *s = &p->secrets[p->nsecrets++];
			*s = f->hosts;
			file_secret_name(f, w->fields[k], s->name);
			/* Both inside n: copies, not snprintf from n into n. */
			size_t hl = strnlen(f->host, sizeof(s->source) - 6);
			memcpy(s->source, "json:", 5);
			memcpy(s->source + 5, f->host, hl);
			s->source[5 + hl] = '\0';
			memcpy(s->field, w->fields[k], sizeof(s->field));
			s->body = false;
			s->from_file = true;
		}
		n->ncreds++;
	}
	return 0;
}

/* The value of a secret derived from a credential file, read now. */
static int file_value(const struct cap_net_secret *s, char **value, size_t *len,
		      struct cap_err *err)
{
	struct cap_cred_file *c;
	int r = cap_cred_file_read(s->source + 5, &c, err);
	if (r < 0)
		return r;
	size_t vl = 0;
	const char *v = cap_cred_file_value(c, s->field, &vl);
	char what[700];
	snprintf(what, sizeof(what), "the field %s of %s", s->field, s->source + 5);
	if (!v)
		r = cap_err_set(err, ENOENT, "credential file %s has no string at %s", s->source + 5, s->field);
	else if ((r = cap_net_secret_check(s, what, v, vl, err)) == 0) {
		*value = xmalloc(vl + 1);
		memcpy(*value, v, vl);
		(*value)[vl] = '\0';
		*len = vl;
	}
	cap_cred_file_free(c);
	return r;
}

/* With secrets in the policy: the sandbox's CA (kept in o->ca_dir, or
 * made for this start), the host's trust store, each value read from
 * its source now, and the placeholders. Any failure fails the start. */
static int load_secrets(struct cap_sandbox_net *n, const struct cap_sandbox_opts *o,
			struct cap_err *err)
{
	const struct cap_net_policy *p = &n->policy;
	int r;

	if ((r = derive_file_secrets(n, err)) < 0)
		return r;
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
		if (p->secrets[i].from_file)
			r = file_value(&p->secrets[i], &v, &len, err);
		else
			r = cap_net_secret_value(&p->secrets[i], &v, &len, err);
		if (r < 0)
			return r;
		n->owned_values[i] = v;
		s->decl = &p->secrets[i];
		s->value = v;
		s->value_len = len;
		n->nsecrets = i + 1;
		cap_net_secret_placeholder(n->ca.fp, p->secrets[i].name, s->placeholder);
		if (p->secrets[i].from_file)
			continue;	/* in the guest's copy of its file, not its environment */
		/* NAME=placeholder (both inside n: no snprintf from n into n). */
		size_t nl = strnlen(p->secrets[i].name, sizeof(p->secrets[i].name) - 1);
		char *e = n->env[n->nenv];
		memcpy(e, p->secrets[i].name, nl);
		e[nl] = '=';
		memcpy(e + nl + 1, s->placeholder, sizeof(s->placeholder));
		n->envp[n->nenv++] = e;
	}
	for (unsigned k = 0; k < n->ncreds; k++)
		for (unsigned j = 0; j < n->creds[k].count; j++)
			memcpy(n->creds[k].placeholders[j], n->secrets[n->creds[k].first + j].placeholder,
			       CAP_NET_PLACEHOLDER_LEN + 1);
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
	n->inotify_fd = 0;	/* not made yet; -1 once it failed */
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
	if (s->envc + n->nenv > CAP_SETUP_MAX_ENV)
		return cap_err_set(err, E2BIG, "more than %d variables for the guest's environment",
				   CAP_SETUP_MAX_ENV);
	for (uint32_t i = 0; i < s->envc; i++)
		env[i] = s->env[i];
	for (unsigned i = 0; i < n->nenv; i++)
		env[s->envc + i] = n->envp[i];
	s->env = env;
	s->envc += n->nenv;
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
	if (n->inotify_fd > 0)
		close(n->inotify_fd);
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

/* --- credential files while the VM runs ------------------------------------------ */

int cap_sandbox_net_watch_fd(struct cap_sandbox_net *n)
{
	if (n->ncreds == 0)
		return -1;
	if (n->inotify_fd > 0)
		return n->inotify_fd;
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (fd < 0) {
		cap_log(CAP_LOG_WARN, "credential files: cannot watch them (inotify: %s): a change on the host reaches the sandbox at its next start",
			strerror(errno));
		n->inotify_fd = -1;
		return -1;
	}
	for (unsigned i = 0; i < n->ncreds; i++) {
		_cleanup_free_ char *dir = xstrdup(n->creds[i].decl.host);
		char *slash = strrchr(dir, '/');
		if (slash)
			*(slash == dir ? slash + 1 : slash) = '\0';
		n->creds[i].wd = inotify_add_watch(fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ATTRIB |
							    IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF);
		if (n->creds[i].wd < 0)
			cap_log(CAP_LOG_WARN, "credential file %s: cannot watch %s: %s; a change reaches the sandbox at its next start",
				n->creds[i].decl.host, dir, strerror(errno));
	}
	n->inotify_fd = fd;
	return fd;
}

static void hex_of(const char *v, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[(unsigned char)v[i] >> 4];
		out[2 * i + 1] = digits[(unsigned char)v[i] & 15];
	}
	out[2 * len] = '\0';
}

static int tell(struct cap_vm *vm, const char *line, struct cap_err *err);

/* Read w's file now: its values checked, each sent to the policy process
 * when they changed (vm not NULL), and the guest's copy made. */
static int cred_read(struct cred_watch *w, struct cap_vm *vm,
		     struct cap_sandbox_cred_copy *copy, struct cap_err *err)
{
	struct cap_cred_file *c;
	const char *values[CAP_NET_MAX_SECRETS], *ph[CAP_NET_MAX_SECRETS];
	size_t lens[CAP_NET_MAX_SECRETS];
	struct cap_sha256 h;
	char sum[65];
	int r;

	stat_of(w->decl.host, &w->seen);
	if ((r = cap_cred_file_read(w->decl.host, &c, err)) < 0)
		return r;
	cap_sha256_init(&h);
	for (unsigned k = 0; k < w->count && r == 0; k++) {
		/* The secret as derived at start (n->policy may have been
		 * replaced since: the policy process's indices stay). */
		struct cap_net_secret *s = xmalloc(sizeof(*s));
		*s = w->decl.hosts;
		file_secret_name(&w->decl, w->fields[k], s->name);
		snprintf(s->source, sizeof(s->source), "json:%s", w->decl.host);
		char what[700];
		values[k] = cap_cred_file_value(c, w->fields[k], &lens[k]);
		ph[k] = w->placeholders[k];
		snprintf(what, sizeof(what), "the field %s of %s", w->fields[k], w->decl.host);
		if (!values[k])
			r = cap_err_set(err, ENOENT, "credential file %s has no string at %s now", w->decl.host, w->fields[k]);
		else
			r = cap_net_secret_check(s, what, values[k], lens[k], err);
		free(s);
		if (r == 0) {
			cap_sha256_update(&h, values[k], lens[k]);
			cap_sha256_update(&h, "", 1);
		}
	}
	if (r == 0) {
		cap_sha256_final_hex(&h, sum);
		if (vm && memcmp(sum, w->sent, sizeof(sum)) != 0) {
			for (unsigned k = 0; k < w->count && r == 0; k++) {
				char *line = xmalloc(2 * lens[k] + 32);
				snprintf(line, 32, "secret %u ", w->first + k);
				size_t o = strlen(line);
				hex_of(values[k], lens[k], line + o);
				strcat(line + o, "\n");
				r = tell(vm, line, err);
				explicit_bzero(line, 2 * lens[k] + 32);
				free(line);
			}
			if (r == 0)
				cap_log(CAP_LOG_INFO, "credential file %s changed: its %u value(s) given to the policy process",
					w->decl.host, w->count);
		}
		if (r == 0)
			memcpy(w->sent, sum, sizeof(sum));
	}
	if (r == 0) {
		snprintf(copy->path, sizeof(copy->path), "%s", w->decl.guest);
		r = cap_cred_file_render(c, values, lens, ph, w->count, &copy->owned_text, &copy->len, err);
	}
	explicit_bzero(&h, sizeof(h));
	cap_cred_file_free(c);
	return r;
}

int cap_sandbox_net_cred_copies(struct cap_sandbox_net *n, struct cap_vm *vm, bool all,
				struct cap_sandbox_cred_copy out[CAP_NET_MAX_SECRET_FILES], unsigned *nout, struct cap_err *err)
{
	*nout = 0;
	if (!all && n->inotify_fd > 0) {
		char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
		while (read(n->inotify_fd, buf, sizeof(buf)) > 0)
			;	/* which file: its stat says */
	}
	for (unsigned i = 0; i < n->ncreds; i++) {
		struct cred_watch *w = &n->creds[i];
		struct stat now;
		stat_of(w->decl.host, &now);
		if (!all && (same_stat(&now, &w->seen) || now.st_ino == 0))
			continue;	/* unchanged, or gone for now (a rename-over in progress) */
		struct cap_err e = { 0 };
		if (cred_read(w, all ? NULL : vm, &out[*nout], &e) < 0) {
			if (all) {
				*err = e;
				for (unsigned k = 0; k < *nout; k++)
					free(out[k].owned_text);
				*nout = 0;
				return -e.code;
			}
			cap_log(CAP_LOG_WARN, "%s; the sandbox keeps the values it had", e.msg);
			continue;
		}
		(*nout)++;
	}
	return 0;
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
