/* Policies for the unit tests (test-net.c, test-spec.c); include after
 * cmocka.h. */
#ifndef CAP_TEST_NET_FIXTURES_H
#define CAP_TEST_NET_FIXTURES_H

#include <stdlib.h>

#include "policy.h"

static struct cap_net_policy *new_policy(void)
{
	struct cap_net_policy *p = malloc(sizeof(*p));
	assert_non_null(p);
	cap_net_policy_init(p);
	return p;
}

/* A policy from flag words ("allow-lan", "allow-egress=10.0.0.0/8"),
 * each one that must apply. */
static struct cap_net_policy *policy_of(const char *const *words)
{
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };

	for (; *words; words++)
		if (cap_net_policy_apply(p, *words, NULL, &err) < 0)
			fail_msg("applying %s: %s", *words, err.msg);
	return p;
}

#endif
