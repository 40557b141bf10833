/**
 * The serve methods, written once: the table METHODS (each method's wire
 * name, the Client method that calls it, its positional arguments and
 * the options it sends as params), each method's options, and the typed
 * methods, which send only the options their table entry names.
 * tests/integration/test-serve-schema.py checks the table and what the
 * methods send against `capsule serve --schema`.
 *
 * Adding a serve method: an entry in METHODS, its options interface and
 * its line in the checks below, a method in Methods, its result type in
 * types.ts.
 */
import { InvalidParams } from "./errors.js";
import {
  type DiffResult,
  type DirectoryListing,
  type DownloadResult,
  type ExecResult,
  type FileResult,
  type IdentityLike,
  type ImageCheck,
  type LifecycleResult,
  type MergeResult,
  type PrepareResult,
  type Progress,
  type SandboxList,
  type ServerInfo,
  type Size,
  type SizeResult,
  type ForkResult,
  type SnapshotResult,
  type Status,
  type UploadResult,
  type WriteResult,
  identityJson,
} from "./types.js";

/** At most this many bytes of file content in an inline upload or download (docs/serve.md). */
export const INLINE_MAX = 16 * 1024 * 1024;
/** The longest request line the server reads, newline excluded. */
export const LINE_MAX = 24 * 1024 * 1024;

/**
 * Every serve method this client calls (`_test.advance`, served only
 * under --test-clock, is left out): wire name -> `call`, the Client
 * method; `args`, its positional arguments; `options`, the members of
 * its options object that it sends as params (by these names, the wire's).
 */
export const METHODS = {
  exec: { call: "exec", args: ["identity", "argv"], options: ["env", "cwd", "timeout", "stdin", "pids_max", "durable", "size"] },
  read_file: { call: "readFile", args: ["identity", "path"], options: ["root", "max_bytes"] },
  list_directory: { call: "listDirectory", args: ["identity"], options: ["path", "root"] },
  write_file: { call: "writeFile", args: ["identity", "path", "content"], options: ["durable"] },
  upload: { call: "upload", args: ["identity", "path", "source"], options: ["root", "mode", "durable"] },
  download: { call: "download", args: ["identity", "path"], options: ["root", "to"] },
  diff: { call: "diff", args: ["identity"], options: [] },
  merge: { call: "merge", args: ["identity"], options: ["pick", "dry_run"] },
  status: { call: "status", args: ["identity"], options: [] },
  snapshot: { call: "snapshot", args: ["identity"], options: ["name"] },
  fork: { call: "fork", args: ["identity"], options: ["count", "peers"] },
  set_size: { call: "setSize", args: ["identity", "size"], options: [] },
  list: { call: "list", args: [], options: [] },
  info: { call: "info", args: [], options: [] },
  stop: { call: "stop", args: ["target"], options: [] },
  remove: { call: "remove", args: ["target"], options: [] },
  cancel: { call: "cancel", args: ["id"], options: [] },
  prepare: { call: "prepare", args: [], options: [] },
  image_check: { call: "imageCheck", args: ["ref"], options: ["timeout"] },
} as const;

export type MethodName = keyof typeof METHODS;

/** Options of every call (client-side; none of them is sent as a param). */
export interface CallOptions {
  /** Aborting it cancels the call: `cancel` is sent, and the call rejects with Cancelled. */
  signal?: AbortSignal;
  /**
   * Milliseconds to wait for the answer; then `cancel` is sent and the
   * call rejects with CallTimeout (a Cancelled). Not exec's `timeout`,
   * the command's own limit in the guest. Default: the Client's.
   */
  callTimeoutMs?: number;
  /**
   * Called with each `progress` notification for this call, in order
   * (prepare, or a first tool call that prepares the server). A callback
   * that throws is ignored.
   */
  onProgress?: (p: Progress) => void;
  /** Called with the request's id once it is sent (for `cancel`, or logs). */
  onRequestId?: (id: number) => void;
}

/** A root of the guest: "public" (/source), "workspace" (/work), "project" (/workspace). */
export type Root = "public" | "workspace" | "project";

export interface ExecOptions {
  /** Environment variables of the command. */
  env?: Record<string, string>;
  cwd?: string;
  /** The command's timeout in seconds (server default 30, at most 86400). */
  timeout?: number;
  stdin?: string;
  /** Processes the command and what it starts may have at once (default 1024). */
  pids_max?: number;
  /** false: answer before what it wrote is on the host's disk (default true). */
  durable?: boolean;
  /**
   * The identity's sizes, as setSize takes them: checked (a bad one
   * rejects with InvalidParams naming the bound, the command not run)
   * and kept before the command runs; the answer's `size` says whether
   * they wait for the next start.
   */
  size?: Size;
}

