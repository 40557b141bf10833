/* The monitor processes of OCI containers (docs/oci.md). Being written. */
#include "oci.h"
