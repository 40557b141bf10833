/* Pack the guest initramfs: busybox, its applet links, the agent as /init,
 * a minimal /etc, and the device nodes the kernel wants before devtmpfs.
 * Written as a newc cpio directly, so that no root, mknod or external
 * cpio is needed, and every header field (mtime, owner, inode) is fixed:
 * same inputs, same bytes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "layout.h"
#include "paths.h"
#include "sha256.h"
#include "store.h"
#include "store-internal.h"
#include "util.h"

/* Bump when the layout below changes, so that cached files are rebuilt. */
#define LAYOUT_VERSION "capsule-initramfs-1"

const char cap_store_passwd[] =
	"root:x:0:0:root:/root:/bin/sh\n"
	"user:x:1000:1000:user:" CAP_GUEST_WORK ":/bin/sh\n"
	"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const char cap_store_group[] = "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n";

struct cpio {
	struct cap_buf b;
	unsigned ino;
};

static void pad4(struct cpio *c)
{
	static const char zero[4];
	size_t r = cap_buf_used(&c->b) % 4;
	if (r)
		cap_buf_append(&c->b, zero, 4 - r);
}

static void entry(struct cpio *c, const char *name, unsigned mode,
		  unsigned uid, unsigned gid, const void *data, size_t size,
		  unsigned rmaj, unsigned rmin)
{
	char hdr[128];
	size_t namesize = strlen(name) + 1;
	snprintf(hdr, sizeof(hdr),
		 "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		 ++c->ino, mode, uid, gid, 1u, 0u, (unsigned)size, 0u, 0u,
		 rmaj, rmin, (unsigned)namesize, 0u);
	cap_buf_append(&c->b, hdr, 110);
	cap_buf_append(&c->b, name, namesize);
	pad4(c);
	cap_buf_append(&c->b, data, size);
	pad4(c);
}

static void dir(struct cpio *c, const char *name, unsigned perm)
{
	entry(c, name, S_IFDIR | perm, 0, 0, NULL, 0, 0, 0);
}

static int file(struct cpio *c, const char *name, const char *src,
		unsigned perm, struct cap_err *err)
{
	char *data = NULL;
	ssize_t n = cap_read_file(src, 64u << 20, &data);
	if (n < 0)
		return cap_err_set(err, -n, "cannot read %s: %s", src, strerror((int)-n));
	entry(c, name, S_IFREG | perm, 0, 0, data, (size_t)n, 0, 0);
	free(data);
	return 0;
}

/* Ask busybox for its applets ("usr/bin/awk" style paths). */
int cap_store_busybox_applets(const char *busybox, char **out, struct cap_err *err)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p[1], 1);
		execl(busybox, "busybox", "--list-full", (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	struct cap_buf b;
	cap_buf_init(&b);
	for (;;) {
		uint8_t *w = cap_buf_reserve(&b, 4096);
		ssize_t n = read(p[0], w, 4096);
		if (n <= 0)
			break;
		cap_buf_commit(&b, (size_t)n);
	}
	close(p[0]);
	int status = 0;
	waitpid(pid, &status, 0);
	if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || cap_buf_used(&b) == 0) {
		cap_buf_fini(&b);
		return cap_err_set(err, ENOEXEC, "`%s --list-full` failed; is busybox-static installed? (scripts/bootstrap.sh)", busybox);
	}
	cap_buf_append(&b, "", 1);
	*out = (char *)b.owned_data;	/* off is 0: nothing was consumed */
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int cap_store_initramfs_write(const char *agent, const char *busybox,
			      const char *path, struct cap_err *err)
{
	struct cpio c = { .ino = 0 };
	_cleanup_free_ char *list = NULL;
	int r;

	if ((r = cap_store_busybox_applets(busybox, &list, err)) < 0)
		return r;
	cap_buf_init(&c.b);

	static const char *const dirs[] = {
		"bin", "dev", "dev/pts", "etc", "proc", "root", "run", "sbin",
		"sys", "tmp", "usr", "usr/bin", "usr/sbin", "work",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(dirs); i++)
		dir(&c, dirs[i], strcmp(dirs[i], "tmp") == 0 ? 01777 :
				 strcmp(dirs[i], "root") == 0 ? 0700 : 0755);
	entry(&c, "dev/console", S_IFCHR | 0600, 0, 0, NULL, 0, 5, 1);
	entry(&c, "dev/null", S_IFCHR | 0666, 0, 0, NULL, 0, 1, 3);
	entry(&c, "etc/passwd", S_IFREG | 0644, 0, 0, cap_store_passwd, strlen(cap_store_passwd), 0, 0);
	entry(&c, "etc/group", S_IFREG | 0644, 0, 0, cap_store_group, strlen(cap_store_group), 0, 0);
	if ((r = file(&c, "init", agent, 0755, err)) < 0 ||
	    (r = file(&c, "bin/busybox", busybox, 0755, err)) < 0)
		goto out;

	/* Applet links, in sorted order so the archive does not depend on
	 * the order busybox prints them in. */
	size_t n = 0, cap = 512;
	char **names = xmalloc(cap * sizeof(char *));
	char *tok_save = NULL;
	for (char *tok = strtok_r(list, "\n", &tok_save); tok; tok = strtok_r(NULL, "\n", &tok_save)) {
		while (*tok == '/')
			tok++;
		if (!*tok || strcmp(tok, "bin/busybox") == 0)
			continue;
		if (n == cap)
			names = xrealloc(names, (cap *= 2) * sizeof(char *));
		names[n++] = tok;
	}
	qsort(names, n, sizeof(char *), cmp_str);
	for (size_t i = 0; i < n; i++) {
		static const char target[] = "/bin/busybox";
		entry(&c, names[i], S_IFLNK | 0777, 0, 0, target, sizeof(target) - 1, 0, 0);
	}
	free(names);
	entry(&c, "TRAILER!!!", 0, 0, 0, NULL, 0, 0, 0);

	r = cap_write_file_atomic(path, cap_buf_head(&c.b), cap_buf_used(&c.b), 0644);
	if (r < 0)
		r = cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r));
