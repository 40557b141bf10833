/**
 * Identity, and the results of the serve methods with the fields
 * docs/serve.md documents. Names are the wire's (snake_case), so the
 * server's documentation reads directly; a result is the server's own
 * answer object, so fields a newer server adds are there before this
 * client names them.
 */

/**
 * Who a tool call is for: the trusted caller's agent and peer (each 1 to
 * 64 of `A-Z a-z 0-9 . _ @ + = : -`, not starting with `.`).
 */
export interface Identity {
  agent: string;
  peer: string;
}

/** An Identity, or an `[agent, peer]` pair. */
export type IdentityLike = Identity | readonly [string, string];

/** The wire form of an IdentityLike; a TypeError for anything else. */
export function identityJson(who: IdentityLike): Identity {
  if (Array.isArray(who) && who.length === 2 && typeof who[0] === "string" && typeof who[1] === "string") {
    return { agent: who[0], peer: who[1] };
  }
  const o = who as Partial<Identity> | null;
  if (o && typeof o === "object" && typeof o.agent === "string" && typeof o.peer === "string") {
    return { agent: o.agent, peer: o.peer };
  }
  throw new TypeError(
    `identity must be {agent, peer} (two strings) or an [agent, peer] pair, not ${JSON.stringify(who)}`,
  );
}

/** A preparation phase, in the order they are made sure of. */
export type Phase = "kernel" | "initramfs" | "image" | "template";

/**
 * One `progress` notification: `request` is the id of the call it is
 * for; `status` building | line | ready | failed; `done` phases ready of
 * `total` (4), never going down.
 */
export interface Progress {
  request: number | string;
  phase: Phase | string;
  status: "building" | "line" | "ready" | "failed" | string;
  done: number;
  total: number;
  message?: string;
}

/** The private import's outcome, on the call that made the sandbox (docs/serve.md). */
export interface ImportOutcome {
  from?: string;
  files?: number;
  dirs?: number;
  bytes?: number;
  conflicts?: string[];
  refused?: string[];
  error?: string;
}

/** Members any tool call's result may carry. */
export interface ToolResult {
  /** The identity's sandbox. */
  sandbox: string;
  /** The phases this call had to build first (absent when none). */
  prepared?: string[];
  /** The private import's outcome, when this call made the sandbox. */
  import?: ImportOutcome;
}

/** `exec`: `exit_code` is null when a signal killed the command. */
export interface ExecResult extends ToolResult {
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  truncated: boolean;
  stdout: string;
  stderr: string;
  duration_ms: number;
  /** What the command wrote is on the host's disk (false with `durable: false`). */
  durable?: boolean;
  /** How long the flush took (not part of duration_ms). */
  sync_ms?: number;
  /** Set when the host had to step in (a guest that did not end the command). */
  note?: string;
  /** With exec's `size`: the identity's sizes as set_size answers them. */
  size?: SizeState;
}

/** An entry of a directory listing. */
export interface DirEntry {
  name: string;
  type: "file" | "directory" | "symlink" | "other" | string;
  /** Files only. */
  size?: number;
}

/** `read_file`: kind "file" with `content`, or "directory" with `entries`. */
export interface FileResult extends ToolResult {
  kind: "file" | "directory";
  content?: string;
  entries?: DirEntry[];
  truncated?: boolean;
}

/** `list_directory`: at most 500 entries; `truncated` says more exist. */
export interface DirectoryListing extends ToolResult {
  kind: "directory";
  entries: DirEntry[];
  truncated: boolean;
}

/** `write_file`. */
export interface WriteResult extends ToolResult {
  path: string;
  bytes: number;
  durable?: boolean;
  sync_ms?: number;
}

/** `upload`: what was copied. */
export interface UploadResult extends ToolResult {
  path: string;
  files: number;
  dirs: number;
  links: number;
  bytes: number;
  durable?: boolean;
  sync_ms?: number;
}

/**
 * `download`. Without `to`: the file's bytes in `content` (decoded from
 * the wire's content_base64, which is not kept). With `to`: `to` is
 * where the file or tree was written (resolved).
 */
export interface DownloadResult extends ToolResult {
  path?: string;
  to?: string;
  content?: Buffer;
  files: number;
  dirs: number;
  links?: number;
  bytes: number;
}

/** One change of `diff`, as `capsule diff --json` prints it (docs/workspace.md). */
export interface Change {
  path: string;
  change: "added" | "modified" | "removed" | string;
  type: string;
  mode?: string;
  old_mode?: string;
  size?: number;
  sha256?: string;
  old_type?: string;
  target?: string;
  path_escaped?: boolean;
}

