/* A sandbox's network policy (docs/network.md, DESIGN §9): whether it has
 * a NIC at all, what its guest may reach, and which ports it publishes.
 * Pure data and decisions: no I/O, no JSON, no processes. Used by the
 * front ends (parsing flags), the sandbox layer (records, nftables set)
 * and the policy process (every connection and DNS query).
 *
 * Addresses are IPv4 in host byte order. */
#ifndef CAP_NET_POLICY_H
#define CAP_NET_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* The guest's view, fixed (QEMU user networking's defaults): the guest
 * is 10.0.2.15/24, the gateway (the host, "host.capsule.internal") is
 * 10.0.2.2, the DNS server 10.0.2.3, the HTTP proxy gateway:3128. */
#define CAP_NET_GUEST_ADDR 0x0a00020fu
#define CAP_NET_GATEWAY 0x0a000202u
#define CAP_NET_DNS 0x0a000203u
#define CAP_NET_PREFIX 24
#define CAP_NET_PROXY_PORT 3128
#define CAP_NET_HOST_NAME "host.capsule.internal"

/* Where an address belongs. */
enum cap_net_group {
	CAP_NET_PUBLIC,		/* everything not below (documentation ranges included) */
	CAP_NET_LAN,		/* 10/8, 172.16/12, 192.168/16, 100.64/10 */
	CAP_NET_HOST,		/* the gateway: seen by the policy process as 127.0.0.0/8 */
	CAP_NET_LINKLOCAL,	/* 169.254/16, cloud metadata 169.254.169.254 included */
	CAP_NET_RESERVED,	/* 0/8, 224/4 multicast, 240/4 and broadcast: never */
};

/* One --allow-egress RULE. */
enum cap_net_rule_kind {
	CAP_NET_RULE_CIDR,	/* "203.0.113.10", "10.0.0.0/8" */
	CAP_NET_RULE_HOST,	/* "example.com": that name only */
	CAP_NET_RULE_DOMAIN,	/* "*.example.com": names under it, not itself */
};

struct cap_net_rule {
	enum cap_net_rule_kind kind;
	uint32_t addr;		/* CIDR: network address (host bits zero) */
	unsigned prefix;	/* CIDR: 0..32 */
	char name[254];		/* HOST/DOMAIN: lowercase, no trailing dot, no "*." */
	uint16_t port;		/* 0: every port */
	char text[300];		/* as the user wrote it, for messages */
};

/* One --publish [BIND:]HOST_PORT:GUEST_PORT (TCP). */
struct cap_net_publish {
	uint32_t bind;		/* default 127.0.0.1 */
	uint16_t host_port;
	uint16_t guest_port;
};

#define CAP_NET_MAX_RULES 64
#define CAP_NET_MAX_PUBLISH 64

/* One --secret NAME=SOURCE@HOST[,HOST...][:body] (docs/network.md,
 * "Secrets"). The guest's environment gets NAME=<placeholder>; the
 * policy process puts the value read from SOURCE (on the host, at each
 * start: secret.h) in its place in HTTPS requests to HOST only. Only
 * the declaration is here (and in records): never the value. A secret's
 * hosts are allowed for egress on port 443 (CAP_NET_SECRET_PORT), as if
 * each were an --allow-egress HOST:443. */
#define CAP_NET_MAX_SECRETS 16
#define CAP_NET_SECRET_MAX_HOSTS 8
#define CAP_NET_SECRET_PORT 443
struct cap_net_secret {
	char name[64];		/* [A-Za-z_][A-Za-z0-9_]{0,62} */
	char source[520];	/* "env:VAR" or "file:/absolute/path" */
	/* HOST (that name only) or *.DOMAIN (names under it), lowercase,
	 * no trailing dot, as cap_net_rule names them (kind HOST or DOMAIN;
	 * name without the "*."). */
	struct {
		enum { CAP_NET_SECRET_HOST, CAP_NET_SECRET_DOMAIN } kind;
		char name[254];
	} hosts[CAP_NET_SECRET_MAX_HOSTS];
	unsigned nhosts;
	bool body;		/* ":body": also in request bodies */
	/* Set only in the secrets a sandbox's start derives from a
	 * --secret-file (sandbox-net.c), never parsed or recorded: source
	 * "json:/HOSTFILE", field the dotted path of the string member the
	 * value is, no guest variable. */
	char field[128];
	bool from_file;
};

