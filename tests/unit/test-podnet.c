/* The pod network's rtnetlink requests and route reading
 * (engine-podnet.h), without a namespace or a socket. */
#include <arpa/inet.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <linux/tc_act/tc_mirred.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "engine-podnet.h"

/* The attribute of type t among nlh's after a fixed header of size
 * fixed (or inside nest when nest is set), NULL when there is none. */
static const struct nlattr *attr(const struct nlmsghdr *nlh, size_t fixed, const struct nlattr *nest, uint16_t t)
{
	const struct nlattr *a;
	if (nest) {
		mnl_attr_for_each_nested(a, nest)
			if (mnl_attr_get_type(a) == t)
				return a;
		return NULL;
	}
	mnl_attr_for_each(a, nlh, fixed)
		if (mnl_attr_get_type(a) == t)
			return a;
	return NULL;
}

/* The request that was sent without NLM_F_ACK: a NEW with NLM_F_EXCL
 * (NLM_F_MATCH's bit) asks for its ACK like any other, and a dump
 * keeps its flags. */
static void test_request_asks_for_ack(void **state)
{
	(void)state;
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct nlmsghdr *nlh = cap_podnet_ingress_msg(buf, 3, true);
	cap_podnet_request(nlh, 7);
	assert_int_equal(nlh->nlmsg_seq, 7);
	assert_int_equal(nlh->nlmsg_flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
	nlh = cap_podnet_redirect_msg(buf, 3, 4);
	cap_podnet_request(nlh, 8);
	assert_true(nlh->nlmsg_flags & NLM_F_ACK);
	nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_GETLINK;
	nlh->nlmsg_flags = NLM_F_DUMP;
	cap_podnet_request(nlh, 9);
	assert_int_equal(nlh->nlmsg_flags & NLM_F_DUMP, NLM_F_DUMP);
	assert_true(nlh->nlmsg_flags & NLM_F_REQUEST);
}

static void test_ingress_msg(void **state)
{
	(void)state;
	char buf[MNL_SOCKET_BUFFER_SIZE];
	for (int add = 0; add < 2; add++) {
		struct nlmsghdr *nlh = cap_podnet_ingress_msg(buf, 5, add);
		assert_int_equal(nlh->nlmsg_type, add ? RTM_NEWQDISC : RTM_DELQDISC);
		assert_int_equal(nlh->nlmsg_flags, NLM_F_REQUEST | (add ? NLM_F_CREATE | NLM_F_EXCL : 0));
		const struct tcmsg *t = mnl_nlmsg_get_payload(nlh);
		assert_int_equal(t->tcm_ifindex, 5);
		assert_int_equal(t->tcm_parent, TC_H_INGRESS);
		assert_int_equal(t->tcm_handle, 0xffff0000u);
		const struct nlattr *k = attr(nlh, sizeof(*t), NULL, TCA_KIND);
		assert_non_null(k);
		assert_string_equal(mnl_attr_get_str(k), "ingress");
	}
}

static void test_redirect_msg(void **state)
{
	(void)state;
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct nlmsghdr *nlh = cap_podnet_redirect_msg(buf, 2, 9);
	assert_int_equal(nlh->nlmsg_type, RTM_NEWTFILTER);
	assert_int_equal(nlh->nlmsg_flags, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL);
	assert_int_equal(mnl_nlmsg_ok(nlh, (int)nlh->nlmsg_len), 1);
	const struct tcmsg *t = mnl_nlmsg_get_payload(nlh);
	assert_int_equal(t->tcm_ifindex, 2);
	assert_int_equal(t->tcm_parent, 0xffff0000u);
	assert_int_equal(TC_H_MIN(t->tcm_info), htons(ETH_P_ALL));
	assert_int_not_equal(TC_H_MAJ(t->tcm_info), 0);
	assert_string_equal(mnl_attr_get_str(attr(nlh, sizeof(*t), NULL, TCA_KIND)), "u32");
	const struct nlattr *opts = attr(nlh, sizeof(*t), NULL, TCA_OPTIONS);
	assert_non_null(opts);
	/* One key matching anything, the node terminal. */
	const struct nlattr *sel = attr(nlh, 0, opts, TCA_U32_SEL);
	assert_non_null(sel);
	assert_int_equal(mnl_attr_get_payload_len(sel), sizeof(struct tc_u32_sel) + sizeof(struct tc_u32_key));
	const struct tc_u32_sel *s = mnl_attr_get_payload(sel);
	assert_int_equal(s->nkeys, 1);
	assert_true(s->flags & TC_U32_TERMINAL);
	assert_int_equal(s->keys[0].mask, 0);
	assert_int_equal(s->keys[0].val, 0);
	/* Its one action: mirred, egress redirect to 9, the packet stolen. */
	const struct nlattr *acts = attr(nlh, 0, opts, TCA_U32_ACT);
	assert_non_null(acts);
	const struct nlattr *act = attr(nlh, 0, acts, 1);
	assert_non_null(act);
	assert_null(attr(nlh, 0, acts, 2));
	assert_string_equal(mnl_attr_get_str(attr(nlh, 0, act, TCA_ACT_KIND)), "mirred");
	const struct nlattr *aopts = attr(nlh, 0, act, TCA_ACT_OPTIONS);
	assert_non_null(aopts);
	const struct nlattr *parms = attr(nlh, 0, aopts, TCA_MIRRED_PARMS);
	assert_non_null(parms);
	assert_int_equal(mnl_attr_get_payload_len(parms), sizeof(struct tc_mirred));
	const struct tc_mirred *m = mnl_attr_get_payload(parms);
	assert_int_equal(m->eaction, TCA_EGRESS_REDIR);
	assert_int_equal(m->action, TC_ACT_STOLEN);
	assert_int_equal(m->ifindex, 9);
}

/* An RTM_NEWROUTE as a dump gives it. */
static struct nlmsghdr *route(char *buf, uint32_t dst, uint8_t len, uint32_t gw, int oif, uint8_t proto,
			      uint8_t table, uint8_t family)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_NEWROUTE;
	struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof(*rtm));
	rtm->rtm_family = family;
	rtm->rtm_dst_len = len;
	rtm->rtm_table = table;
	rtm->rtm_protocol = proto;
	rtm->rtm_type = RTN_UNICAST;
	if (len)
		mnl_attr_put_u32(nlh, RTA_DST, htonl(dst));
	if (gw)
		mnl_attr_put_u32(nlh, RTA_GATEWAY, htonl(gw));
	mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)oif);
	return nlh;
}

