/* capsule-oci features: what this runtime honours, as JSON. */
#include <jansson.h>

#include "oci-int.h"

int cap_oci_cmd_features(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	/* What this runtime honours, not what runc does: no hooks, no
	 * seccomp/AppArmor/SELinux on the host side (the VM is the
	 * boundary), mounts of the guest's kinds and small files only. */
	json_t *f = json_pack(
		"{s:s,s:s,s:[],s:[ssssssssssss],"
		"s:{s:[ssssss],s:[],s:{s:b,s:b,s:b,s:b},s:{s:b},s:{s:b},s:{s:b}},"
		"s:{s:s}}",
		"ociVersionMin", "1.0.0", "ociVersionMax", CAP_OCI_VERSION, "hooks", "mountOptions", "bind",
		"rbind", "ro", "rw", "nosuid", "nodev", "noexec", "relatime", "private", "rprivate", "mode",
		"size", "linux", "namespaces", "cgroup", "ipc", "mount", "network", "pid", "uts",
		"capabilities", "cgroup", "v1", true, "v2", true, "systemd", false, "systemdUser", false,
		"seccomp", "enabled", false, "apparmor", "enabled", false, "selinux", "enabled", false,
		"annotations", "io.capsule.runtime", "vm");
	return cap_oci_print_json(f, JSON_INDENT(4));
}
