/* FILE: one path inside one of the guest's data roots, opened beneath it
 * as the tool user: LIST, READ and WRITE answered here; MANIFEST, TAR_OUT
 * and TAR_IN started as a child (agent-xfer.c). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent-internal.h"
#include "layout.h"
#include "proto.h"
#include "util.h"

/* Fail a FILE stream: a line on STDERR naming the path and the rule, then
 * EXIT "could not start" with the errno. */
static void file_fail(uint32_t id, int e, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(msg, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if ((size_t)m > sizeof(msg) - 2)
		m = sizeof(msg) - 2;
	msg[m++] = '\n';
	cap_proto_put(&A.out, CAP_MSG_STDERR, id, msg, (size_t)m);
	struct cap_exit ex = { .kind = CAP_EXIT_START_FAILED, .value = e > 0 && e < 4096 ? e : EIO };
	cap_proto_exit_encode(&A.out, id, &ex);
}

/* WRITE with CAP_FILE_PRIVATE, as the tool user: each missing directory
 * of path made 0700 and opened beneath rootfd (no symlink followed), the
 * content written to a temporary name beside the file, made 0600 and
 * renamed over it. 0 or an errno. */
static int write_private(int rootfd, const char *path, const uint8_t *data, size_t len)
{
	char part[PATH_MAX];
	int dir = dup(rootfd), e = 0;
	const char *p = path;
	setfsgid(A.cmd_gid);
	setfsuid(A.cmd_uid);
	for (const char *slash; dir >= 0 && (slash = strchr(p, '/'));) {
		size_t n = (size_t)(slash - p);
		if (n == 0 || n >= sizeof(part)) {
			e = EINVAL;
			break;
		}
		memcpy(part, p, n);
		part[n] = '\0';
		if (mkdirat(dir, part, 0700) < 0 && errno != EEXIST) {
			e = errno;
			break;
		}
		struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
					.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
		int next = (int)syscall(SYS_openat2, dir, part, &how, sizeof(how));
		if (next < 0) {
			e = errno == ELOOP ? EXDEV : errno;
			break;
		}
		close(dir);
		dir = next;
		p = slash + 1;
	}
	if (dir < 0 && !e)
		e = errno;
	char tmp[PATH_MAX + 32];
	if (!e && (!*p || strlen(p) + 20 >= sizeof(tmp)))
		e = EINVAL;
	if (!e) {
		snprintf(tmp, sizeof(tmp), ".%s.capsule-%d", p, (int)getpid());
		int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0) {
			e = errno;
		} else {
			int r = cap_write_all(fd, data, len);
			if (r == 0 && fchmod(fd, 0600) < 0)
				r = -errno;
			if (r == 0 && fsync(fd) < 0)
				r = -errno;
			close(fd);
			if (r == 0 && renameat(dir, tmp, dir, p) < 0)
				r = -errno;
			if (r < 0) {
				unlinkat(dir, tmp, 0);
				e = -r;
			}
		}
	}
	setfsuid(0);
	setfsgid(0);
	if (dir >= 0)
		close(dir);
	return e;
}

static void put_chunked(uint32_t id, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t k = CAP_MIN(n, (size_t)(32 * 1024));
		cap_proto_put(&A.out, CAP_MSG_STDOUT, id, p, k);
		p += k;
		n -= k;
	}
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void file_list(uint32_t id, int fd, const char *shown, uint32_t max)
{
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		file_fail(id, errno, "cannot list %s: %s", shown, strerror(errno));
		return;
	}
	size_t n = 0, cap = 64;
	char **names = xmalloc(cap * sizeof(char *));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (n == cap)
			names = xrealloc(names, (cap *= 2) * sizeof(char *));
		names[n++] = xstrdup(e->d_name);
	}
	qsort(names, n, sizeof(char *), cmp_cstr);
	struct cap_buf b;
	cap_buf_init(&b);
	for (size_t i = 0; i < n && i < max; i++) {
		struct stat st;
		char line[600];
		int m;
		for (char *c = names[i]; *c; c++)
			if (*c == '\n')
				*c = '?';
		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			m = snprintf(line, sizeof(line), "o %s\n", names[i]);
		else if (S_ISDIR(st.st_mode))
			m = snprintf(line, sizeof(line), "d %s\n", names[i]);
		else if (S_ISREG(st.st_mode))
			m = snprintf(line, sizeof(line), "f %lld %s\n", (long long)st.st_size, names[i]);
		else if (S_ISLNK(st.st_mode))
			m = snprintf(line, sizeof(line), "l %s\n", names[i]);
		else
			m = snprintf(line, sizeof(line), "o %s\n", names[i]);
		cap_buf_append(&b, line, (size_t)CAP_MIN(m, (int)sizeof(line) - 1));
	}
	closedir(d);
	put_chunked(id, cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 1, .flags = n > max ? CAP_EXIT_TRUNCATED : 0 };
	cap_proto_exit_encode(&A.out, id, &ex);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

