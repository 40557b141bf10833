/* An OCI container's cgroupsPath (docs/oci.md). Being written. */
#include "oci.h"