/** `diff`: what the sandbox changed in /workspace. */
export interface DiffResult {
  sandbox: string;
  changes: Change[];
}

/** `merge` (or what it would do, with `dry_run`): counts of each kind. */
export interface MergeResult {
  sandbox: string;
  into: string;
  dry_run: boolean;
  written: number;
  removed: number;
  /** Directories. */
  created: number;
  chmod: number;
  links: number;
  /** Changes inside a .git directory, never merged. */
  git_left_out: number;
}

/** `snapshot`: the identity's sandbox and the snapshot taken of it. */
export interface SnapshotResult {
  sandbox: string;
  snapshot: string;
}

/** `fork`: the snapshot taken, and each child: an identity to address from now on, and its sandbox. */
export interface ForkResult {
  sandbox: string;
  snapshot: string;
  children: { identity: Identity; sandbox: string }[];
}

/** A sandbox's state. */
export type SandboxState = "none" | "stopped" | "starting" | "running" | "paused" | "stopping";

/** `status` of an identity, and each entry of `list`. */
export interface Status {
  agent?: string;
  peer?: string;
  state: SandboxState | string;
  sandbox: string | null;
  active: number;
  queued: number;
  /** Null for a sandbox that is not resident. */
  idle_ms: number | null;
  /** With --private-import: when the import ran (Unix time), else null. */
  imported?: number | null;
  /** `status` only: its sizes. */
  size?: SizeState;
}

/**
 * Sizes of an identity's VM (docs/serve.md, "Sizes"): vCPUs, memory and
 * disk sizes in MiB. Any of them may be given to set_size or exec's
 * `size`; what is not given keeps the identity's own or the server's
 * default.
 */
export interface Size {
  cpus?: number;
  memory_mib?: number;
  root_mib?: number;
  work_mib?: number;
}

/**
 * An identity's sizes as `status`, `set_size` and exec's `size` answer
 * them: what its next start gets, `override` (the identity's own, {}
 * when none), `running` (the VM's now, or null), `pending` (they differ
 * until the next start: a running VM is not resized) and then a `note`
 * saying so.
 */
export interface SizeState {
  cpus: number;
  memory_mib: number;
  root_mib: number;
  work_mib: number;
  override: Size;
  running: { cpus: number; memory_mib: number } | null;
  pending: boolean;
  note?: string;
}

/** `set_size`. */
export interface SizeResult {
  agent: string;
  peer: string;
  size: SizeState;
}

/** `list`: every identity's sandbox, stopped ones included. */
export interface SandboxList {
  sandboxes: Status[];
  capacity: number;
  warm_pool: { size: number; members: number; ready: number };
}

/** `info`: the controller's settings. */
export interface ServerInfo {
  pid: number;
  frontend: string;
  home: string;
  image: string;
  source: string | null;
  workspace: string | null;
  private_import: string | null;
  transfer_dirs: string[];
  inline_max: number;
  network: string[];
  capacity: number;
  idle_pause_ms: number;
  idle_stop_ms: number;
  warm_pool: number;
  manual_clock: boolean;
}

/** `stop` and `remove`: `state` is stopped, removed or none. */
export interface LifecycleResult {
  state: "stopped" | "removed" | "none" | string;
  sandbox?: string | null;
}

/** `prepare`: `built` lists the phases this call built (empty when all were there). */
export interface PrepareResult {
  prepared: true;
  built: Phase[];
  kernel: string;
  initramfs: string;
  image: { name: string | null; digest: string };
  /** False when templates are off (CAPSULE_TEMPLATES=0). */
  template: boolean;
  duration_ms: number;
}

/** One layer of an image_check: its digest, media type and compressed size. */
export interface ImageLayer {
  digest: string;
  media_type: string;
  size_bytes: number;
}

/**
 * `image_check`: what the registry says of a reference, no layer pulled
 * (docs/images.md, "Checking a reference"). `platform_digest` is the
 * manifest for the platform (through an index when `index` is true:
 * `registry_digest` is then the index's, `platforms` what it lists);
 * `compressed_bytes` is the layers' total.
 */
export interface ImageCheck {
  reference: string;
  registry_digest: string;
  media_type: string;
  index: boolean;
  platforms: string[];
  platform: string;
  platform_digest: string;
  manifest_media_type: string;
  config: {
    digest: string;
    media_type: string;
    size_bytes: number;
    os: string;
    architecture: string;
    variant: string | null;
    entrypoint: string[] | null;
    cmd: string[] | null;
    env: string[] | null;
    working_dir: string | null;
    user: string | null;
  };
  layer_count: number;
  compressed_bytes: number;
  layers: ImageLayer[];
}
