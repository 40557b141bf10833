/**
 * Client: one connection to `capsule serve`. Any number of calls may be
 * in flight at once; each answer reaches its caller by id, each progress
 * notification the callback of the call it names.
 */
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import type { Duplex } from "node:stream";

import {
  CallTimeout,
  Cancelled,
  CapsuleError,
  ConnectionLost,
  InvalidRequest,
  errorFrom,
} from "./errors.js";
import { type CallOptions, LINE_MAX, Methods } from "./methods.js";
import type { PrepareResult, Progress } from "./types.js";

/** How long a cancelled call waits for the server to confirm (a transfer's worker lets go of its connection first). */
export const CANCEL_GRACE_MS = 30_000;

export interface ClientOptions {
  /** The default callTimeoutMs of every call (none: wait as long as the server works). */
  callTimeoutMs?: number;
  /** How long connect() waits for the socket (default 10 s). */
  connectTimeoutMs?: number;
  /** How long a cancelled call waits for the server's confirmation (default 30 s). */
  cancelGraceMs?: number;
}

/**
 * The socket `capsule serve` listens on by default: $CAPSULE_HOME/serve.sock,
 * the home being $CAPSULE_HOME, else $XDG_DATA_HOME/capsule, else
 * ~/.local/share/capsule (as capsule itself finds it).
 */
export function defaultSocketPath(env: NodeJS.ProcessEnv = process.env): string {
  let home = env["CAPSULE_HOME"];
  if (!home) {
    const xdg = env["XDG_DATA_HOME"];
    home = xdg && xdg.startsWith("/") ? path.join(xdg, "capsule") : path.join(env["HOME"] || os.homedir(), ".local/share/capsule");
  }
  return path.join(home, "serve.sock");
}

/** A message from the server, as read. */
type Message = Record<string, unknown>;

interface Pending {
  method: string;
  onProgress: ((p: Progress) => void) | undefined;
  /** Called once with the response (or a local failure). */
  finish: (msg: Message | CapsuleError) => void;
}

/** Whether id can be one of our requests' ids: a string or an integer. */
function idOk(id: unknown): id is number | string {
  return typeof id === "string" || Number.isInteger(id);
}

export class Client extends Methods {
  /** Where the client connected ("stream" for fromStream). */
  readonly socketPath: string;
  callTimeoutMs: number | undefined;
  private readonly cancelGraceMs: number;
  private readonly sock: Duplex;
  private nextId = 1;
  private readonly pending = new Map<number | string, Pending>();
  private chunks: Buffer[] = [];
  private lostWhy: string | null = null;

  private constructor(sock: Duplex, where: string, opts: ClientOptions) {
    super();
    this.sock = sock;
    this.socketPath = where;
    this.callTimeoutMs = opts.callTimeoutMs;
    this.cancelGraceMs = opts.cancelGraceMs ?? CANCEL_GRACE_MS;
    sock.on("data", (chunk: Buffer) => this.onData(chunk));
    sock.on("end", () => this.lost("capsule serve closed the connection"));
    sock.on("close", () => this.lost("the connection to capsule serve was closed"));
    sock.on("error", (e: Error) => this.lost(`the connection to capsule serve failed: ${e.message}`));
    this.holdLoop();
  }

