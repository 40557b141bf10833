/* policy: see policy.h (being written). */
#include "policy.h"
