/* The OCI runtime's library parts: config.json and process.json read
 * (and every refusal naming its field), signals parsed as runc does, a
 * cgroupsPath made, limited, joined and removed under the real cgroups,
 * and a bundle's rootfs made an image once and then found by its
 * fingerprint: by content for a plain tree, by layers for an overlay. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "named.h"
#include "oci.h"
#include "paths.h"
#include "store.h"
#include "util.h"

static char dir[] = "/tmp/capsule-oci-XXXXXX";

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	if (!mkdtemp(dir))
		return -1;
	char *home = xasprintf("%s/home", dir);
	setenv("CAPSULE_HOME", home, 1);
	free(home);
	char *b = xasprintf("%s/bundle", dir);
	char *r = xasprintf("%s/bundle/rootfs", dir);
	char *f = xasprintf("%s/hosts", dir);
	int k = mkdir(b, 0755) | mkdir(r, 0755);
	FILE *h = fopen(f, "w");
	if (h) {
		fputs("127.0.0.1 localhost\n", h);
		fclose(h);
	}
	free(b);
	free(r);
	free(f);
	return k || !h ? -1 : 0;
}

static int teardown(void **state)
{
	(void)state;
	/* An overlay test that failed half-way leaves its mounts. */
	char *m = xasprintf("%s/ovl/merged", dir);
	while (umount2(m, MNT_DETACH) == 0)
		;
	free(m);
	char *cmd = xasprintf("rm -rf '%s'", dir);
	int r = system(cmd);
	free(cmd);
	return r == 0 ? 0 : -1;
}

/* A config.json as Podman writes one (cut down). A new reference. */
static json_t *base_config(void)
{
	char *hosts = xasprintf("%s/hosts", dir);
	json_t *c = json_pack(
		"{s:s, s:{s:s, s:b}, s:{s:b, s:{s:i, s:i}, s:{s:i, s:i, s:[i, i], s:i}, s:[s, s], s:[s, s], s:s,"
		" s:[{s:s, s:f, s:f}, {s:s, s:i, s:i}]},"
		" s:s, s:{s:s, s:s, s:s},"
		" s:[{s:s, s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:s, s:s, s:[s, s]}, {s:s, s:s, s:s, s:[s]}],"
		" s:{s:s, s:[{s:s}, {s:s}, {s:s}], s:{s:{s:I}, s:{s:I, s:I, s:I}, s:{s:I}}}}",
		"ociVersion", "1.0.2",
		"root", "path", "rootfs", "readonly", 0,
		"process", "terminal", 1, "consoleSize", "height", 40, "width", 120,
		"user", "uid", 0, "gid", 0, "additionalGids", 10, 11, "umask", 077,
		"args", "sh", "-c", "env", "PATH=/usr/bin:/bin", "TERM=xterm", "cwd", "/srv",
		"rlimits", "type", "RLIMIT_NOFILE", "hard", 18446744073709551615.0, "soft", 1024.0,
		"type", "RLIMIT_NPROC", "hard", 4096, "soft", 4096,
		"hostname", "box-1",
		"annotations", "z.first", "1", "a.second", "2", "m.third", "3",
		"mounts",
		"destination", "/proc", "type", "proc", "source", "proc",
		"destination", "/dev", "type", "tmpfs", "source", "tmpfs",
		"destination", "/etc/hosts", "type", "bind", "source", hosts, "options", "rbind", "ro",
		"destination", "/dev/shm", "type", "bind", "source", dir, "options", "bind",
		"linux", "cgroupsPath", "/libpod_parent/libpod-abc",
		"namespaces", "type", "pid", "type", "mount", "type", "network",
		"resources", "memory", "limit", (json_int_t)300 << 20,
		"cpu", "quota", (json_int_t)50000, "period", (json_int_t)100000, "shares", (json_int_t)512,
		"pids", "limit", (json_int_t)200);
	free(hosts);
	CAP_BUG_ON(!c);
	return c;
}

static char *bundle(void) { return xasprintf("%s/bundle", dir); }

static void save(json_t *c)
{
	char *p = xasprintf("%s/bundle/config.json", dir);
	char *text = json_dumps(c, JSON_INDENT(1));
	/* RLIM_INFINITY as engines write it (jansson writes a real). */
	for (char *r; (r = strstr(text, "1.8446744073709552e+19"));)
		memcpy(r, "18446744073709551615  ", 22);
	write_text(p, text);
	free(text);
	free(p);
}

/* Load c (taken) as config.json: the result, err filled on failure. */
static int load(json_t *c, bool systemd, struct cap_oci_config *out, struct cap_err *err)
{
	save(c);
	json_decref(c);
	char *b = bundle();
	memset(err, 0, sizeof(*err));
	int r = cap_oci_config_load(b, systemd, out, err);
	free(b);
	return r;
}

/* json_object_get along a dotted path ("linux.resources.memory"). */
static json_t *at(json_t *c, const char *path)
{
	char *p = xstrdup(path), *save = NULL;
	for (char *k = strtok_r(p, ".", &save); k && c; k = strtok_r(NULL, ".", &save))
		c = json_object_get(c, k);
	free(p);
	CAP_BUG_ON(!c);
	return c;
}

