/* netd: see netd.h (being written). */
#include "policy.h"
