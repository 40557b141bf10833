/* Running a helper program (mkfs.erofs, mke2fs, debootstrap) with its
 * output turned into progress lines and, on failure, into the error. */
#ifndef CAP_PROC_H
#define CAP_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "err.h"

/* Progress of long work, one line at a time, without the newline; line
 * is borrowed for the call. cap_run calls it for each line the program
 * prints (stdout and stderr merged), as they are.
 *
 * Progress lines that go to a front end come in two kinds:
 * - a phase line says what the work is doing now ("staging the busybox
 *   root", "copying the project into /workspace"); it never starts with
 *   a space;
 * - a detail line is one line of a helper program's output (debootstrap,
 *   mkfs) during the current phase: CAP_PROGRESS_DETAIL then the line.
 * A front end shows detail lines only where it can overwrite them (one
 * updating line on a terminal) and drops them elsewhere: a failure's
 * error already carries the program's last lines (cap_run). One that
 * knows nothing of this convention still prints something readable:
 * the details indented under their phase. */
typedef void (*cap_progress_fn)(void *ud, const char *line);

#define CAP_PROGRESS_DETAIL "  "

/* Whether line is a detail line (its text follows the marker). */
static inline bool cap_progress_is_detail(const char *line)
{
	return line[0] == ' ' && line[1] == ' ';
}

/* Where cap_run sends a helper program's lines as detail lines: to fn
 * with ud, each prefixed by CAP_PROGRESS_DETAIL. Pass
 * cap_progress_relay_line as cap_run's progress and the relay as its
 * ud; a relay with fn NULL drops them. */
struct cap_progress_relay {
	cap_progress_fn fn;
	void *ud;
};
void cap_progress_relay_line(void *relay, const char *line);

/* Run argv (argv[0] looked up in PATH) with stdin from /dev/null. 0 when
 * it exits 0; otherwise -errno with err naming the program, how it ended
 * and its last lines of output. progress may be NULL. */
int cap_run(char *const argv[], cap_progress_fn progress, void *ud,
	    struct cap_err *err);

/* cap_run, calling tick(tick_ud) every tick_ms while the program runs
 * (between its lines, never during a progress call): a caller watching
 * what the program makes (files growing) reports it from there. */
int cap_run_tick(char *const argv[], cap_progress_fn progress, void *ud,
		 void (*tick)(void *tick_ud), void *tick_ud, int tick_ms,
		 struct cap_err *err);

/* CLOCK_MONOTONIC in milliseconds: what deadlines are given in. */
int64_t cap_monotonic_ms(void);

/* The program name would run as, looked up in PATH like execvp: its
 * real path, a new string; NULL when it is not there. */
char *cap_find_program(const char *name);

/* In a child that is to carry nothing of its parent: make fd its
 * descriptor 3 and close every descriptor above (0 to 2 are left alone). */
void cap_child_keep_fd3(int fd);

/* Run a host program (argv[0] looked up in PATH, never through a shell)
 * with stdin from /dev/null. Its stdout goes into out (at most max bytes
 * kept, the rest read and dropped) or, when out is NULL, to the
 * caller's stdout (flush stdio first); its stderr into errout (at most
 * 64 KiB kept; NULL: dropped). *status is its wait status. 0, or -errno
 * with err set when it could not be run. */
int cap_run_capture(char *const argv[], struct cap_buf *out, size_t max,
		    struct cap_buf *errout, int *status, struct cap_err *err);

/* The same, the program killed (SIGKILL) once cap_monotonic_ms() reaches
 * deadline_ms (0: never): -ETIMEDOUT then, with what it printed so far
 * in out and errout. */
int cap_run_capture_until(char *const argv[], struct cap_buf *out, size_t max,
			  struct cap_buf *errout, int *status, int64_t deadline_ms,
			  struct cap_err *err);

#endif
