/* SETUP: the guest's disks found by serial and mounted, the overlay root
 * switched into, the clock and the random pool taken from the host, the
 * network, the CA, the commands' variables, a container's tmpfs mounts
 * and a read-only root. Once per boot. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent-internal.h"
#include "layout.h"
#include "proto.h"
#include "util.h"

/* --- disks ----------------------------------------------------------- */

/* Find /dev/vdX whose virtio-blk serial is serial. */
static int find_disk(const char *serial, char *dev, size_t len)
{
	DIR *d = opendir("/sys/block");
	struct dirent *e;
	int r = -ENOENT;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "vd", 2) != 0 || strlen(e->d_name) > 16)
			continue;
		char path[300], *s = NULL;
		snprintf(path, sizeof(path), "/sys/block/%s/serial", e->d_name);
		if (cap_read_file(path, 256, &s) < 0)
			continue;
		s[strcspn(s, "\n")] = '\0';
		bool match = strcmp(s, serial) == 0;
		free(s);
		if (match) {
			snprintf(dev, len, "/dev/%.16s", e->d_name);
			r = 0;
			break;
		}
	}
	if (d)
		closedir(d);
	return r;
}

/* Drop cached blocks of a disk: a restored guest may have read the
 * template's placeholder at the same place. */
static void flush_disk(const char *dev)
{
	int fd = open(dev, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ioctl(fd, BLKFLSBUF, 0);
		close(fd);
	}
}

/* The disk with this serial at dst, as the layout's entry m mounts it
 * (type, flags, data). shown: what commands call a writable disk (its
 * end flushes it). */
static int mount_disk(const char *serial, const char *dst, const struct cap_guest_mount *m,
		      const char *shown, char *msg, size_t mlen)
{
	char dev[64];
	if (find_disk(serial, dev, sizeof(dev)) < 0) {
		snprintf(msg, mlen, "no disk with serial %s", serial);
		return -ENOENT;
	}
	mkdir(dst, 0755);
	flush_disk(dev);
	if (mount(dev, dst, m->fstype, m->flags, m->data) < 0) {
		int e = errno;
		snprintf(msg, mlen, "cannot mount %s (%s, serial %s) on %s: %s",
			 dev, m->fstype, serial, dst, strerror(e));
		return -e;
	}
	if (!(m->flags & MS_RDONLY))
		agent_durable_add(dst, dev, shown);
	return 0;
}

/* --- the final root: a container's tmpfs, /run, the tool user ---------- */

/* One of SETUP's tmpfs mounts, in the final root: its destination
 * resolved in that root and made (mkdir -p, 0755 root's) where missing,
 * refused where it resolves to a guest's own mount point or is not a
 * directory (nothing else runs in the guest yet, so what is checked is
 * what is mounted on), then the tmpfs with its data and flags. */