static void config_read(void **state)
{
	(void)state;
	struct cap_oci_config c;
	struct cap_err err;
	int r = load(base_config(), false, &c, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	char *want = xasprintf("%s/bundle/rootfs", dir);
	assert_string_equal(c.rootfs, want);
	free(want);
	assert_false(c.root_readonly);
	assert_int_equal(c.process.nargs, 2);
	assert_string_equal(c.process.args[1], "-c");
	assert_null(c.process.args[2]);
	assert_int_equal(c.process.nenv, 2);
	assert_string_equal(c.process.env[1], "TERM=xterm");
	assert_string_equal(c.process.cwd, "/srv");
	assert_int_equal(c.process.uid, 0);
	assert_int_equal(c.process.ngroups, 2);
	assert_int_equal(c.process.groups[1], 11);
	assert_int_equal(c.process.umask, 077);
	assert_true(c.process.terminal);
	assert_int_equal(c.process.rows, 40);
	assert_int_equal(c.process.cols, 120);
	assert_int_equal(c.process.nrlimits, 2);
	assert_int_equal(c.process.rlimits[0].resource, RLIMIT_NOFILE);
	assert_true(c.process.rlimits[0].hard == UINT64_MAX);
	assert_int_equal(c.process.rlimits[0].soft, 1024);
	assert_int_equal(c.process.rlimits[1].resource, RLIMIT_NPROC);
	assert_string_equal(c.hostname, "box-1");
	assert_int_equal(c.nann, 3);
	assert_string_equal(c.ann_keys[0], "z.first");
	assert_string_equal(c.ann_keys[2], "m.third");
	assert_string_equal(c.ann_values[1], "2");
	assert_int_equal(c.memory_limit, 300u << 20);
	assert_int_equal(c.memory_mib, 300 - CAP_OCI_MEMORY_RESERVE_MIB);
	assert_int_equal(c.cpus, 1);
	assert_int_equal(c.cpu_quota, 50000);
	assert_int_equal(c.cpu_period, 100000);
	assert_int_equal(c.cpu_shares, 512);
	assert_int_equal(c.pids_limit, 200);
	assert_string_equal(c.cgroups_path, "/libpod_parent/libpod-abc");
	assert_int_equal(c.nfiles, 1);
	assert_string_equal(c.files[0].dest, "/etc/hosts");
	assert_int_equal(c.nguest_mounts, 3);
	assert_string_equal(c.guest_mounts[0], "/proc");
	assert_string_equal(c.guest_mounts[2], "/dev/shm");
	assert_int_equal(c.ntmpfs, 0);	/* /dev is the guest's */
	assert_null(c.netns_path);
	cap_oci_config_fini(&c);
	cap_oci_config_fini(&c);	/* idempotent */
	cap_oci_config_fini(NULL);

	/* No limits: the default VM; an absolute root.path (Podman's). */
	json_t *j = base_config();
	json_object_del(at(j, "linux.resources"), "cpu");
	json_object_set_new(at(j, "linux.resources.memory"), "limit", json_integer(INT64_MAX));
	json_object_del(at(j, "process"), "user");
	json_object_del(at(j, "process"), "cwd");
	char *abs = xasprintf("%s/bundle/rootfs", dir);
	json_object_set_new(at(j, "root"), "path", json_string(abs));
	free(abs);
	r = load(j, false, &c, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(c.memory_limit, 0);
	assert_int_equal(c.memory_mib, CAP_OCI_MEMORY_DEFAULT_MIB);
	assert_int_equal(c.cpus, 1);
	assert_int_equal(c.process.umask, 0022);
	assert_string_equal(c.process.cwd, "/");
	cap_oci_config_fini(&c);

	/* CPUs from a cpuset list. */
	j = base_config();
	json_object_del(at(j, "linux.resources.cpu"), "quota");
	json_object_set_new(at(j, "linux.resources.cpu"), "cpus", json_string("0"));
	r = load(j, false, &c, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(c.cpus, 1);
	cap_oci_config_fini(&c);
}

/* Set path's key in a base config to v (taken) and expect a refusal
 * whose message holds each of the NULL-terminated words. */
static void refused(const char *path, const char *key, json_t *v, ...)
{
	json_t *j = base_config();
	if (v)
		json_object_set_new(at(j, path), key, v);
	else
		json_object_del(at(j, path), key);
	struct cap_oci_config c;
	struct cap_err err;
	int r = load(j, false, &c, &err);
	va_list ap;
	va_start(ap, v);
	if (r == 0)
		fail_msg("%s.%s: accepted (expected \"%s\")", path, key, va_arg(ap, const char *));
	for (const char *w; (w = va_arg(ap, const char *));)
		if (!strstr(err.msg, w))
			fail_msg("%s.%s: \"%s\" lacks \"%s\"", path, key, err.msg, w);
	va_end(ap);
}

static void config_refusals(void **state)
{
	(void)state;
	refused("process", "args", json_array(), "process.args", NULL);
	refused("process", "cwd", json_string("srv"), "process.cwd", "\"srv\"", NULL);
	refused("process", "env", json_pack("[s]", "NOEQUALS"), "NOEQUALS", NULL);
	refused("process", "rlimits", json_pack("[{s:s, s:i, s:i}]", "type", "RLIMIT_BOGUS", "hard", 1, "soft", 1),
		"RLIMIT_BOGUS", NULL);
	refused("process.user", "additionalGids", json_pack("[i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i,i]",
							     1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
							     22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33),
		"additionalGids", "33", NULL);
	refused("", "hostname", json_string("a-hostname-much-too-long"), "hostname", "a-hostname-much-too-long", NULL);
	refused("", "hostname", json_string("bad host"), "\"bad host\"", NULL);
	refused("linux.resources.memory", "limit", json_integer(200 << 20), "209715200 bytes", "200 MiB",
		"96 MiB", "224 MiB", NULL);
	refused("linux.resources.memory", "limit", json_integer((json_int_t)1 << 40), "memory.limit",
		"1099511627776 bytes", "more than this host can give", NULL);
	refused("linux.resources.cpu", "quota", json_integer(64 * 100000), "6400000", "64 CPUs", NULL);
	json_t *j = base_config();
	json_object_del(at(j, "linux.resources.cpu"), "quota");
	json_object_set_new(at(j, "linux.resources.cpu"), "cpus", json_string("0-63"));
	struct cap_oci_config c;
	struct cap_err err;
	assert_int_equal(load(j, false, &c, &err), -ERANGE);
	assert_non_null(strstr(err.msg, "\"0-63\""));
	refused("linux", "cgroupsPath", json_string("/a/../b"), "\"/a/../b\"", NULL);
	refused("linux", "uidMappings", json_pack("[{s:i, s:i, s:i}]", "containerID", 0, "hostID", 1000, "size", 1),
		"user namespaces", NULL);
	refused("linux", "namespaces", json_pack("[{s:s}]", "type", "pid"), "no network namespace", "--network none", NULL);
	refused("root", "path", json_string("nowhere"), "root.path", "nowhere", NULL);
	refused("", "hooks", json_pack("{s:[], s:[{s:s}]}", "prestart", "poststart", "path", "/bin/true"),
		"hooks (poststart)", "remove them", NULL);
	/* Mounts: a directory bind, a type the guest does not give, a big file. */
	refused("", "mounts", json_pack("[{s:s, s:s, s:s, s:[s]}]", "destination", "/data", "type", "bind",
					"source", dir, "options", "rbind"),
		"bind mount", dir, "/data", "cannot share a host directory", "remove the volume", NULL);
	refused("", "mounts", json_pack("[{s:s, s:s, s:s}]", "destination", "/mnt", "type", "nfs", "source", "h:/x"),
		"\"nfs\"", "/mnt", NULL);
	char *big = xasprintf("%s/big", dir);
	int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0 && ftruncate(fd, CAP_OCI_FILE_MAX + 1) == 0);
	close(fd);
	refused("", "mounts", json_pack("[{s:s, s:s, s:s}]", "destination", "/big", "type", "bind", "source", big),
		"/big", big, "1048577", NULL);
	free(big);
	/* A missing config.json. */
	char *cfg = xasprintf("%s/bundle/config.json", dir);
	unlink(cfg);
	char *b = bundle();
	assert_int_equal(cap_oci_config_load(b, false, &c, &err), -ENOENT);
	assert_non_null(strstr(err.msg, cfg));
	assert_non_null(strstr(err.msg, "No such file or directory"));
	free(b);
	free(cfg);
}


/* tmpfs mounts: those at the guest's own places only left out of the
 * image, the others listed for the agent with their options turned into
 * flags and mount data (Podman's extra options dropped); too many, one at
 * capsule's own mount points or with a ',' in an option refused. */
static json_t *tmpfs_mount(const char *dest, const char *opts)
{
	json_t *m = json_pack("{s:s, s:s, s:s, s:[]}", "destination", dest, "type", "tmpfs",
			      "source", "tmpfs", "options");
	char *o = xstrdup(opts), *save = NULL;
	for (char *w = strtok_r(o, " ", &save); w; w = strtok_r(NULL, " ", &save))
		json_array_append_new(json_object_get(m, "options"), json_string(w));
	free(o);
	return m;
}

static void tmpfs_mounts(void **state)
{
	(void)state;
	json_t *j = base_config();
	json_t *ms = json_array();
	json_array_append_new(ms, tmpfs_mount("/dev", "nosuid strictatime mode=755 size=65536k"));
	json_array_append_new(ms, tmpfs_mount("/dev/shm", "nosuid noexec nodev"));
	json_array_append_new(ms, tmpfs_mount("//tmp/", "rw rprivate nosuid nodev tmpcopyup"));
	json_array_append_new(ms, tmpfs_mount("/run", "rw rprivate nosuid nodev tmpcopyup"));
	json_array_append_new(ms, tmpfs_mount("/sys/fs/cgroup", "ro"));
	json_array_append_new(ms, tmpfs_mount("/var/tmp", "rw rprivate nosuid nodev tmpcopyup"));
	json_array_append_new(ms, tmpfs_mount("/cache", "rw rprivate noexec nosuid nodev tmpcopyup size=65536k mode=1777"));
	json_array_append_new(ms, tmpfs_mount("deep/rel", "ro noatime uid=1000 gid=1000 nr_inodes=100 strictatime huge=always exec"));
	json_array_append_new(ms, tmpfs_mount("/run//lock/", "noexec exec nosuid suid rw"));
	json_object_set_new(j, "mounts", ms);
	struct cap_oci_config c;
	struct cap_err err;
	if (load(j, false, &c, &err) < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(c.nguest_mounts, 9);	/* all left out of the image */
	assert_int_equal(c.ntmpfs, 4);
	assert_string_equal(c.tmpfs[0].destination, "/var/tmp");
	assert_string_equal(c.tmpfs[0].data, "");
	assert_int_equal(c.tmpfs[0].flags, MS_NOSUID | MS_NODEV);
	assert_string_equal(c.tmpfs[1].destination, "/cache");
	assert_string_equal(c.tmpfs[1].data, "size=65536k,mode=1777");
	assert_int_equal(c.tmpfs[1].flags, MS_NOEXEC | MS_NOSUID | MS_NODEV);
	assert_string_equal(c.tmpfs[2].destination, "/deep/rel");
	assert_string_equal(c.tmpfs[2].data, "uid=1000,gid=1000,nr_inodes=100");
	assert_int_equal(c.tmpfs[2].flags, MS_RDONLY | MS_NOATIME);
	assert_string_equal(c.tmpfs[3].destination, "/run/lock");
	assert_int_equal(c.tmpfs[3].flags, 0);
	for (uint32_t i = 0; i < c.ntmpfs; i++)
		assert_true(cap_proto_setup_tmpfs_ok(&c.tmpfs[i]));
	cap_oci_config_fini(&c);

	/* 17 for the agent (the guest's own do not count). */
	ms = json_array();
	json_array_append_new(ms, tmpfs_mount("/tmp", "nosuid"));
	for (int i = 0; i < CAP_SETUP_MAX_TMPFS; i++) {
		char d[32];
		snprintf(d, sizeof(d), "/t%d", i);
		json_array_append_new(ms, tmpfs_mount(d, "nosuid"));
	}
	j = base_config();
	json_object_set_new(j, "mounts", json_deep_copy(ms));
	if (load(j, false, &c, &err) < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(c.ntmpfs, CAP_SETUP_MAX_TMPFS);
	cap_oci_config_fini(&c);
	json_array_append_new(ms, tmpfs_mount("/t16", ""));
	refused("", "mounts", ms, "17 tmpfs mounts", "at most 16", NULL);
	refused("", "mounts", json_pack("[o]", tmpfs_mount("/work/", "")), "/work:", "capsule's guest", NULL);
	refused("", "mounts", json_pack("[o]", tmpfs_mount("/", "")), "tmpfs at /", NULL);
	refused("", "mounts", json_pack("[o]", tmpfs_mount("/c", "size=1m,mode=1777")), "/c",
		"size=1m,mode=1777", "','", NULL);
	refused("", "mounts", json_pack("[o]", tmpfs_mount("/c", "rw,size=1m")), "/c", "rw,size=1m", "','", NULL);
	/* A file copied into the root below a tmpfs would be hidden by it. */
	{
		char *hf = xasprintf("%s/hosts", dir);
		refused("", "mounts", json_pack("[o, {s:s, s:s, s:s}]", tmpfs_mount("/app/cache", ""),
						"destination", "/app/cache/settings.json", "type", "bind", "source", hf),
			"/app/cache/settings.json", "inside the tmpfs at /app/cache", NULL);
		free(hf);
	}
	char opt[300] = "mode=";
	memset(opt + 5, '7', 251);
	opt[256] = '\0';
	refused("", "mounts", json_pack("[o]", tmpfs_mount("/c", opt)), "/c", "over 255 bytes", NULL);
	opt[255] = '\0';
	j = base_config();
	json_object_set_new(j, "mounts", json_pack("[o]", tmpfs_mount("/c", opt)));
	if (load(j, false, &c, &err) < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(strlen(c.tmpfs[0].data), 255);
	cap_oci_config_fini(&c);
}

static void network_namespaces(void **state)
{
	(void)state;
	/* This process's namespace holds the host's interfaces. */
	char *mine = xasprintf("/proc/%d/ns/net", (int)getpid());
	refused("linux", "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", mine),
		mine, "besides lo", "--network none", NULL);
	free(mine);
	refused("linux", "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", "/nonexistent/ns"),
		"/nonexistent/ns", NULL);
	/* What is not a network namespace is refused at once, named: a FIFO
	 * (whose open would wait for a writer for ever; the alarm ends the
	 * test then), a device, a namespace of another type. */
	char *fifo = xasprintf("%s/netns-fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	alarm(20);
	int64_t t0 = cap_now_ms();
	refused("linux", "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", fifo),
		fifo, "not a namespace file", NULL);
	alarm(0);
	assert_true(cap_now_ms() - t0 < 2000);
	unlink(fifo);
	free(fifo);
	refused("linux", "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", "/dev/null"),
		"/dev/null", "not a namespace file", NULL);
	refused("linux", "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", "/proc/self/ns/uts"),
		"/proc/self/ns/uts", "another type", NULL);
	/* An empty one (a child's new namespace, as podman --network none). */
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char c = unshare(CLONE_NEWNET) == 0 ? 'y' : 'n';
		(void)!write(p[1], &c, 1);
		pause();
		_exit(0);
	}
	char c = 0;
	assert_int_equal(read(p[0], &c, 1), 1);
	assert_int_equal(c, 'y');
	char *path = xasprintf("/proc/%d/ns/net", (int)pid);
	json_t *j = base_config();
	json_object_set_new(at(j, "linux"), "namespaces", json_pack("[{s:s, s:s}]", "type", "network", "path", path));
	struct cap_oci_config cfg;
	struct cap_err err;
	int r = load(j, false, &cfg, &err);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(p[0]);
	close(p[1]);
	if (r < 0)
		fail_msg("%s", err.msg);
	assert_string_equal(cfg.netns_path, path);
	cap_oci_config_fini(&cfg);
	free(path);
}

