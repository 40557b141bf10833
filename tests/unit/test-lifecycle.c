/* The idle lifecycle and capacity rules, driven by an injected clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "lifecycle.h"

static struct cap_lifecycle_cfg cfg;

static int setup(void **state)
{
	(void)state;
	cap_lifecycle_cfg_init(&cfg);
	return 0;
}

static void defaults_are_the_contract(void **state)
{
	(void)state;
	assert_int_equal(cfg.idle_pause_ms, 30000);
	assert_int_equal(cfg.idle_stop_ms, 600000);
	assert_int_equal(cfg.capacity, 4);
}

static void running_pauses_then_stops(void **state)
{
	(void)state;
	struct cap_lc s = { .state = CAP_VM_RUNNING, .idle_since = 1000 };
	assert_int_equal(cap_lc_due(&s, &cfg, 1000 + 29999), CAP_LC_NONE);
	assert_int_equal(cap_lc_next(&s, &cfg), 31000);
	assert_int_equal(cap_lc_due(&s, &cfg, 31000), CAP_LC_PAUSE);
	s.state = CAP_VM_PAUSED;
	assert_int_equal(cap_lc_due(&s, &cfg, 31000), CAP_LC_NONE);
	assert_int_equal(cap_lc_next(&s, &cfg), 601000);
	assert_int_equal(cap_lc_due(&s, &cfg, 601000 - 1), CAP_LC_NONE);
	assert_int_equal(cap_lc_due(&s, &cfg, 601000), CAP_LC_STOP);
	/* A running VM idle past both goes straight to stop. */
	s.state = CAP_VM_RUNNING;
	assert_int_equal(cap_lc_due(&s, &cfg, 700000), CAP_LC_STOP);
}

static void work_prevents_transitions(void **state)
{
	(void)state;
	struct cap_lc s = { .state = CAP_VM_RUNNING, .idle_since = 0, .active = 1 };
	assert_int_equal(cap_lc_due(&s, &cfg, 10 * 600000), CAP_LC_NONE);
	assert_int_equal(cap_lc_next(&s, &cfg), INT64_MAX);
	s.active = 0;
	s.queued = 2;
	assert_int_equal(cap_lc_due(&s, &cfg, 10 * 600000), CAP_LC_NONE);
}

static void other_states_do_nothing(void **state)
{
	(void)state;
	enum cap_vm_state st[] = { CAP_VM_NONE, CAP_VM_STOPPED, CAP_VM_STARTING, CAP_VM_STOPPING };
	for (size_t i = 0; i < 4; i++) {
		struct cap_lc s = { .state = st[i] };
		assert_int_equal(cap_lc_due(&s, &cfg, INT64_MAX / 2), CAP_LC_NONE);
		assert_int_equal(cap_lc_next(&s, &cfg), INT64_MAX);
	}
}

static void room_evicts_the_oldest_idle(void **state)
{
	(void)state;
	struct cap_lc a = { .state = CAP_VM_RUNNING, .idle_since = 500 };
	struct cap_lc b = { .state = CAP_VM_PAUSED, .idle_since = 100 };
	struct cap_lc c = { .state = CAP_VM_RUNNING, .idle_since = 50, .active = 1 };
	struct cap_lc d = { .state = CAP_VM_RUNNING, .idle_since = 700 };
	struct cap_lc e = { .state = CAP_VM_STOPPED, .idle_since = 1 };
	const struct cap_lc *v[] = { &a, &b, &c, &d, &e };
	assert_int_equal(cap_lc_make_room(v, 3, &cfg), -1);	/* 3 of 4 */
	assert_int_equal(cap_lc_make_room(v, 5, &cfg), 1);	/* b: idle longest */
	b.queued = 1;
	assert_int_equal(cap_lc_make_room(v, 5, &cfg), 0);
	a.active = 1;
	d.state = CAP_VM_STARTING;
	assert_int_equal(cap_lc_make_room(v, 5, &cfg), -2);	/* all busy */
}

/* The warm pool's decision at an injected time. */
static void pool_fills_within_capacity(void **state)
{
	(void)state;
	struct cap_pool_in in = { .size = 2, .capacity = 4, .prepared = true };
	struct cap_pool_plan p = cap_pool_decide(&in, 1000);
	assert_false(p.prepare);
	assert_int_equal(p.restart, 0);
	assert_int_equal(p.create, 2);
	/* Three identities' VMs resident: room for one spare. */
	in.resident = 3;
	p = cap_pool_decide(&in, 1000);
	assert_int_equal(p.create, 1);
	/* Full: none. */
	in.resident = 4;
	p = cap_pool_decide(&in, 1000);
	assert_int_equal(p.create, 0);
	/* Both there, one of them stopped: started again, none made. */
	in = (struct cap_pool_in){ .size = 2, .members = 2, .stopped = 1, .resident = 1, .capacity = 4,
				   .prepared = true };
	p = cap_pool_decide(&in, 1000);
	assert_int_equal(p.restart, 1);
	assert_int_equal(p.create, 0);
	/* Restarts take the room first. */
	in = (struct cap_pool_in){ .size = 3, .members = 2, .stopped = 2, .resident = 2, .capacity = 4,
				   .prepared = true };
	p = cap_pool_decide(&in, 1000);
	assert_int_equal(p.restart, 2);
	assert_int_equal(p.create, 0);
	/* More members than wanted (a smaller pool after a restart): none
	 * made, none stopped. */
	in = (struct cap_pool_in){ .size = 1, .members = 3, .resident = 3, .capacity = 4, .prepared = true };
	p = cap_pool_decide(&in, 1000);
	assert_int_equal(p.restart, 0);
	assert_int_equal(p.create, 0);
}

static void pool_waits_for_retry_preparation_and_shutdown(void **state)
{
	(void)state;
	struct cap_pool_in in = { .size = 2, .capacity = 4, .retry_at = 31000 };
	struct cap_pool_plan p = cap_pool_decide(&in, 30999);
	assert_false(p.prepare);	/* a failure waits its time */
	p = cap_pool_decide(&in, 31000);
	assert_true(p.prepare);	/* then the preparation first */
	assert_int_equal(p.create, 0);
	in.preparing = true;
	p = cap_pool_decide(&in, 31000);
	assert_false(p.prepare);	/* one runs already */
	assert_int_equal(p.create, 0);
	in.preparing = false;
	in.prepared = true;
	in.shutting_down = true;
	p = cap_pool_decide(&in, 31000);
	assert_int_equal(p.create, 0);
	in.shutting_down = false;
	in.size = 0;	/* off */
	p = cap_pool_decide(&in, 31000);
	assert_false(p.prepare);
	assert_int_equal(p.create, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(defaults_are_the_contract, setup),
		cmocka_unit_test_setup(running_pauses_then_stops, setup),
		cmocka_unit_test_setup(work_prevents_transitions, setup),
		cmocka_unit_test_setup(other_states_do_nothing, setup),
		cmocka_unit_test_setup(room_evicts_the_oldest_idle, setup),
		cmocka_unit_test_setup(pool_fills_within_capacity, setup),
		cmocka_unit_test_setup(pool_waits_for_retry_preparation_and_shutdown, setup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
