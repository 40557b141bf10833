/* A secret's value and placeholder (docs/network.md, "Secrets"): what
 * the sandbox's owner does at each start with the declarations of
 * policy.h. The value is read on the host, handed to the policy process
 * and to nothing else: never to the guest, a record, a log or an error
 * message. */
#ifndef CAP_NET_SECRET_H
#define CAP_NET_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "policy.h"

/* "capsule-ph-" and 40 lowercase hex digits: fixed length, ASCII, never
 * a real credential's shape. */
#define CAP_NET_PLACEHOLDER_PREFIX "capsule-ph-"
#define CAP_NET_PLACEHOLDER_LEN 51
/* A value's bounds: long enough that replacing it in responses cannot
 * garble ordinary text, short enough for one header line. */
#define CAP_NET_SECRET_VALUE_MIN 8
#define CAP_NET_SECRET_VALUE_MAX 8192

/* Read s's value from its source, now: env:VAR from this process's
 * environment, file:PATH (at most CAP_NET_SECRET_VALUE_MAX bytes, one
 * trailing "\n" or "\r\n" dropped). *value is new (wipe it with
 * cap_net_secret_wipe). Refused, with err naming the secret and its
 * source (never the value): unset or missing (-ENOENT), shorter than
 * CAP_NET_SECRET_VALUE_MIN or longer than the max (-EINVAL, -E2BIG), a
 * control character or DEL in it (-EINVAL: it goes into header lines),
 * or a value holding a placeholder (-EINVAL). */
int cap_net_secret_value(const struct cap_net_secret *s, char **value, size_t *len,
			 struct cap_err *err);
/* The checks of cap_net_secret_value on a value read elsewhere (what
 * names where, for messages): 0, -E2BIG or -EINVAL. */
int cap_net_secret_check(const struct cap_net_secret *s, const char *what, const char *v, size_t n,
			 struct cap_err *err);
/* Zero and free a value. */
void cap_net_secret_wipe(char *value, size_t len);
/* Wipe the variable s's env:VAR source names from this process's
 * environment: its value's bytes zeroed where they are (so that
 * /proc/PID/environ loses them too), then the variable unset. Nothing
 * for file:. For a sandbox's owner once its policy process has the
 * value: a later start in this process cannot read it again. */
void cap_net_secret_forget_source(const struct cap_net_secret *s);

/* The placeholder of secret name in the sandbox whose CA certificate has
 * this SHA-256 fingerprint: stable for the CA's life (a named sandbox
 * keeps its CA: its placeholders survive restarts), different in every
 * sandbox. out gets CAP_NET_PLACEHOLDER_LEN bytes and a NUL. */
void cap_net_secret_placeholder(const uint8_t fp[32], const char *name,
				char out[CAP_NET_PLACEHOLDER_LEN + 1]);

#endif