/* A pod's sandbox or container of CRI type t with namespaces ns (taken)
 * and, when um, user mappings: refused, the message holding each of the
 * NULL-ended words; or, with no word, accepted. */
static void pod_config(const char *t, json_t *ns, int um, ...)
{
	json_t *j = base_config();
	json_object_set_new(at(j, "annotations"), CAP_OCI_ANN_CONTAINER_TYPE, json_string(t));
	json_object_set_new(at(j, "annotations"), "io.kubernetes.cri.sandbox-id", json_string("sb1"));
	json_object_set_new(at(j, "linux"), "namespaces", ns);
	if (um)
		json_object_set_new(at(j, "linux"), "uidMappings",
				    json_pack("[{s:i, s:i, s:i}]", "containerID", 0, "hostID", 100000, "size", 65536));
	struct cap_oci_config c;
	struct cap_err err;
	int r = load(j, false, &c, &err);
	va_list ap;
	va_start(ap, um);
	const char *first = va_arg(ap, const char *);
	if (!first) {
		if (r < 0)
			fail_msg("%s pod config refused: %s", t, err.msg);
		cap_oci_config_fini(&c);
	} else if (r == 0) {
		fail_msg("%s pod config accepted (expected \"%s\")", t, first);
	} else {
		for (const char *w = first; w; w = va_arg(ap, const char *))
			if (!strstr(err.msg, w))
				fail_msg("%s pod config: \"%s\" lacks \"%s\"", t, err.msg, w);
	}
	va_end(ap);
}