  /** Connect to `capsule serve` at socketPath (default: defaultSocketPath()). */
  static connect(socketPath: string = defaultSocketPath(), opts: ClientOptions = {}): Promise<Client> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection({ path: socketPath });
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new ConnectionLost(`cannot connect to capsule serve at ${socketPath}: no answer within ${opts.connectTimeoutMs ?? 10_000} ms`));
      }, opts.connectTimeoutMs ?? 10_000);
      const failed = (e: Error) => {
        clearTimeout(timer);
        reject(
          new ConnectionLost(
            `cannot connect to capsule serve at ${socketPath}: ${e.message} (is \`capsule serve\` running with this --socket?)`,
            { cause: e },
          ),
        );
      };
      sock.once("error", failed);
      sock.once("connect", () => {
        clearTimeout(timer);
        sock.off("error", failed);
        resolve(new Client(sock, socketPath, opts));
      });
    });
  }

  /**
   * A client over a stream already connected to a serve socket (a
   * net.Socket, or any Duplex that carries the same lines, such as a
   * forwarded connection).
   */
  static fromStream(stream: Duplex, opts: ClientOptions = {}): Client {
    return new Client(stream, "stream", opts);
  }

  /** Whether the connection is closed (by close(), the server or an error). */
  get closed(): boolean {
    return this.lostWhy !== null;
  }

  // -- the wire ----------------------------------------------------------------

  /** Any method by name: its result (the JSON object), or its error as a rejection. */
  override call<T = unknown>(method: string, params?: Record<string, unknown>, opts: CallOptions = {}): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const signal = opts.signal;
      if (this.lostWhy !== null) return reject(new ConnectionLost(this.lostWhy));
      if (signal?.aborted) {
        return reject(new Cancelled(null, `${method} was cancelled before it was sent`, null, { cause: signal.reason }));
      }
      const id = this.nextId++;
      const msg: Message = { jsonrpc: "2.0", id, method };
      if (params !== undefined) msg["params"] = params;
      const line = JSON.stringify(msg);
      const size = Buffer.byteLength(line);
      if (size > LINE_MAX) {
        return reject(
          new InvalidRequest(InvalidRequest.code, `the ${method} request is ${size} bytes, over the server's line limit of ${LINE_MAX}`, {
            local: true,
          }),
        );
      }

      const timeoutMs = opts.callTimeoutMs ?? this.callTimeoutMs;
      let why: "cancelled" | "timeout" | null = null;
      let timer: NodeJS.Timeout | undefined;
      let grace: NodeJS.Timeout | undefined;
      const done = () => {
        clearTimeout(timer);
        clearTimeout(grace);
        signal?.removeEventListener("abort", onAbort);
        this.pending.delete(id);
        this.holdLoop();
      };
      const giveUp = (w: "cancelled" | "timeout") => {
        if (why !== null || !this.pending.has(id)) return;
        why = w;
        // The server answers the call -32800 once it has let go of it.
        this.call("cancel", { id }).catch(() => {});
        grace = setTimeout(() => {
          done();
          const cls = why === "timeout" ? CallTimeout : Cancelled;
          reject(
            new cls(null, `${method} (request ${id}) was ${why === "timeout" ? "timed out" : "cancelled"}, and the server did not confirm its cancellation within ${this.cancelGraceMs} ms`, null, {
              cause: why === "cancelled" ? signal?.reason : undefined,
            }),
          );
        }, this.cancelGraceMs);
      };
      const onAbort = () => giveUp("cancelled");

      this.pending.set(id, {
        method,
        onProgress: opts.onProgress,
        finish: (res) => {
          done();
          if (res instanceof CapsuleError) return reject(res);
          if ("error" in res) {
            const e = errorFrom(res["error"]);
            if (e instanceof Cancelled && why === "timeout") {
              return reject(new CallTimeout(e.code, `${method} (request ${id}) gave no answer within ${timeoutMs} ms and was cancelled`, e.data));
            }
            if (e instanceof Cancelled && why === "cancelled" && signal) {
              return reject(new Cancelled(e.code, e.message, e.data, { cause: signal.reason }));
            }
            return reject(e);
          }
          resolve(res["result"] as T);
        },
      });
      this.holdLoop();
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== undefined && timeoutMs !== null) timer = setTimeout(() => giveUp("timeout"), timeoutMs);
      this.sock.write(line + "\n", (err) => {
        if (err) this.lost(`sending ${method} to ${this.socketPath} failed: ${err.message}`);
      });
      opts.onRequestId?.(id);
    });
  }

  /**
   * prepare, as a stream: iterate it for the progress notifications as
   * they come; it ends when the preparation does, throwing its error if
   * it failed. `result` is the outcome; `cancel()` stops this wait (the
   * server's preparation goes on for others).
   */
  prepareStream(opts: CallOptions = {}): PrepareStream {
    return new PrepareStream(this, opts);
  }

  // -- reading -------------------------------------------------------------------

  private onData(chunk: Buffer): void {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      this.chunks.push(chunk.subarray(start, nl));
      const line = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
      this.chunks = [];
      start = nl + 1;
      if (line.length < 8 && line.toString("latin1").trim() === "") continue;
      let msg: unknown;
      try {
        msg = JSON.parse(line.toString("utf8"));
      } catch (e) {
        this.lost(`capsule serve sent a line that is not JSON (${(e as Error).message}); the connection is dropped`);
        this.sock.destroy();
        return;
      }
      this.dispatch(msg);
      if (this.lostWhy !== null) return;
    }
    if (start < chunk.length) this.chunks.push(chunk.subarray(start));
  }

  private dispatch(msg: unknown): void {
    if (msg === null || typeof msg !== "object" || Array.isArray(msg)) return;
    const m = msg as Message;
    if (!("id" in m)) {
      // A notification: progress for one of our calls, or one this client does not know.
      const p = m["params"] as Record<string, unknown> | undefined;
      if (m["method"] !== "progress" || !p || typeof p !== "object" || !idOk(p["request"])) return;
      const cb = this.pending.get(p["request"])?.onProgress;
      if (cb) {
        try {
          const r = cb(p as unknown as Progress) as unknown;
          if (r instanceof Promise) r.catch(() => {});
        } catch {
          // A callback's bug must not stop the answers of every other call.
        }
      }
      return;
    }
    if ("method" in m) return; // the server sends no requests
    const id = idOk(m["id"]) ? m["id"] : null;
    if (id === null && "error" in m) {
      // The server could not read one of our lines as a request and cannot
      // say which: every waiting call gets the error.
      for (const call of [...this.pending.values()]) call.finish(m);
      return;
    }
    if (id !== null) this.pending.get(id)?.finish(m);
  }

  /** The connection is gone: every waiting call rejects with ConnectionLost. */
  private lost(why: string): void {
    if (this.lostWhy === null) this.lostWhy = why;
    for (const call of [...this.pending.values()]) call.finish(new ConnectionLost(this.lostWhy));
  }

  /** The socket keeps the process alive only while calls wait for answers. */
  private holdLoop(): void {
    const s = this.sock as Partial<net.Socket>;
    if (this.pending.size > 0) s.ref?.();
    else s.unref?.();
  }

  // -- lifetime ----------------------------------------------------------------

  /** Close the connection: the server cancels this connection's calls still running; waiting calls reject with ConnectionLost. */
  close(): Promise<void> {
    if (this.lostWhy === null) this.lostWhy = "the client closed the connection";
    this.lost(this.lostWhy);
    return new Promise((resolve) => {
      if (this.sock.destroyed) return resolve();
      this.sock.once("close", () => resolve());
      // Held while it closes: an unref'd socket would let the process
      // end with this promise unsettled (a top-level await's exit 13).
      (this.sock as Partial<net.Socket>).ref?.();
      this.sock.end();
      setTimeout(() => this.sock.destroy(), 1000).unref();
    });
  }
}

