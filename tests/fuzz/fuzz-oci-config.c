/* Fuzz target for capsule-oci's config.json and process.json reader
 * (src/oci/oci-config.c): the input is the file an engine (Podman,
 * containerd) or its user wrote, put in a bundle directory that has a
 * rootfs/, and read by cap_oci_config_load and cap_oci_process_load.
 * Checked for a config accepted: the bundle and root are absolute; the
 * process has its args (NULL-terminated, nargs of them), an absolute
 * cwd, env entries NAME=value; at most the bounds of groups, rlimits and
 * tmpfs mounts, each tmpfs one the guest protocol's decoder takes and
 * none at /, /work, /source or /workspace; a hostname of 1 to 20 of
 * [A-Za-z0-9._-]; at least one vCPU; annotations and bind files paired.
 * A refusal says why. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "fuzz.h"
#include "oci.h"
#include "proto.h"
#include "util.h"

static char *bundle, *file;

static void make_bundle(void)
{
	const char *tmp = getenv("TMPDIR");
	char *dir = xasprintf("%s/fuzz-oci.XXXXXX", tmp && *tmp ? tmp : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	FUZZ_CHECK(mkdtemp(dir), "mkdtemp %s", dir);
	bundle = dir;
	char *root = xasprintf("%s/rootfs", bundle);
	FUZZ_CHECK(mkdir(root, 0755) == 0, "mkdir %s", root);
	free(root);
	file = xasprintf("%s/config.json", bundle);
}

static void remove_bundle(void)
{
	char *root = xasprintf("%s/rootfs", bundle);
	unlink(file);
	rmdir(root);
	rmdir(bundle);
	free(root);
}

static void check_process(const struct cap_oci_process *p)
{
	FUZZ_CHECK(p->nargs >= 1 && p->args && p->args[p->nargs] == NULL, "%zu args", p->nargs);
	for (size_t i = 0; i < p->nargs; i++)
		FUZZ_CHECK(p->args[i], "arg %zu missing", i);
	FUZZ_CHECK(p->cwd && p->cwd[0] == '/', "cwd %s", p->cwd ? p->cwd : "(none)");
	FUZZ_CHECK(!p->nenv || (p->env && p->env[p->nenv] == NULL), "%zu env", p->nenv);
	for (size_t i = 0; i < p->nenv; i++)
		FUZZ_CHECK(p->env[i] && strchr(p->env[i], '='), "env %zu: %s", i, p->env[i] ? p->env[i] : "(null)");
	FUZZ_CHECK(p->ngroups <= CAP_OCI_MAX_GROUPS && p->nrlimits <= CAP_OCI_MAX_RLIMITS, "%u groups, %u rlimits",
		   p->ngroups, p->nrlimits);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!bundle)
		make_bundle();
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FUZZ_CHECK(fd >= 0 && cap_write_all(fd, data, size) == 0, "cannot write %s", file);
	close(fd);

	struct cap_oci_config c;
	struct cap_err err = { 0 };
	int r = cap_oci_config_load(bundle, size && data[0] == '{' && size % 2, &c, &err);
	if (r < 0) {
		FUZZ_CHECK(err.msg[0], "refused (%d) without a message", r);
	} else {
		FUZZ_CHECK(c.bundle && c.bundle[0] == '/' && c.rootfs && c.rootfs[0] == '/', "bundle or root not absolute");
		check_process(&c.process);
		if (c.hostname) {
			size_t n = strlen(c.hostname);
			FUZZ_CHECK(n >= 1 && n <= 20 && strspn(c.hostname, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n,
				   "hostname %s", c.hostname);
		}
		FUZZ_CHECK(c.cpus >= 1, "%u vCPUs", c.cpus);
		FUZZ_CHECK(c.ntmpfs <= CAP_SETUP_MAX_TMPFS, "%u tmpfs", c.ntmpfs);
		for (uint32_t i = 0; i < c.ntmpfs; i++) {
			const struct cap_setup_tmpfs *t = &c.tmpfs[i];
			FUZZ_CHECK(cap_proto_setup_tmpfs_ok(t), "tmpfs %u (%.255s) not one the guest takes", i, t->destination);
			static const char *const own[] = { "/", "/work", "/source", "/workspace" };
			for (size_t k = 0; k < CAP_ARRAY_SIZE(own); k++)
				FUZZ_CHECK(strcmp(t->destination, own[k]) != 0, "a tmpfs at %s", own[k]);
		}
		for (size_t i = 0; i < c.nann; i++)
			FUZZ_CHECK(c.ann_keys[i] && c.ann_values[i], "annotation %zu", i);
		for (size_t i = 0; i < c.nfiles; i++)
			FUZZ_CHECK(c.files[i].dest && c.files[i].dest[0] == '/' && c.files[i].source && c.files[i].source[0] == '/',
				   "bind file %zu", i);
		FUZZ_CHECK(c.cgroups_path, "no cgroupsPath string");
		cap_oci_config_fini(&c);
	}

	struct cap_oci_process p;
	memset(&err, 0, sizeof(err));
	if (cap_oci_process_load(file, &p, &err) == 0) {
		check_process(&p);
		cap_oci_process_fini(&p);
	} else {
		FUZZ_CHECK(err.msg[0], "a process refused without a message");
	}
	return 0;
}

/* The bundle goes with the process (libFuzzer exits through exit()). */
__attribute__((destructor)) static void at_end(void)
{
	if (bundle)
		remove_bundle();
}
