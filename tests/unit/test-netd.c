/* Unit tests of the policy process's parsers: DNS messages, TLS
 * ClientHello SNI, HTTP request heads (being written). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "policy.h"

static void test_placeholder(void **state)
{
	(void)state;
	assert_true(1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_placeholder),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
