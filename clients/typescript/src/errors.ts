/**
 * Errors: one class per JSON-RPC error code of `capsule serve`
 * (docs/serve.md, "Errors"), all under CapsuleError.
 */

/** The `data` member of an error answer, when it is an object. */
export type ErrorData = Record<string, unknown>;

/**
 * An error answer of the server, or a failure to reach it.
 *
 * `code`: the JSON-RPC error code (null for ConnectionLost, and for a
 * cancellation the server did not confirm); `message`: the server's
 * message; `data`: its `data` member (an object, or null); `retryable`:
 * whether the same call may succeed when sent again (`data.retryable`,
 * and always for -32001 Busy).
 */
export class CapsuleError extends Error {
  /** The code this class stands for (null for the base class). */
  static readonly code: number | null = null;
  readonly code: number | null;
  readonly data: ErrorData | null;

  constructor(code: number | null, message: string, data?: unknown, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
    this.data = data !== null && typeof data === "object" && !Array.isArray(data) ? (data as ErrorData) : null;
  }

  get retryable(): boolean {
    return this.code === Busy.code || this.data?.["retryable"] === true;
  }
}

/** -32700: the server could not read a line as JSON. */
export class ParseError extends CapsuleError {
  static override readonly code = -32700;
}

/** -32600: not a JSON-RPC 2.0 request, or a line over 24 MiB. */
export class InvalidRequest extends CapsuleError {
  static override readonly code = -32600;
}

/** -32601: the server has no such method (an older server). */
export class MethodNotFound extends CapsuleError {
  static override readonly code = -32601;
}

/**
 * -32602: bad params (the message says which); `data.refused` and
 * `data.transfer_dirs` for a transfer path outside the transfer
 * directories. Also raised before sending for what the client can tell
 * is too big (`data.local` true).
 */
export class InvalidParams extends CapsuleError {
  static override readonly code = -32602;
}

/**
 * -32000: the sandbox failed (could not start, died), or a preparation
 * phase failed (`phase`); `retryable` says whether to try again.
 */
export class SandboxFailed extends CapsuleError {
  static override readonly code = -32000;

  /** The preparation phase that failed (kernel, initramfs, image, template, lock), or null. */
  get phase(): string | null {
    const p = this.data?.["phase"];
    return typeof p === "string" ? p : null;
  }
}

/** -32001: every sandbox slot is busy with running calls; retry later. */
export class Busy extends CapsuleError {
  static override readonly code = -32001;
}

/** A merge's conflict, in ToolRefused.conflicts. */
export interface Conflict {
  path: string;
  why: string;
}

/**
 * -32002: the tool refused (a file too big or not text, a transfer's
 * paths, a merge's conflicts, nothing to diff...).
 */
export class ToolRefused extends CapsuleError {
  static override readonly code = -32002;

  /** A merge's conflicts (empty otherwise). */
  get conflicts(): Conflict[] {
    const c = this.data?.["conflicts"];
    return Array.isArray(c) ? (c as Conflict[]) : [];
  }

  /** The paths a transfer refused (empty otherwise). */
  get refused(): string[] {
    const r = this.data?.["refused"];
    return Array.isArray(r) ? (r as string[]) : [];
  }
}

/**
 * -32800: the request was cancelled (by its AbortSignal, `cancel`, or a
 * call timeout: then it is a CallTimeout). `code` is null when the
 * server did not confirm the cancellation in time, or when the signal
 * was aborted before the request was sent.
 */
export class Cancelled extends CapsuleError {
  static override readonly code = -32800;
}

/**
 * The call gave no answer within its `callTimeoutMs`: the client sent
 * `cancel` for it. `code` is -32800 when the server confirmed, null when
 * it did not answer that either.
 */
export class CallTimeout extends Cancelled {}

/**
 * The connection to the server closed, failed or could not be made
 * before the answer came. Whether the call ran is unknown; `code` is null.
 */
export class ConnectionLost extends CapsuleError {
  constructor(message = "the connection to capsule serve was lost", options?: { cause?: unknown }) {
    super(null, message, null, options);
  }
}

const BY_CODE = new Map<number, new (code: number, message: string, data?: unknown) => CapsuleError>(
  [ParseError, InvalidRequest, MethodNotFound, InvalidParams, SandboxFailed, Busy, ToolRefused, Cancelled].map(
    (c) => [c.code, c],
  ),
);

/** The error for a JSON-RPC `error` member: the class of its code, else a plain CapsuleError. */
export function errorFrom(err: unknown): CapsuleError {
  if (err === null || typeof err !== "object" || Array.isArray(err)) {
    return new CapsuleError(null, `malformed error answer: ${JSON.stringify(err)}`);
  }
  const e = err as Record<string, unknown>;
  const code = Number.isInteger(e["code"]) ? (e["code"] as number) : null;
  const message = typeof e["message"] === "string" ? e["message"] : String(e["message"] ?? "");
  const cls = code === null ? undefined : BY_CODE.get(code);
  return cls ? new cls(code as number, message, e["data"]) : new CapsuleError(code, message, e["data"]);
}