export interface ImageCheckOptions {
  /** Seconds the check may take, 1 to 3600 (server default 10). */
  timeout?: number;
}

export interface ReadFileOptions {
  /** "public" (/source, default) or "workspace" (/work). */
  root?: "public" | "workspace";
  /** Default 2 MiB, at most 64 MiB. */
  max_bytes?: number;
}

export interface ListDirectoryOptions {
  /** Default: the root itself. */
  path?: string;
  root?: "public" | "workspace";
}

export interface WriteFileOptions {
  durable?: boolean;
}

export interface UploadOptions {
  /** "workspace" (/work, default) or "project" (/workspace). */
  root?: "workspace" | "project";
  /** Inline content only: permission bits, 0o755 or "0755" (default 0644). */
  mode?: number | string;
  durable?: boolean;
}

/**
 * What upload puts at path: a file's bytes (a string is sent as UTF-8;
 * at most 16 MiB), or `{from}`, a host file or directory inside one of
 * the server's --transfer-dir.
 */
export type UploadSource = Uint8Array | string | { from: string };

export interface DownloadOptions {
  /** "workspace" (default), "project" or "public". */
  root?: Root;
  /** A host path inside a --transfer-dir that does not exist yet: the file or tree is written there. */
  to?: string;
}

export interface MergeOptions {
  /** "refuse" (default: a conflict refuses the merge), "theirs" or "ours". */
  pick?: "refuse" | "theirs" | "ours";
  dry_run?: boolean;
}

export interface SnapshotOptions {
  /** The snapshot's name (default: the server's choice). */
  name?: string;
}

export interface ForkOptions {
  /** How many children (1 to 64; default 1, or as many as peers). */
  count?: number;
  /** The children's peers (default "<peer>-N" for the first free N). */
  peers?: string[];
}

/** Who stop and remove act on: an identity, or a sandbox this controller owns (the administrative form). */
export type Target = IdentityLike | { sandbox: string };

// Each options interface names exactly the options of its table entry:
// a member on one side only fails the build here.
type Listed<M extends MethodName> = (typeof METHODS)[M]["options"][number];
type Same<T, L> = [Exclude<keyof T, L>, Exclude<L, keyof T>] extends [never, never] ? true : false;
type None = Record<never, never>;
const agree: {
  [M in MethodName]: true;
} = {
  exec: true satisfies Same<ExecOptions, Listed<"exec">>,
  read_file: true satisfies Same<ReadFileOptions, Listed<"read_file">>,
  list_directory: true satisfies Same<ListDirectoryOptions, Listed<"list_directory">>,
  write_file: true satisfies Same<WriteFileOptions, Listed<"write_file">>,
  upload: true satisfies Same<UploadOptions, Listed<"upload">>,
  download: true satisfies Same<DownloadOptions, Listed<"download">>,
  diff: true satisfies Same<None, Listed<"diff">>,
  merge: true satisfies Same<MergeOptions, Listed<"merge">>,
  status: true satisfies Same<None, Listed<"status">>,
  snapshot: true satisfies Same<SnapshotOptions, Listed<"snapshot">>,
  fork: true satisfies Same<ForkOptions, Listed<"fork">>,
  set_size: true satisfies Same<None, Listed<"set_size">>,
  list: true satisfies Same<None, Listed<"list">>,
  info: true satisfies Same<None, Listed<"info">>,
  stop: true satisfies Same<None, Listed<"stop">>,
  remove: true satisfies Same<None, Listed<"remove">>,
  cancel: true satisfies Same<None, Listed<"cancel">>,
  prepare: true satisfies Same<None, Listed<"prepare">>,
  image_check: true satisfies Same<ImageCheckOptions, Listed<"image_check">>,
};
void agree;

type Params = Record<string, unknown>;

/** params with the options of method's table entry that opts gives (undefined and null left out). */
function put(method: MethodName, params: Params, opts: object | undefined): Params {
  const o = (opts ?? {}) as Record<string, unknown>;
  for (const k of METHODS[method].options as readonly string[]) {
    if (o[k] !== undefined && o[k] !== null) params[k] = o[k];
  }
  if ("durable" in params) {
    if (typeof params["durable"] !== "boolean") {
      throw new TypeError(`durable must be true or false, not ${JSON.stringify(params["durable"])}`);
    }
    // The server's default is true: "durable": false is sent only when asked.
    if (params["durable"]) delete params["durable"];
  }
  return params;
}