static void file_read(uint32_t id, int fd, const char *shown, uint32_t limit)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		file_fail(id, errno, "cannot read %s: %s", shown, strerror(errno));
		return;
	}
	if ((uint64_t)st.st_size > limit) {
		file_fail(id, EFBIG, "%s is %lld bytes, over the %u-byte limit for reading a file",
			  shown, (long long)st.st_size, limit);
		return;
	}
	uint8_t *buf = xmalloc((size_t)limit + 1);
	size_t len = 0;
	for (;;) {
		ssize_t k = read(fd, buf + len, (size_t)limit + 1 - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			free(buf);
			file_fail(id, errno, "cannot read %s: %s", shown, strerror(errno));
			return;
		}
		if (k == 0 || (len += (size_t)k) > limit)
			break;
	}
	if (len > limit) {	/* it grew while we read it */
		free(buf);
		file_fail(id, EFBIG, "%s is over the %u-byte limit for reading a file", shown, limit);
		return;
	}
	put_chunked(id, buf, len);
	free(buf);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
	cap_proto_exit_encode(&A.out, id, &ex);
}

/* --- the streaming operations ------------------------------------------ */

/* A streaming operation's run in the child: say it started, do it. */
static void run_xfer(const void *ud, int errfd, struct start_failure *f)
{
	(void)f;
	close(errfd);
	agent_xfer_run(ud);
}

/* MANIFEST, TAR_OUT, TAR_IN: a child as the tool user in its own cgroup,
 * answered like a command (no timeout, no output cap). */
static void file_stream(uint32_t id, const struct cap_file_req *req, const char *shown)
{
	uint32_t known = req->op == CAP_FILE_TAR_OUT ? CAP_TAR_PATHS_STDIN | CAP_TAR_PREFIX :
			 req->op == CAP_FILE_TAR_IN ? CAP_TAR_NO_REPLACE | CAP_FILE_NO_SYNC | CAP_TAR_OWNERS : 0;
	if (req->limit & ~known) {
		file_fail(id, EINVAL, "%s: unknown flags 0x%x for this file operation", shown, req->limit);
		return;
	}
	/* The containers' roots take only an upload that keeps owners (as
	 * root), and nothing else does. */
	bool roots = cap_guest_file_root(req->root)->attr & CAP_GUEST_ROOTS;
	bool owners = req->op == CAP_FILE_TAR_IN && (req->limit & CAP_TAR_OWNERS);
	if (roots != owners) {
		file_fail(id, EPERM, "%s: %s", shown,
			  roots ? "a pod's container roots take only TAR_IN with CAP_TAR_OWNERS"
				: "CAP_TAR_OWNERS is for the container roots only (" CAP_GUEST_CONTAINERS ")");
		return;
	}
	if (req->op == CAP_FILE_TAR_IN && !(cap_guest_file_root(req->root)->attr & CAP_GUEST_WRITABLE)) {
		file_fail(id, EROFS, "%s: only " CAP_GUEST_WORK " and " CAP_GUEST_WORKSPACE " can be written", shown);
		return;
	}
	struct exec *x = free_slot();
	if (!x) {
		file_fail(id, EBUSY, "%s: too many commands and transfers running (%d)", shown,
			  CAP_PROTO_MAX_STREAMS);
		return;
	}
	static const struct cap_exec_req root_user = { .flags = CAP_EXEC_USER };
	struct spawn sp = {
		.user = owners ? &root_user : NULL,
		.stdin_pipe = req->op == CAP_FILE_TAR_IN ||
			      (req->op == CAP_FILE_TAR_OUT && (req->limit & CAP_TAR_PATHS_STDIN)),
		.name = shown, .cwd = "/", .run = run_xfer, .ud = req,
		/* Only an upload writes: the reads report at once. */
		.no_sync = req->op != CAP_FILE_TAR_IN || (req->limit & CAP_FILE_NO_SYNC),
	};
	spawn(id, x, &sp);
}

