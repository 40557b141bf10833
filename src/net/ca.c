/* being written: see the header */
#include "policy.h"
