/* capsule-oci create: the bundle's rootfs becomes an image and a named
 * sandbox, with the bind-mounted files seeded into its upper layer, and
 * a monitor, held at its gate until start, stands for the process. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "named.h"
#include "oci-int.h"
#include "paths.h"
#include "store.h"
#include "util.h"

struct create_opts {
	const char *bundle, *pid_file, *console_socket;
};

static int create_opt(void *ud, int c, const char *arg)
{
	struct create_opts *o = ud;
	switch (c) {
	case 'b': case CAP_OCI_OPT_BUNDLE: o->bundle = arg; return 0;
	case CAP_OCI_OPT_PID_FILE: o->pid_file = arg; return 0;
	case CAP_OCI_OPT_CONSOLE: o->console_socket = arg; return 0;
	case CAP_OCI_OPT_PRESERVE: return cap_oci_preserve_ok(arg);
	default: return 0;	/* --no-pivot, --no-new-keyring, --detach: nothing to do in a VM */
	}
}

/* mkdir -p of dest's parents below seed, each with the mode and owner
 * of the same directory in the rootfs (else root's 0755), so that the
 * seeded upper layer does not change them. */
static int seed_parents(const char *seed, const char *rootfs, const char *dest, struct cap_err *err)
{
	char rel[PATH_MAX];
	snprintf(rel, sizeof(rel), "%s", dest);
	for (char *p = strchr(rel + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		_cleanup_free_ char *in = xasprintf("%s%s", seed, rel);
		_cleanup_free_ char *src = xasprintf("%s%s", rootfs, rel);
		struct stat st;
		mode_t mode = 0755;
		uid_t uid = 0;
		gid_t gid = 0;
		if (lstat(src, &st) == 0 && S_ISDIR(st.st_mode)) {
			mode = st.st_mode & 07777;
			uid = st.st_uid;
			gid = st.st_gid;
		}
		if (mkdir(in, mode) == 0) {
			if (chown(in, uid, gid) < 0 || chmod(in, mode) < 0)
				return cap_err_set(err, errno, "%s: %s", in, strerror(errno));
		} else if (errno != EEXIST) {
			return cap_err_set(err, errno, "mkdir %s: %s", in, strerror(errno));
		}
		*p = '/';
	}
	return 0;
}

/* A read-only root's working directory, when the rootfs lacks it: made
 * in the seed (root's, 0755), as runc makes it before the root turns
 * read-only; the agent could not make it at EXEC any more. Not when a
 * component that exists in the rootfs is a symbolic link or not a
 * directory (a directory above it would hide it): EXEC then says so. */
static int seed_cwd(const char *seed, const char *rootfs, const char *cwd, struct cap_err *err)
{
	char rel[PATH_MAX];
	if (snprintf(rel, sizeof(rel), "%s/", cwd) >= (int)sizeof(rel) || strcmp(rel, "//") == 0 ||
	    strstr(rel, "/./") || strstr(rel, "/../"))
		return 0;	/* never outside the seed: the guest resolves it */
	rel[strlen(rel) - 1] = '\0';
	char *end = rel + strlen(rel);
	for (char *p = rel + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		_cleanup_free_ char *src = xasprintf("%s%s", rootfs, rel);
		struct stat st;
		if (lstat(src, &st) < 0) {
			if (errno != ENOENT)
				return cap_err_set(err, errno, "working directory %s: %s: %s", cwd, src, strerror(errno));
			*p = c;
			break;	/* missing from here on */
		}
		*p = c;
		if (!S_ISDIR(st.st_mode))
			return 0;
		if (p == end)
			return 0;	/* the image has it */
	}
	int r = seed_parents(seed, rootfs, cwd, err);
	if (r < 0)
		return r;
	_cleanup_free_ char *in = xasprintf("%s%s", seed, cwd);
	if (mkdir(in, 0755) < 0 && errno != EEXIST)
		return cap_err_set(err, errno, "mkdir %s: %s", in, strerror(errno));
	if (chown(in, 0, 0) < 0 || chmod(in, 0755) < 0)
		return cap_err_set(err, errno, "%s: %s", in, strerror(errno));
	return 0;
}

/* The bind-mounted files, copied into a seed tree for the root's upper
 * layer: their content and mode, owned by root; with a read-only root,
 * the working directory the rootfs lacks. */
static int make_seed(const struct cap_oci_config *cfg, const char *seed, struct cap_err *err)
{
	if (mkdir(seed, 0755) < 0)
		return cap_err_set(err, errno, "mkdir %s: %s", seed, strerror(errno));
	int r;
	if (cfg->root_readonly && cfg->process.cwd &&
	    (r = seed_cwd(seed, cfg->rootfs, cfg->process.cwd, err)) < 0)
		return r;
	for (size_t i = 0; i < cfg->nfiles; i++) {
		const struct cap_oci_file *f = &cfg->files[i];
		struct stat st;
		_cleanup_free_ char *data = NULL;
		if (stat(f->source, &st) < 0)
			return cap_err_set(err, errno, "mount source %s (for %s): %s", f->source, f->dest, strerror(errno));
		ssize_t n = cap_read_file(f->source, CAP_OCI_FILE_MAX, &data);
		if (n < 0)
			return cap_err_set(err, (int)-n, "mount source %s (for %s): %s", f->source, f->dest,
					   n == -EFBIG ? "over 1 MiB: only small files are copied in" : strerror((int)-n));
		r = seed_parents(seed, cfg->rootfs, f->dest, err);
		if (r < 0)
			return r;
		_cleanup_free_ char *to = xasprintf("%s%s", seed, f->dest);
		int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return cap_err_set(err, errno, "%s: %s", to, strerror(errno));
		r = cap_write_all(fd, data, (size_t)n);
		if (r == 0 && (fchown(fd, 0, 0) < 0 || fchmod(fd, st.st_mode & 07777) < 0))
			r = -errno;
		close(fd);
		if (r < 0)
			return cap_err_set(err, -r, "%s: %s", to, strerror(-r));
	}
	return 0;
}

/* The cgroups of a container as its state.json records them ("cgroups":
 * [{"dir", "ino", "made", "madeIno"}], inodes as decimal strings). */
static json_t *cgroups_json(const struct cap_oci_cgroups *cg)
{
	json_t *a = json_array();
	for (size_t i = 0; i < cg->n; i++) {
		char ino[24], made_ino[24];
		snprintf(ino, sizeof(ino), "%" PRIu64, cg->h[i].ino);
		snprintf(made_ino, sizeof(made_ino), "%" PRIu64, cg->h[i].made_ino);
		json_array_append_new(a, json_pack("{s:s,s:s,s:s,s:s}", "dir", cg->h[i].dir, "ino", ino,
						   "made", cg->h[i].made ? cg->h[i].made : "", "madeIno", made_ino));
	}
	return a;
}

static const char create_usage[] =
	"Usage: capsule-oci create [--bundle DIR] [--pid-file FILE] [--console-socket SOCK] ID\n"
	"\nCreate the container ID from the bundle DIR (default .): its rootfs becomes a\n"
	"sandbox's root image and a monitor process, held until `start`, stands for its\n"
	"process (its pid goes to --pid-file).\n";

int cap_oci_cmd_create(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "bundle", required_argument, NULL, 'b' },
		{ "pid-file", required_argument, NULL, CAP_OCI_OPT_PID_FILE },
		{ "console-socket", required_argument, NULL, CAP_OCI_OPT_CONSOLE },
		{ "no-pivot", no_argument, NULL, CAP_OCI_OPT_NO_PIVOT },
		{ "no-new-keyring", no_argument, NULL, CAP_OCI_OPT_NO_KEYRING },
		{ "preserve-fds", required_argument, NULL, CAP_OCI_OPT_PRESERVE },
		{ "detach", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct create_opts o = { .bundle = "." };
	int r = cap_oci_parse(argc, argv, "+b:dh", opts, create_usage, create_opt, &o);
	if (r >= 0)
		return r;
	if (optind != argc - 1) {
		cap_oci_error("create needs exactly one container id");
		return 1;
	}
	const char *id = argv[optind];
	struct cap_err err = { 0 };
	if (!cap_oci_id_ok(id)) {
		cap_oci_error("invalid container id '%s': use letters, digits, '_', '+', '-' and '.'", id);
		return 1;
	}
	char bundle[PATH_MAX];
	if (!realpath(o.bundle, bundle)) {
		cap_oci_error("bundle %s: %s", o.bundle, strerror(errno));
		return 1;
	}
	struct cap_oci_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	if (cap_oci_config_load(bundle, cap_oci_flags.systemd_cgroup, &cfg, &err) < 0)
		return cap_oci_fail(&err);
	struct cap_oci_pod pod;
	if (cap_oci_pod_load(bundle, id, &pod, &err) < 0) {
		cap_oci_config_fini(&cfg);
		return cap_oci_fail(&err);
	}
	bool member = pod.role == CAP_OCI_POD_CONTAINER;
	int rc = 1;
	bool made_dir = false;
	char name[CAP_NAME_MAX + 1];
	struct cap_image img;
	memset(&img, 0, sizeof(img));
	_cleanup_free_ char *dir = cap_oci_dir(id);
	_cleanup_free_ char *seed = xasprintf("%s/seed", dir);
	_cleanup_free_ char *home = NULL;
	char home_real[PATH_MAX];
	const char **skip = NULL;
	json_t *st = NULL;
	struct cap_oci_cgroups cg = { 0 };

	if ((r = cap_mkdir_p(cap_oci_flags.root, 0711)) < 0) {
		cap_err_set(&err, -r, "--root %s: %s", cap_oci_flags.root, strerror(-r));
		goto out;
	}
	if (mkdir(dir, 0711) < 0) {
		if (errno == EEXIST)
			cap_err_set(&err, EEXIST, "container with id exists: %s", id);
		else
			cap_err_set(&err, errno, "mkdir %s: %s", dir, strerror(errno));
		goto out;
	}
	made_dir = true;
	cap_oci_sandbox_name(id, name);
	if (member) {
		/* Its VM is its pod's: the sandbox container's, in this root. */
		struct cap_oci_state sst;
		struct cap_err e2 = { 0 };
		const char *pod_shown = pod.pod[0] ? pod.pod : "(unnamed)";
		if (cap_oci_state_load(pod.sandbox_id, &sst, &e2) < 0) {
			cap_err_set(&err, ENOENT, "the pod %s's sandbox container %s does not exist in %s: create the pod's sandbox (pause) container first",
				    pod_shown, pod.sandbox_id, cap_oci_flags.root);
			name[0] = '\0';
			goto out;
		}
		bool up = strcmp(sst.status, "running") == 0 || strcmp(sst.status, "created") == 0;
		if (!up)
			cap_err_set(&err, ESRCH, "the pod %s's sandbox container %s is %s: its VM is gone; a container cannot join it",
				    pod_shown, pod.sandbox_id, sst.status);
		else if (strcmp(cap_oci_jstr(sst.j, "podRole"), "sandbox") != 0)
			cap_err_set(&err, EINVAL, "container %s, named as the pod %s's sandbox, is not a pod's sandbox container (its config lacks io.kubernetes.cri.container-type sandbox)",
				    pod.sandbox_id, pod_shown);
		snprintf(name, sizeof(name), "%s", sst.sandbox);
		cap_oci_state_fini(&sst);
		if (err.code) {
			name[0] = '\0';
			goto out;
		}
	}
	/* The cgroups it will make or take, or a refusal of a cgroup that
	 * holds someone else's processes, before anything is made. */
	if (cap_oci_cgroup_plan(cfg.cgroups_path, &cg, &err) < 0)
		goto out;

	/* state.json before anything is made, naming what will be (the
	 * sandbox, the cgroup) and who makes it: a create that dies half-way
	 * leaves a container that state and list call stopped and delete
	 * removes whole. */
	char created[64], cstart[32];
	cap_oci_rfc3339(created, sizeof(created), true);
	snprintf(cstart, sizeof(cstart), "%llu", cap_oci_proc_start(getpid()));
	home = cap_home_dir();
	st = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:I,s:s}", "ociVersion", CAP_OCI_VERSION,
		       "id", id, "bundle", bundle, "rootfs", cfg.rootfs, "created", created, "sandbox", name,
		       "capsuleHome", realpath(home, home_real) ? home_real : home,
		       "cgroupsPath", cfg.cgroups_path ? cfg.cgroups_path : "", "pid", (json_int_t)0,
		       "pidStart", "0", "creator", (json_int_t)getpid(), "creatorStart", cstart);
	json_t *ann = json_object();
	for (size_t i = 0; i < cfg.nann; i++)
		json_object_set_new(ann, cfg.ann_keys[i], json_string(cfg.ann_values[i]));
	json_object_set_new(st, "annotations", ann);
	json_object_set_new(st, "cgroups", cgroups_json(&cg));
	json_object_set_new(st, "podRole", json_string(member ? "container" : pod.role == CAP_OCI_POD_SANDBOX ? "sandbox" : ""));
	json_object_set_new(st, "ctrName", json_string(pod.ctr.name));
	if (member)
		json_object_set_new(st, "podSandboxId", json_string(pod.sandbox_id));
	if (cap_oci_state_write(dir, st, &err) < 0)
		goto out;
	if (member) {
		/* Into the pod's VM: its root and files, then its monitor. */
		if (cap_oci_pod_copy_in(name, &pod, cfg.rootfs, seed, &err) < 0)
			goto out;
		cap_remove_tree(seed);
		goto cgroups;
	}

	/* The rootfs as an image, without what the engine mounts over it. */
	size_t nskip = 0;
	skip = xcalloc(cfg.nfiles + cfg.nguest_mounts + 1, sizeof(*skip));
	for (size_t i = 0; i < cfg.nfiles; i++)
		skip[nskip++] = cfg.files[i].dest;
	for (size_t i = 0; i < cfg.nguest_mounts; i++)
		skip[nskip++] = cfg.guest_mounts[i];
	bool cached;
	if (cap_store_image_from_rootfs(cfg.rootfs, skip, nskip, NULL, NULL, &img, &cached, &err) < 0)
		goto out;
	if (make_seed(&cfg, seed, &err) < 0)
		goto out;

	struct cap_record rec;
	cap_record_init(&rec);
	snprintf(rec.name, sizeof(rec.name), "%s", name);
	snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", img.digest);
	rec.cpus = cfg.cpus ? cfg.cpus : rec.cpus;
	rec.memory_mib = cfg.memory_mib ? cfg.memory_mib : CAP_OCI_MEMORY_DEFAULT_MIB;
	/* The upper disk (sparse) takes the container's writes: room for a
	 * copy-up of the whole image and half as much again. */
	unsigned img_mib = (unsigned)((img.size + (1u << 20) - 1) >> 20);
	unsigned want = (img_mib + img_mib / 2 + 63) / 64 * 64;
	if (want > rec.root_size_mib)
		rec.root_size_mib = want;
	if (cfg.hostname)
		snprintf(rec.hostname, sizeof(rec.hostname), "%s", cfg.hostname);
	rec.root_readonly = cfg.root_readonly;
	memcpy(rec.tmpfs, cfg.tmpfs, cfg.ntmpfs * sizeof(cfg.tmpfs[0]));
	rec.ntmpfs = cfg.ntmpfs;
	rec.root_seed = seed;
	if (cfg.pod_network)
		snprintf(rec.pod_netns, sizeof(rec.pod_netns), "%s", cfg.netns_path);
	if ((r = cap_named_create(&rec, NULL, NULL, &err)) == -EEXIST) {
		/* Left by a create of the same id that died half-way (its state
		 * directory is gone, so nothing else knows it): replace it. */
		struct cap_err e2 = { 0 };
		memset(&err, 0, sizeof(err));
		if (cap_named_remove(name, true, &e2) == 0)
			r = cap_named_create(&rec, NULL, NULL, &err);
	}
	if (r < 0)
		goto out;
	cap_remove_tree(seed);