/* --- FILE ------------------------------------------------------------ */

void handle_file(uint32_t id, const uint8_t *p, size_t n)
{
	struct cap_file_req req;
	char root[32], path[4100], shown[4200];
	if (id == 0 || exec_find(id) || agent_durable_waiting(id)) {
		send_error(id, EINVAL, "stream id %u is zero or already in use", id);
		return;
	}
	if (cap_proto_file_decode(p, n, &req, root, sizeof(root), path, sizeof(path)) < 0) {
		send_error(id, EBADMSG, "malformed FILE request (the root must be " CAP_GUEST_SOURCE ", " CAP_GUEST_WORK " or "
			   CAP_GUEST_WORKSPACE ", the path relative without '..')");
		return;
	}
	snprintf(shown, sizeof(shown), "%s/%s", root, path);
	if (req.op >= CAP_FILE_MANIFEST) {
		snprintf(shown, sizeof(shown), "%s%s%s", root, *path ? "/" : "", path);
		file_stream(id, &req, shown);
		return;
	}
	if (cap_guest_file_root(root)->attr & CAP_GUEST_ROOTS) {
		file_fail(id, EPERM, "%s: a pod's container roots take only TAR_IN with CAP_TAR_OWNERS", shown);
		return;
	}
	if (req.op == CAP_FILE_WRITE && !(cap_guest_file_root(root)->attr & CAP_GUEST_HOME)) {
		file_fail(id, EROFS, "%s: only " CAP_GUEST_WORK " can be written", shown);
		return;
	}
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		file_fail(id, errno, "%s is not available in this sandbox: %s", root, strerror(errno));
		return;
	}
	uint64_t since = agent_durable_seq();	/* a WRITE's writes come after this */
	if (req.op == CAP_FILE_WRITE && (req.limit & CAP_FILE_PRIVATE)) {
		int e = write_private(rootfd, path, req.data, req.len);
		close(rootfd);
		if (e) {
			file_fail(id, e, e == EXDEV ? "%s resolves outside its root (through '..' or a symbolic link)"
						    : "cannot write %s: %s", shown, strerror(e));
			return;
		}
		struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
		agent_durable_exit(&A.out, id, &ex, !(req.limit & CAP_FILE_NO_SYNC), others_running(NULL), since);
		return;
	}
	/* Resolve beneath the root, as the tool user: no "..", no absolute
	 * or out-of-root symlink, no magic links, the user's permissions. */
	struct open_how how = {
		.flags = req.op == CAP_FILE_WRITE ? O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC
						 : O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
		.mode = req.op == CAP_FILE_WRITE ? 0644 : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	setfsgid(A.cmd_gid);
	setfsuid(A.cmd_uid);
	int fd = (int)syscall(SYS_openat2, rootfd, *path ? path : ".", &how, sizeof(how));
	int e = errno;
	setfsuid(0);
	setfsgid(0);
	close(rootfd);
	if (fd < 0) {
		if (e == EXDEV)
			file_fail(id, e, "%s resolves outside %s (through '..' or a symbolic link); paths must stay inside their root",
				  shown, root);
		else
			file_fail(id, e, "cannot open %s: %s", shown, strerror(e));
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		e = errno;
		close(fd);
		file_fail(id, e, "cannot stat %s: %s", shown, strerror(e));
		return;
	}
	if (req.op == CAP_FILE_WRITE) {
		int r = S_ISREG(st.st_mode) ? cap_write_all(fd, req.data, req.len) : -EINVAL;
		close(fd);
		if (r < 0) {
			file_fail(id, -r, "cannot write %s: %s", shown, strerror(-r));
			return;
		}
		struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
		agent_durable_exit(&A.out, id, &ex, !(req.limit & CAP_FILE_NO_SYNC), others_running(NULL),
				   since);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		file_list(id, fd, shown, req.limit_entries);
		return;
	}
	if (req.op == CAP_FILE_LIST) {
		close(fd);
		file_fail(id, ENOTDIR, "%s is not a directory", shown);
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		file_fail(id, EINVAL, "%s is not a regular file or a directory", shown);
		return;
	}
	file_read(id, fd, shown, req.limit);
	close(fd);
}
