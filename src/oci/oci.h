/* capsule as an OCI runtime (docs/oci.md): a runc-compatible command line
 * (`capsule oci`, or the capsule-oci link) that Podman (through conmon)
 * and containerd (through its runc v2 shim) drive. One container is one
 * named sandbox (oci-<hash of root and id>) whose root image is the
 * bundle's rootfs, plus a host monitor process per container process:
 * the pid runc would write to --pid-file.
 *
 * This is a front end: it reads config.json (JSON stays here), prints,
 * and chooses exit codes; the sandbox, store and engine layers do the
 * rest. Files:
 *   oci-config.c   config.json / process.json into the structs below
 *   oci-main.c     the command line, runc's global flags, the verb table
 *   oci-<verb>.c   one verb each (create, start, state, kill, delete,
 *                  pause and resume, exec, ps, list, features)
 *   oci-common.c   what the verbs share: the state directory, options
 *   oci-error.c    errors and --log
 *   oci-monitor.c  the monitor processes (create's init, exec --detach)
 *   oci-cgroup.c   cgroupsPath: made, limited, joined, removed */
#ifndef CAP_OCI_H
#define CAP_OCI_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "proto.h"

#define CAP_OCI_VERSION "1.0.2"	/* the runtime-spec version we speak */

/* The OCI runtime's command line (oci-main.c), `capsule oci`: argv[0] is
 * "oci" or the capsule-oci link's name, runc's global flags and verb
 * follow. Returns the exit code. */
int cap_cli_oci(int argc, char **argv);

/* The guest's RAM is linux.resources.memory.limit less this much, which
 * the monitor, the shim and QEMU's own memory (TCG translation cache,
 * heap) take in the same cgroup; a limit that leaves less than
 * CAP_MEMORY_MIN_MIB (named.h) is refused, naming the value. */
#define CAP_OCI_MEMORY_RESERVE_MIB 96
/* The VM without a memory limit. */
#define CAP_OCI_MEMORY_DEFAULT_MIB 512
/* A bind-mounted file copied into the root at create: at most this big. */
#define CAP_OCI_FILE_MAX (1u << 20)
#define CAP_OCI_MAX_GROUPS CAP_EXEC_MAX_GROUPS
#define CAP_OCI_MAX_RLIMITS CAP_EXEC_MAX_RLIMITS

/* A process: config.json's "process", or exec's --process file, or
 * exec's command line. Strings owned (cap_oci_process_fini). */
struct cap_oci_process {
	char **args;	/* NULL-terminated, nargs >= 1 */
	size_t nargs;
	char **env;	/* "NAME=value", NULL-terminated */
	size_t nenv;
	char *cwd;	/* absolute */
	uint32_t uid, gid;
	uint32_t groups[CAP_OCI_MAX_GROUPS];	/* additionalGids */
	uint32_t ngroups;
	uint32_t umask;	/* 0022 when not given */
	bool terminal;
	uint16_t rows, cols;	/* consoleSize, 0 when not given */
	struct cap_exec_rlimit rlimits[CAP_OCI_MAX_RLIMITS];
	uint32_t nrlimits;
};
void cap_oci_process_fini(struct cap_oci_process *p);

/* A bind mount of a regular file (at most CAP_OCI_FILE_MAX bytes),
 * copied into the root's upper layer at create: /etc/hosts,
 * /etc/resolv.conf, /etc/hostname, /run/.containerenv... */
struct cap_oci_file {
	char *dest;	/* absolute path in the container */
	char *source;	/* absolute host path */
};

struct cap_oci_config {
	char *bundle;	/* absolute, the directory holding config.json */
	char *rootfs;	/* absolute: root.path resolved against the bundle */
	bool root_readonly;
	struct cap_oci_process process;
	char *hostname;	/* NULL when not given */
	/* annotations, in the file's order */
	char **ann_keys, **ann_values;
	size_t nann;
	/* linux.resources */
	uint64_t memory_limit;	/* bytes; 0: none */
	unsigned memory_mib;	/* the guest's RAM derived from it */
	unsigned cpus;	/* vCPUs: ceil(quota / period), else cpuset's count, else 1 */
	int64_t cpu_quota;	/* 0: none */
	uint64_t cpu_period, cpu_shares;	/* 0: none */
	int64_t pids_limit;	/* 0: none */
	/* linux.cgroupsPath as given ("" when none); with --systemd-cgroup
	 * "slice:prefix:name" is turned into slice/prefix-name.scope. */
	char *cgroups_path;
	/* mounts */
	struct cap_oci_file *files;
	size_t nfiles;
	char **guest_mounts;	/* destinations the guest provides (proc, sysfs,
				 * tmpfs, devpts, mqueue, cgroup, /dev/shm bind),
				 * left out of the root image */
	size_t nguest_mounts;
	/* The tmpfs mounts the agent makes (also in guest_mounts): those not
	 * at the guest's own /dev, /dev/shm, /tmp, /run or under /dev, /proc,
	 * /sys, in the file's order. Options nosuid, nodev, noexec, ro and
	 * noatime become flags (suid, dev, exec, rw and atime clear them);
	 * mode=, size=, nr_inodes=, uid= and gid= the mount data; the rest
	 * (Podman's tmpcopyup, rprivate, strictatime...) is dropped: the
	 * image's content there is not copied in. */
	struct cap_setup_tmpfs tmpfs[CAP_SETUP_MAX_TMPFS];
	uint32_t ntmpfs;
	/* linux.namespaces "network": a path to join (checked to hold
	 * nothing but loopback) or NULL for a new empty one. For a pod's
	 * sandbox container (annotation CAP_OCI_ANN_CONTAINER_TYPE
	 * "sandbox"), the pod's namespace, checked to hold one veth with
	 * one IPv4 address (pod_network: the VM's NIC is carried from it);
	 * for a pod's other containers ("container"), the pod's, unchecked
	 * (their network is the sandbox's VM's). */
	char *netns_path;
	bool pod_network;
};
/* CRI's annotation naming a container's role in its pod. */
#define CAP_OCI_ANN_CONTAINER_TYPE "io.kubernetes.cri.container-type"
void cap_oci_config_fini(struct cap_oci_config *c);