/** prepare's progress as an async iterable, and its outcome (Client.prepareStream). */
export class PrepareStream implements AsyncIterable<Progress> {
  /** The outcome: the PrepareResult, or the call's error. */
  readonly result: Promise<PrepareResult>;
  private readonly queue: Progress[] = [];
  private wake: (() => void) | null = null;
  private ended = false;
  private failure: unknown = null;
  private readonly abort = new AbortController();

  constructor(client: Client, opts: CallOptions) {
    const outer = opts.signal;
    if (outer?.aborted) this.abort.abort(outer.reason);
    else outer?.addEventListener("abort", () => this.abort.abort(outer.reason), { once: true });
    this.result = client.prepare({
      ...opts,
      signal: this.abort.signal,
      onProgress: (p) => {
        this.queue.push(p);
        opts.onProgress?.(p);
        this.poke();
      },
    });
    this.result.then(
      () => this.finish(null),
      (e) => this.finish(e),
    );
  }

  /** Stop waiting for the preparation (it goes on on the server). */
  cancel(reason?: unknown): void {
    this.abort.abort(reason);
  }

  private finish(e: unknown): void {
    this.ended = true;
    this.failure = e;
    this.poke();
  }

  private poke(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Progress> {
    for (;;) {
      while (this.queue.length > 0) yield this.queue.shift()!;
      if (this.ended) break;
      await new Promise<void>((r) => (this.wake = r));
    }
    if (this.failure !== null) throw this.failure;
  }
}