/**
 * Typed methods of every `capsule serve` method (docs/serve.md). Each
 * takes, besides its own options, the CallOptions: signal, callTimeoutMs,
 * onProgress, onRequestId.
 */
export abstract class Methods {
  /** Send method with params and answer its result, or reject with its error. */
  abstract call<T = unknown>(method: string, params?: Params, opts?: CallOptions): Promise<T>;

  // -- tool methods: one identity's sandbox ----------------------------------

  /**
   * Run argv in the identity's sandbox. The answer comes once what the
   * command wrote is on the host's disk; `durable: false` answers sooner
   * and gives that up (result.durable says which).
   */
  async exec(identity: IdentityLike, argv: readonly string[], opts?: ExecOptions & CallOptions): Promise<ExecResult> {
    if (!Array.isArray(argv) || argv.some((a) => typeof a !== "string")) {
      throw new TypeError(`argv must be an array of strings, e.g. ["sh", "-c", "echo hi"], not ${JSON.stringify(argv)}`);
    }
    return this.call("exec", put("exec", { identity: identityJson(identity), argv: [...argv] }, opts), opts);
  }

  /** A UTF-8 text file (or a directory's entries) from the public data (default) or /work. */
  async readFile(identity: IdentityLike, path: string, opts?: ReadFileOptions & CallOptions): Promise<FileResult> {
    return this.call("read_file", put("read_file", { identity: identityJson(identity), path }, opts), opts);
  }

  /** A directory's entries (at most 500). */
  async listDirectory(identity: IdentityLike, opts?: ListDirectoryOptions & CallOptions): Promise<DirectoryListing> {
    return this.call("list_directory", put("list_directory", { identity: identityJson(identity) }, opts), opts);
  }

  /** Write UTF-8 text (at most 60000 bytes) to path in /work. */
  async writeFile(identity: IdentityLike, path: string, content: string, opts?: WriteFileOptions & CallOptions): Promise<WriteResult> {
    return this.call("write_file", put("write_file", { identity: identityJson(identity), path, content }, opts), opts);
  }

  /**
   * Put one file's bytes at path (its directory must exist), or copy
   * `{from}` (a host file or directory in a --transfer-dir) there.
   */
  async upload(identity: IdentityLike, path: string, source: UploadSource, opts?: UploadOptions & CallOptions): Promise<UploadResult> {
    const p = put("upload", { identity: identityJson(identity), path }, opts);
    if (typeof source === "string" || source instanceof Uint8Array) {
      const data = typeof source === "string" ? Buffer.from(source, "utf8") : Buffer.from(source.buffer, source.byteOffset, source.byteLength);
      if (data.length > INLINE_MAX) {
        throw new InvalidParams(
          InvalidParams.code,
          `an inline upload is at most ${INLINE_MAX} bytes, this one has ${data.length}: put the file in a --transfer-dir and upload {from: path}`,
          { local: true },
        );
      }
      p["content_base64"] = data.toString("base64");
      if (typeof p["mode"] === "number") p["mode"] = (p["mode"] as number).toString(8).padStart(4, "0");
    } else if (source && typeof source === "object" && typeof source.from === "string") {
      if ("mode" in p) throw new TypeError("mode applies to inline content only; an upload {from} keeps the host's modes");
      p["from"] = source.from;
    } else {
      throw new TypeError("upload's source must be bytes (a Uint8Array or Buffer), a string, or {from: hostPath}");
    }
    return this.call("upload", p, opts);
  }

  /**
   * One file's bytes in `content` (at most 16 MiB), or, with `to`, the
   * file or tree written to that host path.
   */
  async download(identity: IdentityLike, path: string, opts?: DownloadOptions & CallOptions): Promise<DownloadResult> {
    const r = await this.call<DownloadResult & { content_base64?: string }>(
      "download",
      put("download", { identity: identityJson(identity), path }, opts),
      opts,
    );
    if (typeof r.content_base64 === "string") {
      r.content = Buffer.from(r.content_base64, "base64");
      delete r.content_base64;
    }
    return r;
  }

  /** What the sandbox changed in /workspace (a server with --workspace). */
  async diff(identity: IdentityLike, opts?: CallOptions): Promise<DiffResult> {
    return this.call("diff", put("diff", { identity: identityJson(identity) }, opts), opts);
  }