/* Whether a config (jansson's json_t) is a container of a pod
 * (io.kubernetes.cri.container-type "container", oci-pod.c): its VM is
 * its pod's, so the checks of a VM's size, its network namespace (the
 * pod's) and its mounts (oci-pod.c reads those) are not made here. */
struct json_t;
bool cap_oci_pod_member_json(struct json_t *config);

/* Read BUNDLE/config.json and check everything this runtime cannot honour,
 * each refusal naming the field, the value and what to do: a bind mount of
 * a directory (file sharing is not designed yet), a network namespace
 * absent (the host's network: for a pod, "hostNetwork pods are not
 * supported") or holding an interface other than lo (a pod's sandbox:
 * anything but one veth with one IPv4 address),
 * a memory limit that leaves the guest less than CAP_MEMORY_MIN_MIB, more
 * vCPUs than the host has, a hostname the guest cannot take (1 to 20 of
 * [A-Za-z0-9._-]), a process without args, more than CAP_SETUP_MAX_TMPFS
 * tmpfs mounts for the agent or one at /, /work, /source or /workspace
 * (capsule's own) or whose path or options exceed 255 bytes. systemd_cgroup: the
 * cgroupsPath is in systemd's "slice:prefix:name" form. -EINVAL (or
 * -errno for a file) with err set. */
int cap_oci_config_load(const char *bundle, bool systemd_cgroup,
			struct cap_oci_config *out, struct cap_err *err);

/* Read a process.json (exec --process). */
int cap_oci_process_load(const char *path, struct cap_oci_process *out,
			 struct cap_err *err);
/* Read only the process of BUNDLE/config.json (exec's defaults), without
 * the checks of the rest of the config. */
int cap_oci_config_process(const char *bundle, struct cap_oci_process *out,
			   struct cap_err *err);

/* Parse a signal as runc does: "9", "KILL", "SIGKILL", "sigkill".
 * Returns the number or -EINVAL with err naming the value. */
int cap_oci_signal_parse(const char *s, struct cap_err *err);

/* ---- cgroupsPath (oci-cgroup.c) ---------------------------------------
 * Under cgroup v1, the path in every hierarchy capsule limits or reports
 * through (memory, pids, cpu, cpuacct, blkio, freezer); under v2, the
 * path once. The monitor and the shim live in its leaf "capsule" (v2
 * allows no process in a cgroup with children); the jail puts each VM's
 * QEMU in <path>/vm-N (CAPSULE_CGROUP_PARENT), so the caller's limits and
 * accounting cover all of it. */
/* A container's cgroup in one hierarchy, as its state records it. Only
 * what create made, or found empty and used, is ever touched again. */
struct cap_oci_cgroup {
	char *dir;	/* <hierarchy>/<cgroupsPath>, owned */
	/* The topmost level of dir create makes (dir or an ancestor), NULL
	 * when dir was there already (empty: it is used, never removed).
	 * Owned. */
	char *made;
	uint64_t ino;	/* dir's inode once found or made; 0 before */
	uint64_t made_ino;	/* made's inode once made; 0 before */
};
#define CAP_OCI_CGROUP_MAX 6	/* v1: memory, pids, cpu, cpuacct, blkio, freezer */
struct cap_oci_cgroups {
	struct cap_oci_cgroup h[CAP_OCI_CGROUP_MAX];
	size_t n;	/* 0: no cgroupsPath */
};
void cap_oci_cgroups_fini(struct cap_oci_cgroups *cg);

/* What create will do with cgroups_path in each hierarchy, before it
 * makes anything (the state records it first, so that a create that dies
 * half-way leaves what delete can find). A path that exists and holds a
 * process (in it or below it) or is frozen is refused with -EBUSY, naming
 * the cgroup and the pids, as runc refuses it: capsule-oci never limits,
 * signals or removes what it did not start. An existing empty one is
 * used. out is filled on success (n = 0 without a path). */
int cap_oci_cgroup_plan(const char *cgroups_path, struct cap_oci_cgroups *out,
			struct cap_err *err);
/* Make the planned folders (the first missing level with mkdir itself:
 * one made by someone else since the plan is refused), record their
 * inodes in cg, and write the limits of c (memory, pids, cpu shares and
 * quota). cg is updated also on failure, for the cleanup. */
int cap_oci_cgroup_create(const struct cap_oci_config *c, struct cap_oci_cgroups *cg,
			  struct cap_err *err);
/* Move the calling process into the path's leaf. */
int cap_oci_cgroup_join(const char *cgroups_path, struct cap_err *err);
/* End the container's cgroups: SIGKILL the processes of its leaf and of
 * the jail's vm-N folders (where all of the container's processes live;
 * nothing else), then remove the folders create made (the levels above
 * the path only while empty) or, in a path that create found, only the
 * leaf and vm-N folders. A folder whose inode is not the recorded one is
 * not touched. 0 when done (also when nothing was recorded); -EBUSY when
 * processes are left in a folder to remove, which stays. */
int cap_oci_cgroup_remove(const struct cap_oci_cgroups *cg, struct cap_err *err);

#endif