static int mount_tmpfs(const struct cap_setup_tmpfs *t, char *msg, size_t mlen)
{
	/* Symbolic links on the way are followed as runc follows them in the
	 * container's root (Debian's /var/run -> /run): the agent is chrooted
	 * into the final root, so a link cannot lead out of it; where it leads
	 * is checked below. The deepest part of the destination that exists is
	 * resolved; the rest is made, directory by directory. */
	char path[sizeof(t->destination)], real[PATH_MAX];
	snprintf(path, sizeof(path), "%s", t->destination);
	size_t keep = strlen(path);
	char rest[sizeof(t->destination)] = "";
	for (;;) {
		if (realpath(keep ? path : "/", real))
			break;
		if (errno != ENOENT || keep <= 1) {
			int r = -errno;
			snprintf(msg, mlen, "tmpfs at %.120s: cannot resolve %.120s: %s", t->destination, path, strerror(-r));
			return r;
		}
		char *slash = strrchr(path, '/');
		snprintf(rest, sizeof(rest), "%s%s", slash, t->destination + keep);
		*slash = '\0';
		keep = strlen(path);
	}
	char target[PATH_MAX + sizeof(t->destination)];
	snprintf(target, sizeof(target), "%s%s", strcmp(real, "/") == 0 ? "" : real, rest);
	if (!target[0])
		snprintf(target, sizeof(target), "/");
	if (cap_guest_path_reserved(target)) {
		snprintf(msg, mlen, "tmpfs at %.120s (%.120s): the guest's own mount point, which a container's tmpfs cannot replace",
			 t->destination, target);
		return -EINVAL;
	}
	/* Make what is missing (a name that exists now is a dangling link or
	 * not a directory: refused below). */
	int r = cap_mkdir_p(target, 0755);
	if (r < 0) {
		snprintf(msg, mlen, "tmpfs at %.120s: cannot make %.120s: %s", t->destination, target, strerror(-r));
		return r;
	}
	struct stat st;
	if (lstat(target, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(msg, mlen, "tmpfs at %.120s: %.120s is not a directory; give the container a destination that is one",
			 t->destination, target);
		return -ENOTDIR;
	}
	if (mount("tmpfs", target, "tmpfs", t->flags, t->data[0] ? t->data : NULL) < 0) {
		int r = -errno;
		snprintf(msg, mlen, "cannot mount a tmpfs at %s (%.100s): %s", t->destination,
			 t->data[0] ? t->data : "no options", strerror(-r));
		return r;
	}
	return 0;
}

/* Copy the image's tree at src (its /run: a container's files such as
 * /run/.containerenv, seeded into the upper layer) into the tmpfs about
 * to cover it: directories, symbolic links and regular files up to 1 MiB,
 * with their modes and owners. Best effort, depth-bounded; what cannot be
 * copied is logged. */
static void copy_small_tree(int src, int dst, int depth)
{
	DIR *d = fdopendir(src);
	if (!d) {
		close(src);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < 8) {
			mkdirat(dst, e->d_name, st.st_mode & 07777);
			int s2 = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int d2 = openat(dst, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (s2 >= 0 && d2 >= 0)
				copy_small_tree(s2, d2, depth + 1);
			else if (s2 >= 0)
				close(s2);
			if (d2 >= 0) {
				fchownat(dst, e->d_name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
				fchmodat(dst, e->d_name, st.st_mode & 07777, 0);
				close(d2);
			}
		} else if (S_ISLNK(st.st_mode)) {
			char t[4096];
			ssize_t n = readlinkat(dirfd(d), e->d_name, t, sizeof(t) - 1);
			if (n > 0) {
				t[n] = '\0';
				if (symlinkat(t, dst, e->d_name) == 0)
					fchownat(dst, e->d_name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
			}
		} else if (S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) {
			int in = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			int out = openat(dst, e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
					 st.st_mode & 07777);
			char buf[16384];
			ssize_t n = 0;
			while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
				if (write(out, buf, (size_t)n) != n)
					break;
			if (out >= 0) {
				fchown(out, st.st_uid, st.st_gid);
				fchmod(out, st.st_mode & 07777);
				close(out);
			}
			if (in >= 0)
				close(in);
		} else {
			agent_log("the image's /run/%s is not copied into the guest's /run", e->d_name);
		}
	}
	closedir(d);
}

/* Make sure the tool user has a name in the image's /etc/passwd (the
 * write lands in the upper layer). */
static void ensure_tool_user(void)
{
	char *s = NULL;
	if (cap_read_file("/etc/passwd", 1u << 20, &s) < 0)
		return;
	bool have = strstr(s, ":x:1000:") != NULL;
	free(s);
	if (have)
		return;
	FILE *f = fopen("/etc/passwd", "a");
	if (f) {
		fputs("user:x:1000:1000:user:" CAP_GUEST_WORK ":/bin/sh\n", f);
		fclose(f);
	}
	f = fopen("/etc/group", "a");
	if (f) {
		fputs("user:x:1000:\n", f);
		fclose(f);
	}
}

/* --- SETUP ----------------------------------------------------------- */

/* A VM restored from a template shares its random state and its clock
 * with every other clone: take the host's. */
static void fresh_start(const struct cap_setup *s)
{
	struct timespec ts = { .tv_sec = s->realtime_ns / 1000000000, .tv_nsec = s->realtime_ns % 1000000000 };
	if (s->realtime_ns > 0 && clock_settime(CLOCK_REALTIME, &ts) < 0)
		agent_log("cannot set the clock: %s", strerror(errno));
	struct {
		int entropy_count;
		int buf_size;
		uint8_t buf[sizeof(s->seed)];
	} e = { (int)sizeof(s->seed) * 8, (int)sizeof(s->seed), { 0 } };
	memcpy(e.buf, s->seed, sizeof(s->seed));
	int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || ioctl(fd, RNDADDENTROPY, &e) < 0 || ioctl(fd, RNDRESEEDCRNG) < 0)
		agent_log("cannot seed the random pool: %s", strerror(errno));
	if (fd >= 0)
		close(fd);
}

static int do_setup(const struct cap_setup *s, char *msg, size_t mlen)
{
	const char *root = "/";
	int r;

	fresh_start(s);
	A.cmd_uid = s->tools_root ? 0 : TOOL_UID;
	A.cmd_gid = s->tools_root ? 0 : TOOL_GID;
	agent_env_reset();
	agent_durable_close();	/* a SETUP tried again starts over */
	if (s->root_readonly && !*s->root_image) {
		snprintf(msg, mlen, "a read-only root needs a root image; this SETUP names none");
		return -EINVAL;
	}
	if (*s->root_image) {
		/* Overlay root: the image read-only below, an ext4 disk
		 * above; then move into it, taking the pseudo file systems
		 * along. */
		mkdir("/.capsule", 0700);
		/* /dev is the devtmpfs moved in below; imports drop device
		 * nodes too. */
		const struct cap_guest_mount *lower = cap_guest_mount_at(CAP_GUEST_LOWER),
					     *upper = cap_guest_mount_at(CAP_GUEST_UPPER),
					     *top = cap_guest_mount_at(CAP_GUEST_NEWROOT);
		if ((r = mount_disk(s->root_image, lower->path, lower, NULL, msg, mlen)) < 0)
			return r;
		const char *opts = "lowerdir=" CAP_GUEST_LOWER;
		if (*s->root_upper) {
			if ((r = mount_disk(s->root_upper, upper->path, upper, "the root's upper disk", msg,
					    mlen)) < 0)
				return r;
			mkdir(CAP_GUEST_UPPER_DATA, 0755);
			mkdir(CAP_GUEST_UPPER_WORK, 0755);
			A.upper_fd = open(CAP_GUEST_UPPER, O_PATH | O_CLOEXEC);
			opts = "lowerdir=" CAP_GUEST_LOWER ",upperdir=" CAP_GUEST_UPPER_DATA
			       ",workdir=" CAP_GUEST_UPPER_WORK;
		}
		mkdir(top->path, 0755);
		if (mount(top->fstype, top->path, top->fstype, top->flags, opts) < 0) {
			r = -errno;
			snprintf(msg, mlen, "cannot mount the overlay root: %s", strerror(-r));
			return r;
		}
		if (*s->root_upper)
			agent_durable_add_overlay(top->path, upper->path);
		root = top->path;
	}

	char path[256];
	/* The data disks SETUP names, each where the layout has it. */
	const struct { const char *serial, *at; } disks[] = {
		{ s->work, CAP_GUEST_WORK }, { s->workspace, CAP_GUEST_WORKSPACE }, { s->source, CAP_GUEST_SOURCE },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(disks); i++) {
		const struct cap_guest_mount *m = cap_guest_mount_at(disks[i].at);
		if (!disks[i].serial || !*disks[i].serial)
			continue;
		snprintf(path, sizeof(path), "%s%s", root, m->path);
		if ((r = mount_disk(disks[i].serial, path, m, m->role, msg, mlen)) < 0)
			return r;
	}
	if (*s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0)
		agent_log("sethostname %s: %s", s->hostname, strerror(errno));

	if (strcmp(root, "/") != 0) {
		/* The tmpfs /run covers the image's: what the image (or its
		 * seeded upper layer) holds there is copied in first. */
		snprintf(path, sizeof(path), "%s/run", root);
		int rsrc = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int rdst = open("/run", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rsrc >= 0 && rdst >= 0)
			copy_small_tree(rsrc, rdst, 0);
		else if (rsrc >= 0)
			close(rsrc);
		if (rdst >= 0)
			close(rdst);
		size_t n;
		const struct cap_guest_mount *m = cap_guest_mounts(&n);
		for (size_t i = 0; i < n; i++) {
			if (!(m[i].attr & CAP_GUEST_MOVED))
				continue;
			snprintf(path, sizeof(path), "%s%s", root, m[i].path);
			mkdir(path, 0755);
			if (mount(m[i].path, path, NULL, MS_MOVE, NULL) < 0) {
				r = -errno;
				snprintf(msg, mlen, "cannot move %s into the new root: %s", m[i].path, strerror(-r));
				return r;
			}
		}
		if (chdir(root) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 ||
		    chroot(".") < 0 || chdir("/") < 0) {
			r = -errno;
			snprintf(msg, mlen, "cannot switch to the new root: %s", strerror(-r));
			return r;
		}
		ensure_tool_user();
	}
	if (*s->work && chown(CAP_GUEST_WORK, TOOL_UID, TOOL_GID) < 0)
		agent_log("chown " CAP_GUEST_WORK ": %s", strerror(errno));
	/* A pod's container roots and volumes (root's alone: the tool user
	 * never reaches into them). */
	if (*s->work && ((mkdir(CAP_GUEST_CONTAINERS, 0700) < 0 && errno != EEXIST) ||
			 (mkdir(CAP_GUEST_VOLUMES, 0700) < 0 && errno != EEXIST)))
		agent_log("cannot make " CAP_GUEST_CONTAINERS " or " CAP_GUEST_VOLUMES ": %s", strerror(errno));
	/* A new workspace disk holds the host user's files: the tool user's
	 * from now on, once (its root directory says whether it is done). */
	struct stat st;
	if (s->workspace && *s->workspace && lstat(CAP_GUEST_WORKSPACE, &st) == 0 &&
	    st.st_uid != TOOL_UID)
		agent_workspace_own(CAP_GUEST_WORKSPACE);
	/* In the final root, so that /etc's files are the ones commands see. */
	if (s->net_addr && (r = agent_net_setup(s, msg, mlen)) < 0)
		return r;
	if ((r = agent_ca_setup(s, msg, mlen)) < 0)
		return r;
	/* Last: the host's own variables win over the agent's defaults. */
	for (uint32_t i = 0; i < s->envc; i++)
		agent_env_put(s->env[i]);
	/* The container's tmpfs mounts, over what the root holds there
	 * (never copied in: no tmpcopyup), while the root is still writable
	 * for their directories. */
	for (uint32_t i = 0; i < s->ntmpfs; i++)
		if ((r = mount_tmpfs(&s->tmpfs[i], msg, mlen)) < 0)
			return r;
	/* A read-only root (an OCI config's root.readonly) once everything
	 * in it is written (/etc/passwd, the network's and the CA's files):
	 * only the overlay's own mount turns read-only; /dev, /proc, /sys,
	 * /tmp, /run, /work, /workspace and /source are mounts of their own
	 * and keep their modes. A bind remount replaces the mount's flags,
	 * so the overlay's nodev,nosuid are given again. */
	if (s->root_readonly &&
	    mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NODEV | MS_NOSUID, NULL) < 0) {
		r = -errno;
		snprintf(msg, mlen, "cannot make the root file system read-only: %s", strerror(-r));
		return r;
	}
	return 0;
}

/* A restored snapshot's re-identification (SETUP's forked): its own
 * clock, entropy and hostname, the new sandbox's CA and variables (its
 * placeholders); the mounts are the snapshot's, and so is everything
 * else the first SETUP set. */
static int do_forked(const struct cap_setup *s, char *msg, size_t mlen)
{
	fresh_start(s);
	if (*s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0)
		agent_log("sethostname %s: %s", s->hostname, strerror(errno));
	int r;
	if (!s->root_readonly && (r = agent_net_rename(s, msg, mlen)) < 0)
		return r;
	if ((r = agent_ca_setup(s, msg, mlen)) < 0)
		return r;
	for (uint32_t i = 0; i < s->envc; i++)
		agent_env_put(s->env[i]);
	return 0;
}

void handle_setup(const uint8_t *p, size_t n)
{
	struct cap_setup s;
	char msg[512] = "";
	int r;

	if (cap_proto_setup_decode(p, n, &s) < 0) {
		r = -EBADMSG;
		snprintf(msg, sizeof(msg), "malformed SETUP");
	} else {
		if (s.forked && !A.setup_done) {
			r = -EINVAL;
			snprintf(msg, sizeof(msg), "a fork's SETUP reached a VM that was never set up");
		} else if (s.forked) {
			r = do_forked(&s, msg, sizeof(msg));
		} else if (A.setup_done) {
			r = -EALREADY;
			snprintf(msg, sizeof(msg), "SETUP was already done in this VM");
		} else {
			r = do_setup(&s, msg, sizeof(msg));
			A.setup_done = r == 0;
			if (r < 0)
				agent_env_reset();	/* nothing half set up */
			if (r == 0 && s.net_addr && s.auto_publish)
				agent_publish_start(s.net_static ? 0 : s.net_addr);
		}
		cap_setup_fini(&s);
	}
	if (r < 0)
		agent_log("setup failed: %s", msg);
	uint8_t buf[4 + 512];
	size_t mn = strlen(msg);
	cap_put_u32(buf, (uint32_t)-r);
	memcpy(buf + 4, msg, mn);
	cap_proto_put(&A.out, CAP_MSG_SETUP, 0, buf, 4 + mn);
}