  /** Merge the sandbox's /workspace changes into the server's --workspace; conflicts reject with ToolRefused (.conflicts). */
  async merge(identity: IdentityLike, opts?: MergeOptions & CallOptions): Promise<MergeResult> {
    return this.call("merge", put("merge", { identity: identityJson(identity) }, opts), opts);
  }

  // -- lifecycle and the controller ------------------------------------------

  /** Save the identity's running sandbox (memory, processes, disks), after its earlier calls. */
  async snapshot(identity: IdentityLike, opts?: SnapshotOptions & CallOptions): Promise<SnapshotResult> {
    return this.call("snapshot", put("snapshot", { identity: identityJson(identity) }, opts), opts);
  }

  /** Branch the identity's sandbox: new identities of the same agent, each going on from its state. */
  async fork(identity: IdentityLike, opts?: ForkOptions & CallOptions): Promise<ForkResult> {
    return this.call("fork", put("fork", { identity: identityJson(identity) }, opts), opts);
  }

  /** The identity's sandbox state; creates nothing. */
  async status(identity: IdentityLike, opts?: CallOptions): Promise<Status> {
    return this.call("status", put("status", { identity: identityJson(identity) }, opts), opts);
  }

  /**
   * The identity's own sizes (any of cpus, memory_mib, root_mib,
   * work_mib): rejected now with InvalidParams naming the bound when
   * beyond the server's or the host's, else kept with the identity and
   * applied at its sandbox's next start. A running VM is not resized:
   * the answer's size.pending and size.note say so.
   */
  async setSize(identity: IdentityLike, size: Size, opts?: CallOptions): Promise<SizeResult> {
    if (size === null || typeof size !== "object" || Array.isArray(size) || Object.keys(size).length === 0) {
      throw new TypeError(`size must be an object such as {cpus: 2, memory_mib: 2048}, not ${JSON.stringify(size)}`);
    }
    return this.call("set_size", put("set_size", { identity: identityJson(identity), size: { ...size } }, opts), opts);
  }

  async list(opts?: CallOptions): Promise<SandboxList> {
    return this.call("list", undefined, opts);
  }

  async info(opts?: CallOptions): Promise<ServerInfo> {
    return this.call("info", undefined, opts);
  }

  /** Stop the identity's VM after its queued calls (disks kept). */
  async stop(target: Target, opts?: CallOptions): Promise<LifecycleResult> {
    return this.call("stop", put("stop", who(target), opts), opts);
  }

  /** Stop the VM and delete its sandbox and disks. */
  async remove(target: Target, opts?: CallOptions): Promise<LifecycleResult> {
    return this.call("remove", put("remove", who(target), opts), opts);
  }

  /**
   * Cancel one of this connection's requests by id (onRequestId gives
   * it); whether it was found. A call is usually cancelled through its
   * own signal or callTimeoutMs instead.
   */
  async cancel(id: number | string, opts?: CallOptions): Promise<boolean> {
    const r = await this.call<{ cancelled?: boolean }>("cancel", put("cancel", { id }, opts), opts);
    return r?.cancelled === true;
  }

  /**
   * Make sure kernel, initramfs, image and template exist, building what
   * is missing (minutes for a kernel), with progress to onProgress. A
   * failure rejects with SandboxFailed (.phase, retryable): calling again
   * resumes there.
   */
  async prepare(opts?: CallOptions): Promise<PrepareResult> {
    return this.call("prepare", put("prepare", {}, opts), opts);
  }

  // -- images ----------------------------------------------------------------

  /**
   * Resolve a registry reference and read its linux/amd64 manifest and
   * config without pulling a layer. A reference the registry lacks, an
   * unreachable registry, a media type or platform capsule does not take
   * reject with ToolRefused; its data.reason says which (offline and
   * timeout are retryable).
   */
  async imageCheck(ref: string, opts?: ImageCheckOptions & CallOptions): Promise<ImageCheck> {
    if (typeof ref !== "string") throw new TypeError(`ref must be a registry reference (a string), not ${JSON.stringify(ref)}`);
    return this.call("image_check", put("image_check", { ref }, opts), opts);
  }
}

function who(target: Target): Params {
  const t = target as { sandbox?: unknown };
  if (t && typeof t === "object" && !Array.isArray(t) && "sandbox" in t) {
    if (typeof t.sandbox !== "string") throw new TypeError("sandbox must be a sandbox's name (a string)");
    return { sandbox: t.sandbox };
  }
  return { identity: identityJson(target as IdentityLike) };
}