/* One --secret-file GUESTPATH=HOSTFILE[:FIELD,...]@HOST[,HOST...]
 * (docs/coding-agents.md, "Credential files"). The guest gets, at
 * GUESTPATH (under /work), a copy of the JSON file HOSTFILE in which each
 * FIELD's string value is a placeholder (without FIELDs: every string
 * member whose name says it is a credential, found at each start); each
 * value is a secret sent to HOST in request headers only, re-read when
 * the host file changes. Only the declaration is here. */
#define CAP_NET_MAX_SECRET_FILES 4
#define CAP_NET_SECRET_FILE_FIELDS 8
struct cap_net_secret_file {
	char guest[256];	/* absolute, under /work, normalised */
	char host[512];		/* absolute */
	char fields[CAP_NET_SECRET_FILE_FIELDS][128];	/* dotted paths */
	unsigned nfields;	/* 0: discovered at each start */
	/* Its hosts, as a secret's (name and source unused). */
	struct cap_net_secret hosts;
};

struct cap_net_policy {
	bool enabled;		/* a NIC at all: set by any flag below */
	bool allow_public;
	bool allow_lan;
	bool allow_host;
	bool auto_publish;
	struct cap_net_rule rules[CAP_NET_MAX_RULES];
	unsigned nrules;
	struct cap_net_publish publish[CAP_NET_MAX_PUBLISH];
	unsigned npublish;
	struct cap_net_secret secrets[CAP_NET_MAX_SECRETS];
	unsigned nsecrets;
	struct cap_net_secret_file secret_files[CAP_NET_MAX_SECRET_FILES];
	unsigned nsecret_files;
};

/* No NIC. */
void cap_net_policy_init(struct cap_net_policy *p);

/* Parse one --allow-egress RULE into p (and set p->enabled): an IPv4
 * address or CIDR, HOST or *.DOMAIN, each optionally :PORT (1-65535).
 * -EINVAL with err naming the rule and what is wrong with it; -E2BIG past
 * CAP_NET_MAX_RULES. p is unchanged on failure. */
int cap_net_rule_add(struct cap_net_policy *p, const char *text, struct cap_err *err);

/* Parse one --publish [BIND:]HOST_PORT:GUEST_PORT (BIND an IPv4 address,
 * default 127.0.0.1; ports 1-65535). Same errors. */
int cap_net_publish_add(struct cap_net_policy *p, const char *text, struct cap_err *err);

/* Parse one --secret NAME=SOURCE@HOST[,HOST...][:body] into p (and set
 * p->enabled). SOURCE is env:VAR or file:/ABSOLUTE/PATH (the CLI makes a
 * relative path absolute first); HOST a name or *.DOMAIN, no port, no
 * address. The value is not read here. -EINVAL naming the part at fault;
 * -EEXIST for a NAME declared twice; -E2BIG past CAP_NET_MAX_SECRETS. */
int cap_net_secret_add(struct cap_net_policy *p, const char *text, struct cap_err *err);
/* Its text form, as cap_net_secret_add reads it back. */
void cap_net_secret_text(const struct cap_net_secret *s, char *buf, size_t len);
/* Parse one --secret-file GUESTPATH=HOSTFILE[:FIELD,...]@HOST[,HOST...]
 * into p (and set p->enabled). GUESTPATH is absolute under /work, or
 * relative to it ("~/" is /work/); HOSTFILE absolute (the CLI makes a
 * relative one absolute); FIELD a dotted path of JSON object members
 * (a.b.c: letters, digits, '_' and '-'). Nothing is read here. -EINVAL
 * naming the part at fault; -EEXIST for a GUESTPATH given twice; -E2BIG
 * past the bounds. */
int cap_net_secret_file_add(struct cap_net_policy *p, const char *text, struct cap_err *err);
void cap_net_secret_file_text(const struct cap_net_secret_file *f, char *buf, size_t len);
/* Whether name (lowercase, no port) is one of s's hosts. */
bool cap_net_secret_host_match(const struct cap_net_secret *s, const char *name);

/* Apply one flag by its long name without dashes, as the CLI, the JSON
 * configs and the record all spell it: "allow-egress", "publish" and
 * "secret" take value; "allow-public", "allow-lan", "allow-host", "auto-publish" take
 * none (value NULL). -EINVAL naming an unknown flag or a bad value. */
