/**
 * A client for `capsule serve`, capsule's JSON-RPC server for
 * orchestrators (docs/serve.md). Node.js standard library only.
 *
 *     import { Client } from "capsule-client";
 *     const c = await Client.connect("/path/to/serve.sock");
 *     const r = await c.exec({ agent: "a", peer: "p" }, ["sh", "-c", "echo hi"]);
 *     console.log(r.exit_code, r.stdout);
 *     await c.close();
 */
export { Client, PrepareStream, CANCEL_GRACE_MS, defaultSocketPath, type ClientOptions } from "./client.js";
export {
  Busy,
  CallTimeout,
  CapsuleError,
  Cancelled,
  ConnectionLost,
  InvalidParams,
  InvalidRequest,
  MethodNotFound,
  ParseError,
  SandboxFailed,
  ToolRefused,
  errorFrom,
  type Conflict,
  type ErrorData,
} from "./errors.js";
export {
  INLINE_MAX,
  LINE_MAX,
  METHODS,
  Methods,
  type CallOptions,
  type DownloadOptions,
  type ExecOptions,
  type ForkOptions,
  type ImageCheckOptions,
  type ListDirectoryOptions,
  type MergeOptions,
  type MethodName,
  type ReadFileOptions,
  type Root,
  type SnapshotOptions,
  type Target,
  type UploadOptions,
  type UploadSource,
  type WriteFileOptions,
} from "./methods.js";
export {
  identityJson,
  type Change,
  type DiffResult,
  type DirEntry,
  type DirectoryListing,
  type DownloadResult,
  type ExecResult,
  type FileResult,
  type ForkResult,
  type Identity,
  type IdentityLike,
  type ImageCheck,
  type ImageLayer,
  type ImportOutcome,
  type LifecycleResult,
  type MergeResult,
  type Phase,
  type PrepareResult,
  type Progress,
  type SandboxList,
  type SandboxState,
  type ServerInfo,
  type Size,
  type SizeResult,
  type SnapshotResult,
  type SizeState,
  type Status,
  type ToolResult,
  type UploadResult,
  type WriteResult,
} from "./types.js";
