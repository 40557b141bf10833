/* Network namespace and nftables of a jailed VM (engine.h, struct cap_vm_net). */
#include "engine.h"
