/* dns: see dns.h (being written). */
#include "policy.h"
