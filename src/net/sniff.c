/* sniff: see sniff.h (being written). */
#include "policy.h"
