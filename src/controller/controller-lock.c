/* The home lock: one controller per CAPSULE_HOME, and what others read
 * of its holder (pid, front end, socket). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "controller-state.h"
#include "paths.h"
#include "util.h"

/* --- the home lock ------------------------------------------------------------- */

static char *lock_path(const char *home)
{
	return xasprintf("%s/controller.lock", home);
}

static void read_holder(int fd, struct cap_ctl_holder *out)
{
	char text[512];
	ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
	memset(out, 0, sizeof(*out));
	text[n > 0 ? n : 0] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "pid ", 4) == 0)
			out->pid = (pid_t)strtol(line + 4, NULL, 10);
		else if (strncmp(line, "frontend ", 9) == 0)
			snprintf(out->frontend, sizeof(out->frontend), "%s", line + 9);
		else if (strncmp(line, "socket ", 7) == 0)
			snprintf(out->socket, sizeof(out->socket), "%s", line + 7);
	}
}

int cap_ctl_holder(struct cap_ctl_holder *out)
{
	_cleanup_free_ char *home = cap_home_dir();
	_cleanup_free_ char *path = lock_path(home);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (flock(fd, LOCK_SH | LOCK_NB) == 0)
		return 0;	/* nobody holds it (closing fd drops ours) */
	if (errno != EWOULDBLOCK)
		return -errno;
	/* The holder writes its details right after taking the lock. */
	for (int i = 0; i < 50; i++) {
		read_holder(fd, out);
		if (out->pid > 0)
			break;
		usleep(10000);
	}
	return 1;
}

/* What others read of the holder: pid, front end, socket. */
static int write_holder(struct cap_ctl *c, const char *socket, struct cap_err *err)
{
	char text[512];
	int n = snprintf(text, sizeof(text), "pid %d\nfrontend %s\nsocket %s\n", (int)getpid(),
			 c->cfg.frontend ? c->cfg.frontend : "serve", socket ? socket : "");
	if (ftruncate(c->lock_fd, 0) < 0 || pwrite(c->lock_fd, text, (size_t)n, 0) != n)
		return cap_err_set(err, errno, "cannot write %s/controller.lock: %s", c->home, strerror(errno));
	return 0;
}

int ctl_take_lock(struct cap_ctl *c, struct cap_err *err)
{
	_cleanup_free_ char *path = lock_path(c->home);
	c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (c->lock_fd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	if (flock(c->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		struct cap_ctl_holder h;
		read_holder(c->lock_fd, &h);
		return cap_err_set(err, EBUSY,
				   "another controller owns %s: capsule %s, pid %d%s%s. One controller per CAPSULE_HOME: use that one (capsule mcp becomes its client by itself), stop it, or give this one another CAPSULE_HOME",
				   c->home, h.frontend[0] ? h.frontend : "serve or mcp", (int)h.pid,
				   h.socket[0] ? ", socket " : "", h.socket);
	}
	return write_holder(c, c->cfg.socket_path, err);
}

int cap_ctl_set_socket(struct cap_ctl *c, const char *path, struct cap_err *err)
{
	return write_holder(c, path, err);
}

struct mapped_ctx {
	const char *sandbox;
	bool found;
};

static void mapped_one(void *ud, const char *agent, const char *peer, const char *sandbox)
{
	struct mapped_ctx *m = ud;
	(void)agent, (void)peer;
	m->found |= strcmp(sandbox, m->sandbox) == 0;
}

int cap_ctl_owner_of(const char *sandbox, struct cap_ctl_holder *out)
{
	int held = cap_ctl_holder(out);
	if (held <= 0)
		return held;
	_cleanup_free_ char *home = cap_home_dir();
	struct mapped_ctx m = { sandbox, false };
	ctl_idrec_each(home, mapped_one, &m);
	return m.found;
}
