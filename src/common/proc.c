#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#define TAIL_LINES 8

char *cap_find_program(const char *name)
{
	const char *path = getenv("PATH");
	_cleanup_free_ char *copy = xstrdup(path && *path ? path : "/usr/bin:/bin");
	for (char *save = NULL, *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		_cleanup_free_ char *p = xasprintf("%s/%s", d, name);
		if (access(p, X_OK) == 0)
			return realpath(p, NULL);
	}
	return NULL;
}

int64_t cap_monotonic_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cap_run(char *const argv[], cap_progress_fn progress, void *ud,
	    struct cap_err *err)
{
	return cap_run_tick(argv, progress, ud, NULL, NULL, 0, err);
}

int cap_run_tick(char *const argv[], cap_progress_fn progress, void *ud,
		 void (*tick)(void *tick_ud), void *tick_ud, int tick_ms,
		 struct cap_err *err)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return cap_err_set(err, e, "fork: %s", strerror(e));
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		dup2(p[1], 1);
		dup2(p[1], 2);
		execvp(argv[0], argv);
		dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(p[1]);

	char tail[TAIL_LINES][256] = { { 0 } };
	int ntail = 0;
	char line[4096];
	size_t len = 0;
	char buf[4096];
	ssize_t n;
	int64_t next = tick ? cap_monotonic_ms() + tick_ms : 0;
	for (;;) {
		if (tick) {
			/* Between lines: the caller's look at the work, every
			 * tick_ms while the program runs. */
			int64_t now = cap_monotonic_ms();
			if (now >= next) {
				tick(tick_ud);
				next = now + tick_ms;
			}
			struct pollfd pfd = { .fd = p[0], .events = POLLIN };
			int k = poll(&pfd, 1, (int)(next - now > 0 ? next - now : 0));
			if (k == 0 || (k < 0 && errno == EINTR))
				continue;
		}
		n = read(p[0], buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			bool end = buf[i] == '\n' || buf[i] == '\r';
			if (!end && len < sizeof(line) - 1) {
				line[len++] = buf[i];
				continue;
			}
			if (!end)
				continue;
			line[len] = '\0';
			if (len) {
				if (progress)
					progress(ud, line);
				snprintf(tail[ntail % TAIL_LINES], sizeof(tail[0]), "%.255s", line);
				ntail++;
			}
			len = 0;
		}
	}
	if (len) {
		line[len] = '\0';
		if (progress)
			progress(ud, line);
		snprintf(tail[ntail % TAIL_LINES], sizeof(tail[0]), "%.255s", line);
		ntail++;
	}
	close(p[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;

	char out[800] = "";
	size_t used = 0;
	int first = ntail > TAIL_LINES ? ntail - TAIL_LINES : 0;
	for (int i = first; i < ntail && used < sizeof(out) - 1; i++)
		used += (size_t)snprintf(out + used, sizeof(out) - used, "\n  %s", tail[i % TAIL_LINES]);
	if (used >= sizeof(out))
		used = sizeof(out) - 1;
	if (WIFEXITED(status))
		return cap_err_set(err, EIO, "%s failed with status %d%s", argv[0],
				   WEXITSTATUS(status), out);
	return cap_err_set(err, EIO, "%s was killed by signal %d%s", argv[0],
			   WTERMSIG(status), out);
}

void cap_progress_relay_line(void *relay, const char *line)
{
	const struct cap_progress_relay *r = relay;
	if (!r->fn)
		return;
	/* Lines of any length pass whole: the front end cuts them. */
	_cleanup_free_ char *d = xasprintf(CAP_PROGRESS_DETAIL "%s", line);
	r->fn(r->ud, d);
}

void cap_child_keep_fd3(int fd)
{
	if (fd != 3) {
		dup2(fd, 3);
		close(fd);
	}
	syscall(SYS_close_range, 4U, ~0U, 0U);
}

int cap_run_capture(char *const argv[], struct cap_buf *out, size_t max,
		    struct cap_buf *errout, int *status, struct cap_err *err)
{
	return cap_run_capture_until(argv, out, max, errout, status, 0, err);
}

int cap_run_capture_until(char *const argv[], struct cap_buf *out, size_t max,
			  struct cap_buf *errout, int *status, int64_t deadline_ms,
			  struct cap_err *err)
{
	int po[2] = { -1, -1 }, pe[2] = { -1, -1 };
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int r;
	if ((out && pipe2(po, O_CLOEXEC) < 0) || pipe2(pe, O_CLOEXEC) < 0) {
		r = cap_err_set(err, errno, "pipe: %s", strerror(errno));
		goto close;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	if (out)
		posix_spawn_file_actions_adddup2(&fa, po[1], 1);
	posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
	r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r != 0) {
		r = cap_err_set(err, r, "cannot run %s: %s", argv[0], strerror(r));
		goto close;
	}
	if (out) {
		close(po[1]);
		po[1] = -1;
	}
	close(pe[1]);
	pe[1] = -1;
	struct pollfd pfd[2] = { { .fd = pe[0], .events = POLLIN }, { .fd = out ? po[0] : -1, .events = POLLIN } };
	bool late = false;
	while (pfd[0].fd >= 0 || pfd[1].fd >= 0) {
		int wait = -1;
		if (deadline_ms && !late) {
			int64_t left = deadline_ms - cap_monotonic_ms();
			if (left <= 0) {
				/* Its descriptors close with it (a grandchild
				 * holding them is its own business: stop reading). */
				kill(pid, SIGKILL);
				late = true;
				break;
			}
			wait = (int)CAP_MIN(left, 60000);
		}
		int k = poll(pfd, 2, wait);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (k == 0)
			continue;
		for (int i = 0; i < 2; i++) {
			if (pfd[i].fd < 0 || !pfd[i].revents)
				continue;
			char buf[65536];
			ssize_t n = read(pfd[i].fd, buf, sizeof(buf));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				pfd[i].fd = -1;
				continue;
			}
			struct cap_buf *b = i == 0 ? errout : out;
			size_t keep = i == 0 ? 65536 : max;
			if (b && cap_buf_used(b) < keep)
				cap_buf_append(b, buf, CAP_MIN((size_t)n, keep - cap_buf_used(b)));
		}
	}
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
	r = late ? cap_err_set(err, ETIMEDOUT, "%s did not end in time; it was killed", argv[0]) : 0;
close:
	for (int i = 0; i < 2; i++) {
		if (po[i] >= 0)
			close(po[i]);
		if (pe[i] >= 0)
			close(pe[i]);
	}
	return r;
}