out:
	cap_buf_fini(&c.b);
	return r;
}

/* The key of the last (agent, busybox) pair seen by this process, by
 * their identity on disk: a long-lived process (the controller, a bench)
 * hashes the binaries again only when one of them changed. */
static struct {
	struct stat agent, busybox;
	char agent_path[4096], busybox_path[4096];
	char hex[65];
} memo;

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* The same memo on disk, for short-lived processes (each `capsule run`
 * hashed ~3 MiB, about 5 ms): one file per pair of paths, holding the
 * identity of both files (ctime too: it cannot be set back) and the key.
 * The path of that file in *path (new string). */
static char *disk_memo(const char *agent, const char *busybox, const struct stat *sa,
		       const struct stat *sb, char **path)
{
	unsigned long long k = 1469598103934665603ull;
	const char *parts[] = { LAYOUT_VERSION, agent, busybox };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(parts); i++)
		for (const char *c = parts[i]; ; c++) {
			k = (k ^ (unsigned char)*c) * 1099511628211ull;
			if (!*c)
				break;
		}
	_cleanup_free_ char *cache = cap_cache_dir();
	*path = xasprintf("%s/initramfs/memo-%016llx", cache, k);
	const struct stat *st[] = { sa, sb };
	char *id = xstrdup("");
	for (size_t i = 0; i < 2; i++) {
		char *next = xasprintf("%s%llu %llu %lld %lld.%09ld %lld.%09ld\n", id,
				       (unsigned long long)st[i]->st_dev, (unsigned long long)st[i]->st_ino,
				       (long long)st[i]->st_size, (long long)st[i]->st_mtim.tv_sec,
				       st[i]->st_mtim.tv_nsec, (long long)st[i]->st_ctim.tv_sec,
				       st[i]->st_ctim.tv_nsec);
		free(id);
		id = next;
	}
	return id;
}

/* The key remembered in the disk memo for these two files, into hex. */
static bool disk_memo_get(const char *agent, const char *busybox, const struct stat *sa,
			  const struct stat *sb, char hex[65])
{
	_cleanup_free_ char *path = NULL, *text = NULL;
	_cleanup_free_ char *id = disk_memo(agent, busybox, sa, sb, &path);
	size_t n = strlen(id);
	if (cap_read_file(path, 4096, &text) != (ssize_t)(n + 65) || strncmp(text, id, n) != 0 ||
	    text[n + 64] != '\n')
		return false;
	for (size_t i = 0; i < 64; i++)
		if (!strchr("0123456789abcdef", text[n + i]) || !text[n + i])
			return false;
	memcpy(hex, text + n, 64);
	hex[64] = '\0';
	return true;
}

static void disk_memo_put(const char *agent, const char *busybox, const struct stat *sa,
			  const struct stat *sb, const char hex[65])
{
	_cleanup_free_ char *path = NULL;
	_cleanup_free_ char *id = disk_memo(agent, busybox, sa, sb, &path);
	_cleanup_free_ char *text = xasprintf("%s%s\n", id, hex);
	_cleanup_free_ char *dir = xstrdup(path);
	*strrchr(dir, '/') = '\0';
	if (cap_mkdir_p(dir, 0755) == 0)
		cap_write_file_atomic(path, text, strlen(text), 0644);
}