/* hostPID and hostIPC pods (CRI leaves the namespace out) and user
 * mappings are refused, for the sandbox and for the pod's containers;
 * with all their namespaces, both load. */
static void pod_host_namespaces(void **state)
{
	(void)state;
	static const char *const types[] = { "sandbox", "container" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(types); i++) {
		const char *t = types[i];
		pod_config(t, json_pack("[{s:s}, {s:s}, {s:s}, {s:s}]", "type", "pid", "type", "ipc", "type", "uts",
					"type", "network"), 0, NULL);
		pod_config(t, json_pack("[{s:s}, {s:s}, {s:s}]", "type", "ipc", "type", "uts", "type", "network"), 0,
			   "hostPID pods are not supported", "no pid namespace", "without hostPID", NULL);
		pod_config(t, json_pack("[{s:s}, {s:s}, {s:s}]", "type", "pid", "type", "uts", "type", "network"), 0,
			   "hostIPC pods are not supported", "no ipc namespace", NULL);
		pod_config(t, json_pack("[{s:s}, {s:s}, {s:s}, {s:s}, {s:s}]", "type", "pid", "type", "ipc", "type", "uts",
					"type", "network", "type", "user"), 1, "uidMappings", "not supported", NULL);
	}
}

static void systemd_paths(void **state)
{
	(void)state;
	const struct {
		const char *in, *out;
	} cases[] = {
		{ "machine.slice:libpod:abc", "machine.slice/libpod-abc.scope" },
		{ "a-b-c.slice:cri:x1", "a.slice/a-b.slice/a-b-c.slice/cri-x1.scope" },
		{ ":runc:id", "system.slice/runc-id.scope" },
		{ "-.slice::id", "id.scope" },
		{ "", "" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cases); i++) {
		json_t *j = base_config();
		json_object_set_new(at(j, "linux"), "cgroupsPath", json_string(cases[i].in));
		struct cap_oci_config c;
		struct cap_err err;
		if (load(j, true, &c, &err) < 0)
			fail_msg("%s: %s", cases[i].in, err.msg);
		assert_string_equal(c.cgroups_path, cases[i].out);
		cap_oci_config_fini(&c);
	}
	const char *bad[] = { "/plain/path", "a.slice:p", "noslice:p:n", "a.slice:p:../x" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		json_t *j = base_config();
		json_object_set_new(at(j, "linux"), "cgroupsPath", json_string(bad[i]));
		struct cap_oci_config c;
		struct cap_err err;
		if (load(j, true, &c, &err) == 0)
			fail_msg("%s: accepted", bad[i]);
		assert_non_null(strstr(err.msg, bad[i]));
	}
}

static void process_file(void **state)
{
	(void)state;
	char *p = xasprintf("%s/process.json", dir);
	write_text(p, "{\"terminal\":false,\"user\":{\"uid\":1000,\"gid\":1000},\"args\":[\"ls\",\"-l\"],"
		      "\"env\":[\"A=1\"],\"cwd\":\"/tmp\",\"rlimits\":[{\"type\":\"RLIMIT_CORE\",\"hard\":0,\"soft\":0}]}");
	struct cap_oci_process proc;
	struct cap_err err;
	int r = cap_oci_process_load(p, &proc, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(proc.nargs, 2);
	assert_string_equal(proc.args[0], "ls");
	assert_int_equal(proc.uid, 1000);
	assert_string_equal(proc.cwd, "/tmp");
	assert_int_equal(proc.nrlimits, 1);
	assert_int_equal(proc.rlimits[0].resource, RLIMIT_CORE);
	cap_oci_process_fini(&proc);
	cap_oci_process_fini(&proc);
	write_text(p, "{\"args\":[\"ls\"],\"cwd\":\"relative\"}");
	assert_int_equal(cap_oci_process_load(p, &proc, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "process.cwd"));
	write_text(p, "{\"args\":[\"ls\"");
	assert_int_equal(cap_oci_process_load(p, &proc, &err), -EINVAL);
	assert_non_null(strstr(err.msg, p));
	free(p);
}

static void signals(void **state)
{
	(void)state;
	const struct {
		const char *s;
		int n;
	} ok[] = {
		{ "9", 9 }, { "KILL", SIGKILL }, { "SIGKILL", SIGKILL }, { "sigterm", SIGTERM },
		{ "term", SIGTERM }, { "USR1", SIGUSR1 }, { "SIGWINCH", SIGWINCH }, { "64", 64 },
		{ "SIGRTMIN+3", 37 }, { "RTMIN", 34 }, { "SIGRTMAX-1", 63 }, { "SIGIOT", SIGABRT },
	};
	struct cap_err err;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(ok); i++) {
		int r = cap_oci_signal_parse(ok[i].s, &err);
		if (r != ok[i].n)
			fail_msg("%s: %d, not %d", ok[i].s, r, ok[i].n);
	}
	const char *bad[] = { "0", "65", "SIGNOPE", "", "9x", "SIGRTMIN+40", "-9", "SIG" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		assert_int_equal(cap_oci_signal_parse(bad[i], &err), -EINVAL);
		char *q = xasprintf("\"%s\"", bad[i]);
		assert_non_null(strstr(err.msg, q));
		free(q);
	}
}