int cap_net_policy_apply(struct cap_net_policy *p, const char *flag,
			 const char *value, struct cap_err *err);

/* The policy as words in flag form, one per array entry, that
 * cap_net_policy_apply reads back to the same policy:
 * {"allow-public", "allow-egress=10.0.0.0/8", "publish=127.0.0.1:8080:80"}.
 * An empty array for no NIC. *v and each string are new; n is the count. */
void cap_net_policy_words(const struct cap_net_policy *p, char ***v, size_t *n);
/* The same as one line for people: "--allow-public --allow-egress
 * 10.0.0.0/8 --publish 127.0.0.1:8080:80", or "none (no network
 * interface)". New string. */
char *cap_net_policy_describe(const struct cap_net_policy *p);
/* The words on one line, separated by single spaces ("" for no NIC):
 * how a record stores a policy and how the owner hands it to the policy
 * process. New string. */
char *cap_net_policy_line(const struct cap_net_policy *p);
/* The secret words of that line alone ("" for none): what a policy
 * process holds from its start to its end (a new policy does not change
 * them). New string. */
char *cap_net_policy_secrets_line(const struct cap_net_policy *p);
/* Read such a line back into p (replacing it). -EINVAL (or -E2BIG) with
 * err "'WORD' is not valid: why"; p is unchanged on failure. */
int cap_net_policy_parse_line(struct cap_net_policy *p, const char *line,
			      struct cap_err *err);

enum cap_net_group cap_net_classify(uint32_t addr);
const char *cap_net_group_name(enum cap_net_group g);	/* "public", "lan", ... */

/* A decision and the rule that made it, for the log:
 * "--allow-egress 203.0.113.0/24", "--allow-public",
 * "metadata and link-local are denied unless named exactly by --allow-egress",
 * "no rule allows 198.51.100.7:80". */
struct cap_net_verdict {
	bool allow;
	char rule[400];
};

/* May the guest connect to addr:port? name is what the connection is
 * known by (the DNS name the policy process answered with addr, the
 * CONNECT host, the TLS SNI or HTTP Host), or NULL. addr is as the policy
 * process sees it: the gateway arrives as 127.0.0.1 and is CAP_NET_HOST.
 *
 * In order: RESERVED is refused; an --allow-egress CIDR containing addr
 * (with a matching port) allows it, except that LINKLOCAL and HOST
 * addresses are opened only by a rule whose whole range lies inside
 * 169.254.0.0/16 ("named exactly"; HOST only by --allow-host);
 * --allow-public opens PUBLIC, --allow-lan LAN, --allow-host HOST; a
 * HOST/DOMAIN rule (or a secret's host, port 443) matching name (and
 * port) allows PUBLIC addresses and
 * those of opened groups only (a name that resolves to a LAN, host or
 * metadata address is refused: DNS rebinding); anything else is refused. */
void cap_net_decide(const struct cap_net_policy *p, uint32_t addr, uint16_t port,
		    const char *name, struct cap_net_verdict *v);

/* May the guest resolve name? Yes under --allow-public, or when a
 * HOST/DOMAIN rule or a secret's host matches it (any port). CAP_NET_HOST_NAME is never
 * asked (it is in the guest's /etc/hosts). */
void cap_net_decide_name(const struct cap_net_policy *p, const char *name,
			 struct cap_net_verdict *v);

/* Whether a name is acceptable at all: 1 to 253 bytes of [A-Za-z0-9.-_],
 * labels of 1 to 63; no control character or whitespace (a CONNECT
 * target, an SNI, a Host header). */
bool cap_net_valid_name(const char *name, size_t len);

/* Address ranges [lo, hi] (inclusive, host order, sorted, disjoint) that
 * no connection can be allowed to whatever name it comes with: what the
 * nftables set refuses in the kernel so the guest sees a reset, not a
 * hang. The complement of everything some rule or group could open.
 * Returns the number of ranges written (at most max; the ranges are few:
 * a bound of 2 * nrules + 16 suffices). */
size_t cap_net_denied_ranges(const struct cap_net_policy *p, uint32_t (*out)[2], size_t max);

/* "a.b.c.d" for addr (host order) into buf (16 bytes). */
const char *cap_net_addr_str(uint32_t addr, char buf[16]);
/* Parse "a.b.c.d" strictly (no octal, no shortened forms). */
bool cap_net_addr_parse(const char *s, uint32_t *out);

#endif
