/* One log sink for library code (crun's output handler): a library never
 * prints; it hands lines to the sink its front end installed, and the
 * front end decides where they go and with which prefix. */
#ifndef CAP_LOG_H
#define CAP_LOG_H

enum cap_log_level { CAP_LOG_ERROR, CAP_LOG_WARN, CAP_LOG_INFO };

/* Receives one line (no trailing newline), borrowed for the call. */
typedef void (*cap_log_fn)(void *ud, enum cap_log_level level, const char *line);

/* Install the process's sink; NULL drops lines. ud is borrowed until the
 * next call. */
void cap_log_set(cap_log_fn fn, void *ud);

__attribute__((format(printf, 2, 3))) void cap_log(enum cap_log_level level,
						    const char *fmt, ...);

/* The sink of the command-line front ends: "capsule <ud>: line" on
 * stderr, ud being the front end's name as a string ("serve", "mcp",
 * "shim v-..."). */
void cap_log_stderr(void *ud, enum cap_log_level level, const char *line);

#endif