static void test_routes(void **state)
{
	(void)state;
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct cap_pod_net p;
	memset(&p, 0, sizeof(p));
	p.ifindex = 2;
	p.addr = 0x0ae14b02;	/* 10.225.75.2/24 */
	p.prefix = 24;
	/* The default route: the gateway, not a route. */
	assert_int_equal(cap_podnet_route(&p, route(buf, 0, 0, 0x0ae14b01, 2, RTPROT_BOOT, RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(p.gateway, 0x0ae14b01);
	assert_int_equal(p.nroutes, 0);
	/* The kernel's for the address's subnet: the guest makes its own. */
	assert_int_equal(cap_podnet_route(&p, route(buf, 0x0ae14b00, 24, 0, 2, RTPROT_KERNEL, RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(p.nroutes, 0);
	/* Another device's, another table's, IPv6: none of the pod's. */
	assert_int_equal(cap_podnet_route(&p, route(buf, 0x0a000000, 8, 0, 3, RTPROT_BOOT, RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(cap_podnet_route(&p, route(buf, 0x0a000000, 8, 0, 2, RTPROT_BOOT, RT_TABLE_LOCAL, AF_INET)), 0);
	assert_int_equal(cap_podnet_route(&p, route(buf, 0, 0, 0, 2, RTPROT_BOOT, RT_TABLE_MAIN, AF_INET6)), 0);
	assert_int_equal(p.nroutes, 0);
	assert_int_equal(p.gateway, 0x0ae14b01);
	/* One on-link, one via a gateway: kept in order. */
	assert_int_equal(cap_podnet_route(&p, route(buf, 0x0a000000, 8, 0, 2, RTPROT_BOOT, RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(cap_podnet_route(&p, route(buf, 0xc0a80000, 16, 0x0ae14b01, 2, RTPROT_STATIC, RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(p.nroutes, 2);
	assert_int_equal(p.routes[0].dst, 0x0a000000);
	assert_int_equal(p.routes[0].len, 8);
	assert_int_equal(p.routes[0].gateway, 0);
	assert_int_equal(p.routes[1].dst, 0xc0a80000);
	assert_int_equal(p.routes[1].len, 16);
	assert_int_equal(p.routes[1].gateway, 0x0ae14b01);
	/* Full: refused, nothing overwritten. */
	while (p.nroutes < CAP_POD_MAX_ROUTES)
		assert_int_equal(cap_podnet_route(&p, route(buf, 0xac100000 + (p.nroutes << 8), 24, 0, 2, RTPROT_BOOT,
							      RT_TABLE_MAIN, AF_INET)), 0);
	assert_int_equal(cap_podnet_route(&p, route(buf, 0xac200000, 16, 0, 2, RTPROT_BOOT, RT_TABLE_MAIN, AF_INET)),
			 -E2BIG);
	assert_int_equal(p.nroutes, CAP_POD_MAX_ROUTES);
	assert_int_equal(p.routes[0].dst, 0x0a000000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_asks_for_ack),
		cmocka_unit_test(test_ingress_msg),
		cmocka_unit_test(test_redirect_msg),
		cmocka_unit_test(test_routes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