cgroups:
	r = cap_oci_cgroup_create(&cfg, &cg, &err);
	/* What it made, with the inodes that tell it from a folder made
	 * again by someone else, before any process joins it. */
	json_object_set_new(st, "cgroups", cgroups_json(&cg));
	if (r < 0 || (cg.n && cap_oci_state_write(dir, st, &err) < 0))
		goto out;

	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		cap_err_set(&err, errno, "pipe: %s", strerror(errno));
		goto out;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		cap_err_set(&err, errno, "fork: %s", strerror(errno));
		close(pipefd[0]);
		close(pipefd[1]);
		goto out;
	}
	if (pid == 0) {
		close(pipefd[0]);
		struct cap_oci_monitor m = {
			.dir = dir, .sandbox = name, .cgroups_path = cfg.cgroups_path, .proc = &cfg.process,
			.pids_max = cfg.pids_limit > 0 ? (uint32_t)CAP_MIN(cfg.pids_limit, 1 << 22) : CAP_OCI_PIDS_MAX_DEFAULT,
			.gate = true, .detached = true, .console_socket = o.console_socket, .ready_fd = pipefd[1],
			.ctr = &pod.ctr, .pod_member = member,
		};
		/* A plain container's (and a pod's sandbox's) process gets a
		 * named cgroup too, with its pids limit: what update and
		 * events --stats address. */
		if (!member && cfg.pids_limit > 0) {
			pod.ctr.limits.set = CAP_LIMIT_PIDS;
			pod.ctr.limits.pids_max = (uint64_t)cfg.pids_limit;
		}
		_exit(cap_oci_monitor_run(&m));
	}
	close(pipefd[1]);
	/* The monitor, for delete to end should we die before it is ready. */
	char startbuf[32];
	snprintf(startbuf, sizeof(startbuf), "%llu", cap_oci_proc_start(pid));
	json_object_set_new(st, "pid", json_integer(pid));
	json_object_set_new(st, "pidStart", json_string(startbuf));
	if (cap_oci_state_write(dir, st, &err) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	if (cap_oci_wait_ready(pipefd[0], pid, &err) < 0)
		goto out;
	json_object_del(st, "creator");
	json_object_del(st, "creatorStart");
	if (cap_oci_state_write(dir, st, &err) < 0 || (o.pid_file && cap_oci_write_pid_file(o.pid_file, pid, &err) < 0)) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	rc = 0;
out:
	if (rc) {
		cap_oci_error("%s", err.msg);
		if (made_dir) {
			struct cap_err e2 = { 0 };
			if (member && name[0])
				cap_oci_pod_remove(name, pod.ctr.name, &e2);
			cap_oci_destroy(dir, member ? NULL : name, &cg, &e2);
		}
	}
	cap_oci_cgroups_fini(&cg);
	cap_oci_pod_fini(&pod);
	json_decref(st);
	free(skip);
	cap_image_fini(&img);
	cap_oci_config_fini(&cfg);
	return rc;
}
