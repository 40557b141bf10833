/* Control-plane errors: a code plus a message naming the path or value at
 * fault and what to do (crun's libcrun_error_t). Filled only on failure. */
#ifndef CAP_ERR_H
#define CAP_ERR_H

struct cap_err {
	int code;	/* positive errno-style code, 0 when unset */
	char msg[1024];
};

/* Record an error in err (which may be NULL) and return -code, so that
 * callers can write `return cap_err_set(err, EINVAL, "...")`. */
__attribute__((format(printf, 3, 4))) int cap_err_set(struct cap_err *err,
							int code,
							const char *fmt, ...);

/* Prefix an existing message with more context ("starting QEMU: ..."). */
__attribute__((format(printf, 2, 3))) void
cap_err_prefix(struct cap_err *err, const char *fmt, ...);

#endif