int cap_store_initramfs_path(const char *agent, const char *busybox,
			     char **out, struct cap_err *err)
{
	struct cap_sha256 h;
	char hex[65];
	struct stat sa, sb;
	int r;

	bool both = stat(agent, &sa) == 0 && stat(busybox, &sb) == 0;
	if (both && memo.hex[0] &&
	    strcmp(memo.agent_path, agent) == 0 && strcmp(memo.busybox_path, busybox) == 0 &&
	    same_file(&sa, &memo.agent) && same_file(&sb, &memo.busybox)) {
		_cleanup_free_ char *cache = cap_cache_dir();
		*out = xasprintf("%s/initramfs/%.32s.cpio", cache, memo.hex);
		return 0;
	}
	if (both && disk_memo_get(agent, busybox, &sa, &sb, hex)) {
		memo.agent = sa;
		memo.busybox = sb;
		snprintf(memo.agent_path, sizeof(memo.agent_path), "%s", agent);
		snprintf(memo.busybox_path, sizeof(memo.busybox_path), "%s", busybox);
		memcpy(memo.hex, hex, sizeof(hex));
		_cleanup_free_ char *cache = cap_cache_dir();
		*out = xasprintf("%s/initramfs/%.32s.cpio", cache, hex);
		return 0;
	}

	cap_sha256_init(&h);
	cap_sha256_update(&h, LAYOUT_VERSION, sizeof(LAYOUT_VERSION));
	if ((r = cap_sha256_update_file(&h, agent)) < 0 ||
	    (r = cap_sha256_update_file(&h, busybox)) < 0) {
		cap_sha256_final_hex(&h, hex);
		const char *what = access(agent, R_OK) == 0 ? busybox : agent;
		return cap_err_set(err, -r, "cannot read %s: %s%s", what, strerror(-r),
				   what == agent ? " (build it with `make`)" : " (install busybox-static: scripts/bootstrap.sh)");
	}
	cap_sha256_final_hex(&h, hex);
	if (stat(agent, &memo.agent) == 0 && stat(busybox, &memo.busybox) == 0) {
		snprintf(memo.agent_path, sizeof(memo.agent_path), "%s", agent);
		snprintf(memo.busybox_path, sizeof(memo.busybox_path), "%s", busybox);
		memcpy(memo.hex, hex, sizeof(hex));
		/* Only if neither changed while it was read. */
		if (both && same_file(&sa, &memo.agent) && same_file(&sb, &memo.busybox) &&
		    sa.st_ctim.tv_sec == memo.agent.st_ctim.tv_sec &&
		    sa.st_ctim.tv_nsec == memo.agent.st_ctim.tv_nsec &&
		    sb.st_ctim.tv_sec == memo.busybox.st_ctim.tv_sec &&
		    sb.st_ctim.tv_nsec == memo.busybox.st_ctim.tv_nsec)
			disk_memo_put(agent, busybox, &sa, &sb, hex);
	}
	_cleanup_free_ char *cache = cap_cache_dir();
	*out = xasprintf("%s/initramfs/%.32s.cpio", cache, hex);
	return 0;
}

int cap_store_initramfs(const char *agent, const char *busybox, char **out,
			bool *built, struct cap_err *err)
{
	char *path = NULL;
	int r = cap_store_initramfs_path(agent, busybox, &path, err);
	if (r < 0)
		return r;
	if (built)
		*built = false;
	if (access(path, R_OK) != 0) {
		_cleanup_free_ char *d = xstrdup(path);
		*strrchr(d, '/') = '\0';
		if ((r = cap_mkdir_p(d, 0755)) < 0) {
			r = cap_err_set(err, -r, "cannot create %s: %s", d, strerror(-r));
			free(path);
			return r;
		}
		if ((r = cap_store_initramfs_write(agent, busybox, path, err)) < 0) {
			free(path);
			return r;
		}
		if (built)
			*built = true;
	}
	*out = path;
	return 0;
}

static char *artefact(const char *env, const char *fallback, bool *exists)
{
	const char *e = getenv(env);
	char *p = e && *e ? xstrdup(e) : xstrdup(fallback);
	*exists = access(p, R_OK) == 0;
	return p;
}

char *cap_store_kernel_path(bool *exists)
{
	_cleanup_free_ char *cache = cap_cache_dir();
	_cleanup_free_ char *def = xasprintf("%s/vmlinux", cache);
	return artefact("CAPSULE_KERNEL", def, exists);
}

/* $env when set, else the first of the paths relative to the capsule
 * executable's directory that is there, else the first of them. */
static char *beside_exe(const char *env, const char *const *rel, size_t n, bool *exists)
{
	const char *e = getenv(env);
	if (e && *e)
		return artefact(env, e, exists);
	_cleanup_free_ char *dir = cap_exe_dir();
	_cleanup_free_ char *first = xasprintf("%s/%s", dir, rel[0]);
	for (size_t i = 1; i < n && access(first, R_OK) != 0; i++) {
		_cleanup_free_ char *p = xasprintf("%s/%s", dir, rel[i]);
		if (access(p, R_OK) == 0) {
			_cleanup_free_ char *real = realpath(p, NULL);
			return artefact(env, real ? real : p, exists);
		}
	}
	return artefact(env, first, exists);
}

char *cap_store_agent_path(bool *exists)
{
	static const char *const rel[] = { "capsule-agent", "../lib/capsule/capsule-agent" };
	return beside_exe("CAPSULE_AGENT", rel, 2, exists);
}

char *cap_store_kernel_builder(bool *exists)
{
	static const char *const rel[] = { "../guest/build-kernel.sh",
					   "../share/capsule/guest/build-kernel.sh" };
	return beside_exe("CAPSULE_KERNEL_BUILDER", rel, 2, exists);
}
