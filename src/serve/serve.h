/* The JSON-RPC 2.0 front end of the controller (docs/serve.md): a unix
 * socket, one message per line. It builds and reads the JSON; the core
 * behind it deals in typed requests and results. Also the client side of
 * the same protocol, for the front ends and CLI verbs that reach a
 * controller running in another process. */
#ifndef CAP_SERVE_H
#define CAP_SERVE_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "controller.h"
#include "err.h"

/* `capsule serve`: take the home, listen on socket_path (NULL:
 * CAPSULE_HOME/serve.sock) or on the socket a service manager passed
 * (LISTEN_PID, LISTEN_FDS: cap_unix_activated), and with metrics_addr
 * (NULL: none) serve GET /metrics there (docs/serve.md, "Metrics"; the
 * address is checked and bound first, so a bad one fails at once);
 * serve until SIGTERM or SIGINT. */
int cap_serve_run(struct cap_controller_cfg *cfg, const char *socket_path,
		  const char *metrics_addr, struct cap_err *err);

/* The method table as JSON, for `capsule serve --schema` and the clients
 * checked against it (docs/serve.md, "The method table"): {"protocol",
 * "methods": {NAME: {"params": {PARAM: {"type", "required"[,
 * "tolerated"]}}[, "one_of": [A, B]][, "test_only": true]}}}. A new
 * reference. */
json_t *cap_serve_schema(void);

struct cap_rpc_server;
/* Listen on path for controller c (one server per socket path: a lock
 * file beside it); *out is owned by the caller and freed after c's loop. */
int cap_rpc_server_new(struct cap_ctl *c, const char *path,
		       struct cap_rpc_server **out, struct cap_err *err);
/* The same on a listening socket fd handed over (socket activation,
 * cap_unix_activated) and bound to path: fd is owned by the server from
 * then on (also on failure) and path is never unlinked by it. */
int cap_rpc_server_adopt(struct cap_ctl *c, int fd, const char *path,
			 struct cap_rpc_server **out, struct cap_err *err);
void cap_rpc_server_free(struct cap_rpc_server *s);

/* The typed result of an answer to a tool method (exec, read_file,
 * list_directory, write_file, upload, download with "to", stop, remove),
 * with the private import it carries: strings point into answer
 * (borrowed), entries and lists into *owned (free() it after use). */
void cap_rpc_result_parse(json_t *answer, enum cap_ctl_kind kind,
			  struct cap_ctl_result *out, void **owned);

/* The private import's outcome as the methods' answers carry it
 * ("import": docs/serve.md). A new reference. */
json_t *cap_rpc_import_json(const struct cap_ctl_import *imp);

struct cap_tree_change;	/* src/tree/tree.h */
/* What a sandbox's /workspace changed since its base, as `capsule diff
 * --json` prints it and serve's diff answers it (docs/workspace.md):
 * {"sandbox": sandbox, "changes": [{"path", "change", "type", "mode",
 * "old_mode", "size", "sha256"[, "old_type", "target",
 * "path_escaped"]}...]}. ch (n of them) is borrowed. A new reference. */
json_t *cap_rpc_diff_json(const char *sandbox, const struct cap_tree_change *ch, size_t n);

/* What a preparation found or made, as serve's prepare answers it and
 * `capsule prepare --json` prints it (docs/serve.md): {"prepared": true,
 * "built": [phases], "kernel", "initramfs", "image": {"name", "digest"},
 * "template", "duration_ms"}. A new reference. */
json_t *cap_rpc_prepare_json(const struct cap_prep_out *o);

struct cap_image_check;	/* src/store/store.h */
/* What `capsule image check --json` prints and serve's image_check
 * answers (docs/images.md, "Checking a reference"): {"reference",
 * "registry_digest", "media_type", "index", "platforms", "platform",
 * "platform_digest", "manifest_media_type", "config": {"digest",
 * "media_type", "size_bytes", "os", "architecture", "variant",
 * "entrypoint", "cmd", "env", "working_dir", "user"}, "layer_count",
 * "compressed_bytes", "layers": [{"digest", "media_type",
 * "size_bytes"}]}. A new reference. */
json_t *cap_rpc_image_check_json(const struct cap_image_check *c);
/* The data of a failed check's error: {"reference", "reason" (the word
 * of cap_store_check_reason), "errno", "retryable"}. A new reference. */
json_t *cap_rpc_check_error_data(int r, const char *ref);

/* A tool call for the core (exec, or a FILE read, list or write) as the
 * serve request that asks a controller in another process for the same
 * (capsule mcp's remote mode): *method the method's name (static), the
 * params a new reference. agent, peer and req are borrowed. */
json_t *cap_rpc_request_params(const char *agent, const char *peer,
			       const struct cap_ctl_req *req, const char **method);

/* One request and its answer, synchronously (the CLI): connect to socket,
 * send method with params (stolen), wait up to timeout_ms. The result is
 * a new reference; a JSON-RPC error becomes -EIO with its message. */
int cap_rpc_call(const char *socket, const char *method, json_t *params,
		 int timeout_ms, json_t **result, struct cap_err *err);

/* The same, with each notification the server sends before the answer
 * (method and params borrowed for the call) handed to notify (may be
 * NULL): timeout_ms then counts from the last message. A JSON-RPC error
 * is -EIO with its message and *error_data (may be NULL) its data, a
 * new reference, when it has one. */
typedef void (*cap_rpc_notify_fn)(void *ud, const char *method, json_t *params);
int cap_rpc_call_notify(const char *socket, const char *method, json_t *params,
			int timeout_ms, cap_rpc_notify_fn notify, void *ud,
			json_t **result, json_t **error_data, struct cap_err *err);

#endif