static char *slurp(const char *path)
{
	char *s = NULL;
	if (cap_read_file(path, 4096, &s) < 0) {
		free(s);
		return NULL;
	}
	return s;
}

/* A throwaway cgroupsPath under the host's real cgroups (v1 here). */
static void cgroups(void **state)
{
	(void)state;
	char *name = xasprintf("capsule-test-oci-%d", (int)getpid());
	char *cp = xasprintf("/%s", name);
	struct cap_oci_config c = { .cgroups_path = cp, .memory_limit = 300u << 20, .pids_limit = 77,
				    .cpu_shares = 512, .cpu_quota = 50000, .cpu_period = 100000 };
	struct cap_err err;
	struct cap_oci_cgroups cg;
	/* Nothing to do without a path. */
	struct cap_oci_config none = { .cgroups_path = (char *)"" };
	assert_int_equal(cap_oci_cgroup_plan("", &cg, &err), 0);
	assert_int_equal(cg.n, 0);
	assert_int_equal(cap_oci_cgroup_create(&none, &cg, &err), 0);
	assert_int_equal(cap_oci_cgroup_remove(&cg, &err), 0);
	/* Never made: gone already. */
	if (cap_oci_cgroup_plan(cp, &cg, &err) < 0)
		fail_msg("%s", err.msg);
	assert_int_equal(cap_oci_cgroup_remove(&cg, &err), 0);
	cap_oci_cgroups_fini(&cg);
	assert_int_equal(cap_oci_cgroup_plan("/../etc", &cg, &err), -EINVAL);

	if (cap_oci_cgroup_plan(cp, &cg, &err) < 0 || cap_oci_cgroup_create(&c, &cg, &err) < 0)
		fail_msg("%s", err.msg);
	bool v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
	const char *files[][2] = {
		{ v2 ? "" : "memory/", v2 ? "memory.max" : "memory.limit_in_bytes" },
		{ v2 ? "" : "pids/", "pids.max" },
		{ v2 ? "" : "cpu/", v2 ? "cpu.weight" : "cpu.shares" },
		{ v2 ? "" : "cpu/", v2 ? "cpu.max" : "cpu.cfs_quota_us" },
	};
	const char *want[] = { "314572800\n", "77\n", v2 ? "20\n" : "512\n", v2 ? "50000 100000\n" : "50000\n" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(files); i++) {
		char *p = xasprintf("/sys/fs/cgroup/%s%s/%s", files[i][0], name, files[i][1]);
		char *s = slurp(p);
		if (!s || strcmp(s, want[i]) != 0)
			fail_msg("%s: \"%s\", not \"%s\"", p, s ? s : "(unreadable)", want[i]);
		free(s);
		free(p);
	}
	/* A child joins the leaf; a grandchild cgroup (the jail's vm-N)
	 * holds another process. Remove kills both and leaves nothing. */
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct cap_err e2;
		char ok = cap_oci_cgroup_join(cp, &e2) == 0 ? 'y' : 'n';
		(void)!write(p[1], &ok, 1);
		for (;;)
			pause();
	}
	char ok = 0;
	assert_int_equal(read(p[0], &ok, 1), 1);
	assert_int_equal(ok, 'y');
	char *procs = xasprintf("/sys/fs/cgroup/%s%s/capsule/cgroup.procs", v2 ? "" : "pids/", name);
	char *s = slurp(procs);
	char *pidline = xasprintf("%d\n", (int)pid);
	assert_non_null(s);
	assert_non_null(strstr(s, pidline));
	free(s);
	char *vm = xasprintf("/sys/fs/cgroup/%s%s/vm-1", v2 ? "" : "pids/", name);
	assert_int_equal(mkdir(vm, 0755), 0);
	pid_t other = fork();
	assert_true(other >= 0);
	if (other == 0) {
		for (;;)
			pause();
	}
	char *vprocs = xasprintf("%s/cgroup.procs", vm);
	char *op = xasprintf("%d", (int)other);
	write_text(vprocs, op);

	int64_t t0 = cap_now_ms();
	if (cap_oci_cgroup_remove(&cg, &err) < 0)
		fail_msg("%s", err.msg);
	int64_t took = cap_now_ms() - t0;
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(waitpid(other, &status, 0), other);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	const char *hier[] = { "memory", "pids", "cpu", "cpuacct", "blkio", "freezer" };
	for (size_t i = 0; i < (v2 ? 1 : CAP_ARRAY_SIZE(hier)); i++) {
		char *d = xasprintf("/sys/fs/cgroup/%s%s%s", v2 ? "" : hier[i], v2 ? "" : "/", name);
		if (access(d, F_OK) == 0)
			fail_msg("%s is still there", d);
		free(d);
	}
	print_message("# cgroup removed with 2 processes in %lld ms\n", (long long)took);
	/* Gone: removing again is fine. */
	assert_int_equal(cap_oci_cgroup_remove(&cg, &err), 0);
	cap_oci_cgroups_fini(&cg);
	close(p[0]);
	close(p[1]);
	free(vprocs);
	free(op);
	free(vm);
	free(pidline);
	free(procs);
	free(name);
	free(cp);
}

/* Move process pid into the cgroup dir. */
static void write_text_in(const char *cgdir, pid_t pid)
{
	char *procs = xasprintf("%s/cgroup.procs", cgdir);
	char *s = xasprintf("%d", (int)pid);
	write_text(procs, s);
	free(s);
	free(procs);
}

/* A process that pauses until killed, moved into the cgroup dir. */
static pid_t spawn_in(const char *cgdir)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Gone with the test, and holding none of its output open,
		 * should an assertion end it first. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int null = open("/dev/null", O_RDWR);
		dup2(null, 1);
		dup2(null, 2);
		for (;;)
			pause();
	}
	write_text_in(cgdir, pid);
	return pid;
}

static bool alive(pid_t pid)
{
	return waitpid(pid, NULL, WNOHANG) == 0 && kill(pid, 0) == 0;
}

