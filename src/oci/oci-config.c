/* config.json into struct cap_oci_config (docs/oci.md). Being written. */
#include "oci.h"
