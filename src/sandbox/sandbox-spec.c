/* The one place that says what a sandbox is made of (sandbox.h, struct
 * cap_sandbox_spec): disk serials and order, SETUP, the NIC. */
#include <stdio.h>
#include <string.h>

#include "layout.h"
#include "sandbox.h"
#include "util.h"

/* The guest finds each disk by its serial (docs/protocol.md, SETUP); the
 * serials are the layout's (layout.h). */

void cap_sandbox_spec_init(struct cap_sandbox_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->setup = (struct cap_setup){ .root_image = "", .root_upper = "", .work = "",
				       .source = "", .workspace = "", .hostname = s->hostname };
	cap_net_policy_init(&s->net);
}

static void add_disk(struct cap_sandbox_spec *s, const char *path, const char *serial,
		     bool readonly, bool per_sandbox)
{
	CAP_BUG_ON(s->ndisks >= CAP_SPEC_MAX_DISKS);
	s->disks[s->ndisks++] = (struct cap_vm_disk){ path, serial, readonly, per_sandbox, NULL };
}

void cap_sandbox_spec_named(struct cap_sandbox_spec *s, const char *image,
			    const char *upper, const char *work,
			    const char *source, const char *workspace, const char *hostname)
{
	cap_sandbox_spec_init(s);
	add_disk(s, image, CAP_GUEST_SERIAL_ROOT, true, false);
	add_disk(s, upper, CAP_GUEST_SERIAL_UPPER, false, true);
	add_disk(s, work, CAP_GUEST_SERIAL_WORK, false, true);
	add_disk(s, source, CAP_GUEST_SERIAL_SOURCE, true, true);
	s->setup.root_image = CAP_GUEST_SERIAL_ROOT;
	s->setup.root_upper = CAP_GUEST_SERIAL_UPPER;
	s->setup.work = CAP_GUEST_SERIAL_WORK;
	s->setup.source = CAP_GUEST_SERIAL_SOURCE;
	if (workspace) {
		add_disk(s, workspace, CAP_GUEST_SERIAL_WORKSPACE, false, true);
		s->setup.workspace = CAP_GUEST_SERIAL_WORKSPACE;
	}
	snprintf(s->hostname, sizeof(s->hostname), "%s", hostname ? hostname : "");
	if (!cap_proto_valid_name(s->hostname))
		snprintf(s->hostname, sizeof(s->hostname), "capsule");
}

void cap_sandbox_spec_root_readonly(struct cap_sandbox_spec *s, bool readonly)
{
	s->setup.root_readonly = readonly;
}

void cap_sandbox_spec_tools_root(struct cap_sandbox_spec *s, bool root)
{
	s->setup.tools_root = root;
}

void cap_sandbox_spec_tmpfs(struct cap_sandbox_spec *s, const struct cap_setup_tmpfs *t,
			    uint32_t n)
{
	CAP_BUG_ON(n > CAP_SETUP_MAX_TMPFS);
	if (n)
		memcpy(s->tmpfs, t, n * sizeof(*t));
	s->setup.tmpfs = n ? s->tmpfs : NULL;
	s->setup.ntmpfs = n;
}

void cap_sandbox_spec_oneshot(struct cap_sandbox_spec *s, const char *source_image)
{
	cap_sandbox_spec_init(s);
	if (source_image) {
		add_disk(s, source_image, CAP_GUEST_SERIAL_SOURCE, true, true);
		s->setup.source = CAP_GUEST_SERIAL_SOURCE;
	}
}

void cap_sandbox_spec_network(struct cap_sandbox_spec *s, const struct cap_net_policy *p)
{
	s->net = *p;
	s->append[0] = '\0';
	if (!p->enabled) {
		s->setup.net_addr = s->setup.net_gateway = s->setup.net_dns = 0;
		s->setup.net_prefix = 0;
		s->setup.proxy_port = 0;
		s->setup.auto_publish = false;
		return;
	}
	s->setup.net_addr = CAP_NET_GUEST_ADDR;
	s->setup.net_prefix = CAP_NET_PREFIX;
	s->setup.net_gateway = CAP_NET_GATEWAY;
	s->setup.net_dns = CAP_NET_DNS;
	s->setup.proxy_port = CAP_NET_PROXY_PORT;
	s->setup.auto_publish = p->auto_publish;
	char a[16], g[16];
	snprintf(s->append, sizeof(s->append), "capsule.net=%s/%u,%s", cap_net_addr_str(s->setup.net_addr, a),
		 s->setup.net_prefix, cap_net_addr_str(s->setup.net_gateway, g));
}

void cap_sandbox_spec_pod(struct cap_sandbox_spec *s, const char *netns, const struct cap_pod_net *p)
{
	CAP_BUG_ON(p->nroutes > CAP_SETUP_MAX_ROUTES);
	s->has_pod = true;
	s->pod_netns = netns;
	s->pod = *p;
	s->append[0] = '\0';
	struct cap_setup *u = &s->setup;
	u->net_addr = p->addr;
	u->net_prefix = p->prefix;
	u->net_gateway = p->gateway;
	u->net_dns = 0;
	u->proxy_port = 0;
	u->auto_publish = true;
	u->net_static = true;
	memcpy(u->net_mac, p->mac, 6);
	u->net_mtu = p->mtu;
	u->nroutes = p->nroutes;
	for (unsigned i = 0; i < p->nroutes; i++)
		u->routes[i] = (struct cap_setup_route){ p->routes[i].dst, p->routes[i].len, p->routes[i].gateway };
}

void cap_sandbox_spec_shape(const struct cap_sandbox_spec *s, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (unsigned i = 0; i < s->ndisks && used < len; i++) {
		const struct cap_vm_disk *d = &s->disks[i];
		used += (size_t)snprintf(buf + used, len - used, "disk%u=%s:%s:%s ", i, d->serial,
					 d->readonly ? "ro" : "rw", d->per_sandbox ? "own" : "shared");
	}
	if (used < len)
		snprintf(buf + used, len - used, "%s", s->net.enabled ? "nic" : s->has_pod ? "pod-nic" : "no-nic");
}

const char *cap_sandbox_disk_role(const char *serial)
{
	const struct cap_guest_mount *m = cap_guest_mount_by_serial(serial);
	return m ? m->role : serial;
}