static void end_child(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static void rm_cgroups(const char *name)
{
	char *cmd = xasprintf("for d in /sys/fs/cgroup/%s /sys/fs/cgroup/*/%s; do [ -d \"$d\" ] && "
			      "find \"$d\" -depth -type d -exec rmdir {} +; done 2>/dev/null; true", name, name);
	assert_int_equal(system(cmd), 0);
	free(cmd);
}

/* A cgroupsPath that is someone else's: one holding a process is refused
 * before anything is written (its limits stay); in one found empty, and
 * in one made by create, remove kills only the container's processes (of
 * its leaf and vm-N) and removes only what create made; a folder made
 * again by someone else after create is not touched. */
static void foreign_cgroups(void **state)
{
	(void)state;
	bool v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
	const char *h = v2 ? "" : "pids/";
	char *name = xasprintf("capsule-test-oci-foreign-%d", (int)getpid());
	char *cp = xasprintf("/%s", name);
	char *path = xasprintf("/sys/fs/cgroup/%s%s", h, name);
	char *max = xasprintf("%s/pids.max", path);
	struct cap_oci_config c = { .cgroups_path = cp, .pids_limit = 77 };
	struct cap_oci_cgroups cg;
	struct cap_err err = { 0 };

	/* Populated: refused, naming the cgroup and the pid; nothing changed. */
	assert_int_equal(mkdir(path, 0755), 0);
	char *other = xasprintf("/sys/fs/cgroup/%s%s/other", h, name);
	assert_int_equal(mkdir(other, 0755), 0);
	write_text(max, "33");
	pid_t foreign = spawn_in(other);
	char *fp = xasprintf("pid %d", (int)foreign);
	assert_int_equal(cap_oci_cgroup_plan(cp, &cg, &err), -EBUSY);
	assert_non_null(strstr(err.msg, path));
	assert_non_null(strstr(err.msg, fp));
	assert_non_null(strstr(err.msg, "not this container's"));
	assert_int_equal(cg.n, 0);
	assert_true(alive(foreign));
	char *s = slurp(max);
	assert_string_equal(s, "33\n");
	free(s);

	/* Found empty (the foreign process moved out): used and limited. */
	char *root = xasprintf("/sys/fs/cgroup/%s", h);
	write_text_in(root, foreign);
	if (cap_oci_cgroup_plan(cp, &cg, &err) < 0 || cap_oci_cgroup_create(&c, &cg, &err) < 0)
		fail_msg("%s", err.msg);
	s = slurp(max);
	assert_string_equal(s, "77\n");
	free(s);
	/* The container's processes: the monitor in the leaf, QEMU in the
	 * jail's vm-N. Someone else's arrives in a sibling folder. */
	char *leaf = xasprintf("%s/capsule", path);
	char *vm = xasprintf("%s/vm-7", path);
	assert_int_equal(mkdir(vm, 0755), 0);
	pid_t mine = spawn_in(leaf), qemu = spawn_in(vm);
	write_text_in(other, foreign);
	if (cap_oci_cgroup_remove(&cg, &err) < 0)
		fail_msg("%s", err.msg);
	int status;
	assert_int_equal(waitpid(mine, &status, 0), mine);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(waitpid(qemu, &status, 0), qemu);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_true(alive(foreign));
	assert_int_equal(access(other, F_OK), 0);
	assert_int_equal(access(path, F_OK), 0);
	assert_int_not_equal(access(leaf, F_OK), 0);
	assert_int_not_equal(access(vm, F_OK), 0);
	cap_oci_cgroups_fini(&cg);

	/* Made by create, and someone else's process moved into it: it is
	 * not signalled, and the folder stays (-EBUSY, saying so). */
	write_text_in(root, foreign);
	rm_cgroups(name);
	if (cap_oci_cgroup_plan(cp, &cg, &err) < 0 || cap_oci_cgroup_create(&c, &cg, &err) < 0)
		fail_msg("%s", err.msg);
	mine = spawn_in(leaf);
	assert_int_equal(mkdir(other, 0755), 0);
	write_text_in(other, foreign);
	assert_int_equal(cap_oci_cgroup_remove(&cg, &err), -EBUSY);
	assert_non_null(strstr(err.msg, "left in place"));
	assert_int_equal(waitpid(mine, &status, 0), mine);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_true(alive(foreign));
	assert_int_equal(access(other, F_OK), 0);
	cap_oci_cgroups_fini(&cg);

	/* Made by create, then removed and made again by someone else, who
	 * put a process in a folder named as the leaf: not the container's. */
	write_text_in(root, foreign);
	rm_cgroups(name);
	if (cap_oci_cgroup_plan(cp, &cg, &err) < 0 || cap_oci_cgroup_create(&c, &cg, &err) < 0)
		fail_msg("%s", err.msg);
	rm_cgroups(name);
	assert_int_equal(mkdir(path, 0755), 0);
	assert_int_equal(mkdir(leaf, 0755), 0);
	write_text_in(leaf, foreign);
	if (cap_oci_cgroup_remove(&cg, &err) < 0)
		fail_msg("%s", err.msg);
	assert_true(alive(foreign));
	assert_int_equal(access(leaf, F_OK), 0);
	cap_oci_cgroups_fini(&cg);

	end_child(foreign);
	rm_cgroups(name);
	free(root);
	free(leaf);
	free(vm);
	free(fp);
	free(other);
	free(max);
	free(path);
	free(name);
	free(cp);
}

/* The rootfs cache's lock files left in the capsule home. */
static int lock_files(void)
{
	char *cmd = xasprintf("ls '%s/home/images/rootfs' | grep -c '\\.lock$'", dir);
	FILE *p = popen(cmd, "r");
	int n = -1;
	assert_non_null(p);
	assert_int_equal(fscanf(p, "%d", &n), 1);
	pclose(p);
	free(cmd);
	return n;
}

/* The progress lines of one lookup, joined. */
struct said {
	char text[4096];
};

static void collect(void *ud, const char *line)
{
	struct said *s = ud;
	size_t n = strlen(s->text);
	snprintf(s->text + n, sizeof(s->text) - n, "%s\n", line);
}

/* Look dir up with the usual skip list: its digest in digest, whether it
 * was cached, what progress said in said (may be NULL). */
static bool lookup(const char *t, char digest[80], struct said *said)
{
	const char *skip[] = { "/etc/hosts", "/etc/resolv.conf" };
	struct cap_image img;
	bool cached = false;
	struct cap_err err;
	struct said ignored;
	if (!said)
		said = &ignored;
	said->text[0] = '\0';
	if (cap_store_image_from_rootfs(t, skip, 2, collect, said, &img, &cached, &err) < 0)
		fail_msg("%s: %s", t, err.msg);
	snprintf(digest, 80, "%s", img.digest);
	cap_image_fini(&img);
	return cached;
}

static void sh(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *cmd = NULL;
	assert_true(vasprintf(&cmd, fmt, ap) >= 0);
	va_end(ap);
	if (system(cmd) != 0)
		fail_msg("failed: %s", cmd);
	free(cmd);
}

/* Keyed by content: two trees that differ only in a file's bytes (same
 * size, same pinned time, as SOURCE_DATE_EPOCH builds make) are two
 * images; a symlink's time is not keyed, its target and xattrs are. */
static void rootfs_content(void **state)
{
	(void)state;
	char *t1 = xasprintf("%s/pinned1", dir), *t2 = xasprintf("%s/pinned2", dir);
	sh("set -e; for t in %s %s; do mkdir -p $t/bin $t/etc; echo hi > $t/bin/sh; ln -s sh $t/bin/ash; done;"
	   " printf AAAA > %s/msg; printf BBBB > %s/msg;"
	   " touch -h -d '2020-01-01 00:00:00' %s/msg %s/msg %s/bin/ash %s/bin/ash %s/bin/sh %s/bin/sh",
	   t1, t2, t1, t2, t1, t2, t1, t2, t1, t2);
	char d1[80], d2[80], d[80];
	struct said said;
	assert_false(lookup(t1, d1, &said));
	assert_false(lookup(t2, d2, NULL));	/* the reviewer's case: was a hit */
	assert_string_not_equal(d1, d2);
	assert_non_null(strstr(said.text, "keyed by content"));
	assert_true(lookup(t1, d, NULL));
	assert_string_equal(d, d1);

	/* A symlink's time moves (Podman's fresh /etc/mtab): still cached. */
	sh("touch -h -d '2024-05-05 05:05:05' %s/bin/ash", t1);
	assert_true(lookup(t1, d, NULL));
	assert_string_equal(d, d1);
	/* ... its target changes: a miss. */
	sh("ln -sfn /bin/sh %s/bin/ash", t2);
	assert_false(lookup(t2, d, NULL));

	/* An extended attribute: another key. */
	char *f = xasprintf("%s/bin/sh", t1);
	if (setxattr(f, "user.capsule-test", "1", 1, 0) == 0) {
		assert_false(lookup(t1, d, NULL));
		assert_true(lookup(t1, d, NULL));
		assert_int_equal(setxattr(f, "user.capsule-test", "2", 1, 0), 0);
		assert_false(lookup(t1, d, NULL));
	} else {
		print_message("# xattr check not run: %s cannot hold user.* xattrs (%s)\n", dir, strerror(errno));
	}
	assert_int_equal(lock_files(), 0);
	free(f);
	free(t1);
	free(t2);
}

/* An overlay mount point (an engine's container rootfs) is keyed by its
 * lower layers' identities when they are an engine's committed layers
 * (containers/storage's overlay/<id>/diff, containerd's snapshots/<n>/fs),
 * and its upper layer's content. */
#define L1 "st ore:x/overlay/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/diff"
#define L2 "st ore:x/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs"
static void rootfs_overlay(void **state)
{
	(void)state;
	char *o = xasprintf("%s/ovl", dir);
	/* A space and a colon in the layers' paths: mountinfo's \040,
	 * overlay's \:. */
	sh("set -e; cd %s/..; mkdir -p ovl; cd ovl; mkdir -p '" L1 "/bin' '" L2 "/etc' up/etc work merged 'plain low/bin';"
	   " echo hi > '" L1 "/bin/sh'; : > '" L2 "/etc/hosts'; echo 1 > '" L2 "/etc/f'; echo hi > 'plain low/bin/sh';"
	   " printf AAAA > up/msg; : > up/etc/hosts; ln -s /proc/mounts up/etc/mtab", o);
	char *merged = xasprintf("%s/merged", o);
	char *opts = xasprintf("lowerdir=%s/st ore\\:x/overlay/%s/diff:%s/st ore\\:x/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs,"
			       "upperdir=%s/up,workdir=%s/work", o, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", o, o, o);
	char *swapped = xasprintf("lowerdir=%s/st ore\\:x/io.containerd.snapshotter.v1.overlayfs/snapshots/12/fs:%s/st ore\\:x/overlay/%s/diff,"
				  "upperdir=%s/up,workdir=%s/work", o, o, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", o, o);
	if (mount("overlay", merged, "overlay", 0, opts) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", opts, merged, strerror(errno));
	char d1[80], d[80];
	struct said said;
	assert_false(lookup(merged, d1, &said));
	if (!strstr(said.text, "keyed by its 2 overlay layers"))
		fail_msg("not keyed by layers: %s", said.text);
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, d1);

	/* The engine's next container: the same upper made at another time
	 * (and a fresh /etc/mtab link). */
	sh("touch -d '2001-01-01' %s/msg %s/etc/hosts && touch -h -d '2002-02-02' %s/etc/mtab", merged, merged, merged);
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, d1);
	/* A skip path's content in the upper: not keyed. */
	sh("echo 10.0.0.1 h > %s/etc/hosts", merged);
	assert_true(lookup(merged, d, NULL));

	/* Another upper content (same size): a miss. */
	sh("printf BBBB > %s/msg", merged);
	assert_false(lookup(merged, d, NULL));
	assert_string_not_equal(d, d1);
	sh("printf AAAA > %s/msg", merged);
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, d1);
	/* A whiteout in the upper: a miss. */
	sh("rm %s/etc/f", merged);
	assert_false(lookup(merged, d, NULL));
	assert_int_equal(umount2(merged, 0), 0);
	sh("rm -f %s/up/etc/f", o);	/* the whiteout */

	/* The same layers in another order: another key. */
	if (mount("overlay", merged, "overlay", 0, swapped) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", swapped, merged, strerror(errno));
	assert_false(lookup(merged, d, &said));
	assert_non_null(strstr(said.text, "overlay layers"));
	assert_int_equal(umount2(merged, 0), 0);

	/* The same layers given one by one (lowerdir+=, the new mount API's
	 * form, which mountinfo shows so too): the same key. */
	char *plus = xasprintf("lowerdir+=%s/" L1 ",lowerdir+=%s/" L2 ",upperdir=%s/up,workdir=%s/work", o, o, o, o);
	if (mount("overlay", merged, "overlay", 0, plus) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", plus, merged, strerror(errno));
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, d1);
	assert_int_equal(umount2(merged, 0), 0);
	free(plus);

	/* A mount inside it: the layers do not tell it all, keyed by content. */
	if (mount("overlay", merged, "overlay", 0, opts) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", opts, merged, strerror(errno));
	char *inside = xasprintf("%s/bin", merged);
	char *from = xasprintf("%s/" L2 "/etc", o);
	assert_int_equal(mount(from, inside, NULL, MS_BIND, NULL), 0);
	assert_false(lookup(merged, d, &said));
	if (!strstr(said.text, "keyed by content (something is mounted inside it"))
		fail_msg("%s", said.text);
	assert_int_equal(umount2(inside, 0), 0);
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, d1);
	assert_int_equal(umount2(merged, 0), 0);

	/* A lower that is not an engine's committed layer (podman run
	 * --rootfs DIR:O lays an overlay over the user's own directory, which
	 * the user may edit): keyed by content, so an edit there misses. */
	char *plain = xasprintf("lowerdir=%s/plain low,upperdir=%s/up,workdir=%s/work", o, o, o);
	if (mount("overlay", merged, "overlay", 0, plain) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", plain, merged, strerror(errno));
	char p1[80];
	assert_false(lookup(merged, p1, &said));
	if (!strstr(said.text, "not an engine's committed layer"))
		fail_msg("%s", said.text);
	assert_true(lookup(merged, d, NULL));
	assert_string_equal(d, p1);
	assert_int_equal(umount2(merged, 0), 0);
	sh("printf bye > '%s/plain low/bin/sh'", o);	/* same size as "hi\n" */
	if (mount("overlay", merged, "overlay", 0, plain) < 0)
		fail_msg("mount -t overlay -o %s %s: %s", plain, merged, strerror(errno));
	assert_false(lookup(merged, d, NULL));
	assert_string_not_equal(d, p1);
	assert_int_equal(umount2(merged, 0), 0);

	assert_int_equal(lock_files(), 0);
	free(plain);
	free(inside);
	free(from);
	free(opts);
	free(swapped);
	free(merged);
	free(o);
}

static void progress(void *ud, const char *line)
{
	(void)ud, (void)line;
}

/* A small root tree: a few files, a symlink, an empty mount point. */
static char *make_tree(void)
{
	char *t = xasprintf("%s/tree", dir);
	char *cmd = xasprintf("set -e; mkdir -p %s/etc %s/bin %s/usr/lib; echo hi > %s/bin/hello; chmod 755 %s/bin/hello;"
			      " : > %s/etc/hosts; echo nameserver 1.1.1.1 > %s/etc/resolv.conf; ln -s ../bin/hello %s/usr/lib/link;"
			      " head -c 300000 /dev/urandom > %s/usr/lib/blob",
			      t, t, t, t, t, t, t, t, t);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	return t;
}

static void rootfs_cache(void **state)
{
	(void)state;
	char *t = make_tree();
	const char *skip[] = { "/etc/hosts", "/etc/resolv.conf" };
	struct cap_image a, b;
	bool cached = true;
	struct cap_err err;
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &a, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	assert_false(cached);
	assert_null(a.owned_name);
	assert_non_null(strstr(a.owned_source, "container rootfs"));
	assert_non_null(strstr(a.owned_source, t));

	/* The same tree: found, without a build. */
	int64_t t0 = cap_now_ns();
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &b, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	int64_t took = cap_now_ns() - t0;
	assert_true(cached);
	assert_string_equal(a.digest, b.digest);
	print_message("# cached lookup in %.2f ms\n", (double)took / 1e6);
	assert_true(took < 500 * 1000000LL);
	cap_image_fini(&b);

	/* A file at a skip path changed: still the cached image. */
	char *p = xasprintf("%s/etc/hosts", t);
	write_text(p, "10.0.0.1 other\n");
	free(p);
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &b, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	assert_true(cached);
	assert_string_equal(a.digest, b.digest);
	cap_image_fini(&b);

	/* Without the skip list, the change shows. */
	if (cap_store_image_from_rootfs(t, NULL, 0, progress, NULL, &b, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	assert_false(cached);
	cap_image_fini(&b);

	/* A changed file: a new image. */
	p = xasprintf("%s/bin/hello", t);
	write_text(p, "changed\n");
	free(p);
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &b, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	assert_false(cached);
	assert_string_not_equal(a.digest, b.digest);
	cap_image_fini(&b);

	/* The cached image gone (image rm): built again, not a dangling hit. */
	if (cap_store_image_remove(a.digest, NULL, NULL, &err) < 0)
		fail_msg("%s", err.msg);
	p = xasprintf("%s/etc/hosts", t);
	write_text(p, "");
	free(p);
	p = xasprintf("%s/bin/hello", t);
	write_text(p, "hi\n");
	free(p);
	/* The first tree's bytes again, so its fingerprint (times are not
	 * keyed): its image removed above, it is built again, the link
	 * rewritten; then removal of that image is seen too. */
	struct cap_image c1;
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &c1, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	if (cap_store_image_remove(c1.digest, NULL, NULL, &err) < 0)
		fail_msg("%s", err.msg);
	/* Removing an image removes the cache's links to it (and dangling
	 * ones): every link left names an image that is there (two: the
	 * tree keyed without skips, and the changed one), none c1. */
	{
		_cleanup_free_ char *home = cap_home_dir();
		_cleanup_free_ char *cache = xasprintf("%s/images/rootfs", home);
		DIR *d = opendir(cache);
		struct dirent *e;
		unsigned links = 0;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.' || strstr(e->d_name, ".lock"))
				continue;
			char target[512];
			_cleanup_free_ char *link = xasprintf("%s/%s", cache, e->d_name);
			ssize_t n = readlink(link, target, sizeof(target) - 1);
			assert_true(n > 0);
			target[n] = '\0';
			assert_null(strstr(target, c1.digest + 7));
			_cleanup_free_ char *img = xasprintf("%s/%s", cache, target);
			assert_int_equal(access(img, F_OK), 0);
			links++;
		}
		if (d)
			closedir(d);
		assert_int_equal(links, 2);
	}
	if (cap_store_image_from_rootfs(t, skip, 2, progress, NULL, &b, &cached, &err) < 0)
		fail_msg("%s", err.msg);
	assert_false(cached);
	assert_string_equal(b.digest, c1.digest);
	assert_int_equal(access(b.owned_path, R_OK), 0);
	cap_image_fini(&b);
	cap_image_fini(&c1);

	assert_int_equal(cap_store_image_from_rootfs("/nonexistent/rootfs", NULL, 0, NULL, NULL, &b, &cached, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "/nonexistent/rootfs"));
	cap_image_fini(&a);
	free(t);
}

/* Two processes making the same rootfs's image at once: one builds, the
 * other waits and finds it; both get the same digest. */
static void rootfs_concurrent(void **state)
{
	(void)state;
	char *t = xasprintf("%s/tree2", dir);
	char *cmd = xasprintf("mkdir -p %s/a && head -c 200000 /dev/urandom > %s/a/f", t, t);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	int p[2][2];
	pid_t pids[2];
	for (int i = 0; i < 2; i++) {
		assert_int_equal(pipe(p[i]), 0);
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			struct cap_image img;
			bool cached;
			struct cap_err err;
			char out[80] = "fail";
			if (cap_store_image_from_rootfs(t, NULL, 0, NULL, NULL, &img, &cached, &err) == 0)
				snprintf(out, sizeof(out), "%c%s", cached ? 'c' : 'b', img.digest);
			(void)!write(p[i][1], out, strlen(out));
			_exit(0);
		}
		close(p[i][1]);
	}
	char got[2][80];
	for (int i = 0; i < 2; i++) {
		ssize_t n = read(p[i][0], got[i], sizeof(got[i]) - 1);
		assert_true(n > 0);
		got[i][n] = '\0';
		close(p[i][0]);
		waitpid(pids[i], NULL, 0);
	}
	assert_string_not_equal(got[0], "fail");
	assert_string_not_equal(got[1], "fail");
	assert_string_equal(got[0] + 1, got[1] + 1);
	assert_true((got[0][0] == 'b') != (got[1][0] == 'b'));
	assert_int_equal(lock_files(), 0);
	free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(config_read),
		cmocka_unit_test(config_refusals),
		cmocka_unit_test(tmpfs_mounts),
		cmocka_unit_test(network_namespaces),
		cmocka_unit_test(pod_host_namespaces),
		cmocka_unit_test(systemd_paths),
		cmocka_unit_test(process_file),
		cmocka_unit_test(signals),
		cmocka_unit_test(cgroups),
		cmocka_unit_test(foreign_cgroups),
		cmocka_unit_test(rootfs_cache),
		cmocka_unit_test(rootfs_concurrent),
		cmocka_unit_test(rootfs_content),
		cmocka_unit_test(rootfs_overlay),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
