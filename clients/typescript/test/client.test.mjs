// The TypeScript client against a real `capsule serve` started here on a
// private home (real VMs: TCG or KVM, whichever the host has), and
// against a fake server on a socket of its own for what a real one
// cannot be made to do on demand (a dropped connection, a line that is
// not JSON, an error with id null). Every serve method is called; the
// example examples/agent-backend.mjs is run against the same server.
// Node's own test runner (node:test), no other dependency:
//
//     CAPSULE_BIN_UNDER_TEST=build/capsule node --test --test-reporter=tap clients/typescript/test/
//
// The package is imported by its own name ("capsule-client", through
// package.json's exports), as ESM and as CommonJS: `npm run build` first.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

import * as esm from "capsule-client";

const {
  Busy,
  CallTimeout,
  Cancelled,
  CapsuleError,
  Client,
  ConnectionLost,
  INLINE_MAX,
  InvalidParams,
  METHODS,
  MethodNotFound,
  SandboxFailed,
  ToolRefused,
  defaultSocketPath,
  errorFrom,
} = esm;

const pkg = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const top = path.dirname(path.dirname(pkg));
const capsule = path.resolve(top, process.env.CAPSULE_BIN_UNDER_TEST ?? "build/capsule");
const rt = fs.mkdtempSync("/tmp/cts.");
const home = path.join(rt, "home");
const pub = path.join(rt, "pub");
const xfer = path.join(rt, "xfer");
const proj = path.join(rt, "proj");
const sock = path.join(rt, "serve.sock");
const logPath = path.join(rt, "serve.log");
const env = { ...process.env, CAPSULE_HOME: home, XDG_RUNTIME_DIR: rt, CAPSULE_REGISTRY_DIR: path.join(rt, "registry") };
const WHO = { agent: "ts", peer: "one" };
const OTHER = ["ts", "two"]; // the pair form
const registry = path.join(top, "tests", "registry.sh");

let server; // the capsule serve process
let c; // one client, shared by the checks
let regPort = 0;
let imageRef = "";
let imageDigest = "";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** The process's exit ({code, sig}), or {code: "hung"} after ms (the timer cleared either way). */
function exitWithin(proc, ms) {
  let timer;
  const t = new Promise((r) => (timer = setTimeout(() => r({ code: "hung" }), ms)));
  return Promise.race([proc.exited, t]).finally(() => clearTimeout(timer));
}
const logTail = () => {
  try {
    return fs.readFileSync(logPath, "utf8").split("\n").slice(-15).join("\n");
  } catch {
    return "";
  }
};

function qemuPids() {
  try {
    return execFileSync("pgrep", ["-f", `qemu-system.*${home}/`]).toString().trim().split("\n").filter(Boolean);
  } catch {
    return [];
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** fn's rejection (it must reject), for assertions on it. */
async function rejection(fn) {
  try {
    const v = await fn();
    assert.fail(`no rejection; resolved with ${JSON.stringify(v)}`);
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e;
    return e;
  }
}

async function startServer() {
  const log = fs.openSync(logPath, "a");
  const p = spawn(
    capsule,
    ["serve", "--socket", sock, "--capacity", "1", "--source", pub, "--transfer-dir", xfer, "--workspace", proj,
      "--cpus", "1", "--memory", "512", "--max-cpus", "2", "--max-memory", "1024"],
    { env, stdio: ["ignore", log, log] },
  );
  fs.closeSync(log);
  const exited = new Promise((r) => p.once("exit", (code, sig) => r({ code, sig })));
  p.exited = exited;
  for (let i = 0; i < 600; i++) {
    if (p.exitCode !== null) throw new Error(`capsule serve exited with ${p.exitCode}:\n${logTail()}`);
    try {
      const probe = await Client.connect(sock, { connectTimeoutMs: 2000 });
      await probe.close();
      return p;
    } catch {
      await sleep(100);
    }
  }
  throw new Error(`capsule serve did not listen on ${sock}:\n${logTail()}`);
}

before(async () => {
  for (const d of [pub, xfer, proj]) fs.mkdirSync(d, { recursive: true });
  fs.writeFileSync(path.join(pub, "README.txt"), "public data for every visitor\n");
  fs.mkdirSync(path.join(pub, "docs"));
  fs.writeFileSync(path.join(pub, "docs", "a.txt"), "alpha\n");
  fs.writeFileSync(path.join(proj, "main.c"), "int main(void) { return 0; }\n");
  // The loopback registry, with one small image (for imageCheck).
  regPort = await freePort();
  execFileSync(registry, ["start", String(regPort)], { env, stdio: "ignore" });
  const tree = path.join(rt, "tree");
  fs.mkdirSync(path.join(tree, "etc"), { recursive: true });
  fs.writeFileSync(path.join(tree, "etc", "hello"), "hello\n");
  imageRef = `127.0.0.1:${regPort}/ts/tiny:1`;
  imageDigest = execFileSync(registry, ["push-dir", tree, imageRef], { env }).toString().trim().split("\n").pop();
  server = await startServer();
  c = await Client.connect(sock);
});

after(async () => {
  if (c) await c.close();
  if (server && server.exitCode === null) {
    server.kill("SIGTERM");
    if ((await exitWithin(server, 60_000)).code === "hung") server.kill("SIGKILL");
  }
  for (const pid of qemuPids()) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {}
  }
  try {
    execFileSync(registry, ["stop", String(regPort)], { env, stdio: "ignore" });
  } catch {}
  fs.rmSync(rt, { recursive: true, force: true });
});

// -- the package ---------------------------------------------------------------

test("the package loads by its name as ESM and as CommonJS, with the same methods and error classes", () => {
  const cjs = createRequire(import.meta.url)("capsule-client");
  assert.notEqual(cjs.Client, esm.Client, "two builds, not one re-exported");
  assert.deepEqual(Object.keys(cjs.METHODS), Object.keys(METHODS));
  assert.deepEqual(Object.keys(cjs).sort(), Object.keys(esm).sort());
  for (const name of ["ParseError", "InvalidRequest", "MethodNotFound", "InvalidParams", "SandboxFailed", "Busy", "ToolRefused", "Cancelled"]) {
    assert.equal(cjs[name].code, esm[name].code, name);
    assert.ok(new esm[name](esm[name].code, "m") instanceof CapsuleError, name);
  }
  assert.ok(new CallTimeout(null, "t") instanceof Cancelled);
  const main = JSON.parse(fs.readFileSync(path.join(pkg, "package.json"), "utf8"));
  assert.deepEqual(main.dependencies ?? {}, {}, "no runtime dependency");
});

test("errorFrom: one class per code; -32001 always retryable, others when data.retryable says so", () => {
  assert.ok(errorFrom({ code: -32001, message: "b" }) instanceof Busy);
  assert.equal(errorFrom({ code: -32001, message: "b" }).retryable, true);
  assert.equal(errorFrom({ code: -32000, message: "m" }).retryable, false);
  assert.equal(errorFrom({ code: -32000, message: "m", data: { retryable: true, phase: "image" } }).retryable, true);
  assert.equal(errorFrom({ code: -32000, message: "m", data: { phase: "image" } }).phase, "image");
  const plain = errorFrom({ code: -1, message: "m" });
  assert.equal(plain.constructor, CapsuleError);
  assert.equal(plain.code, -1);
  assert.equal(errorFrom("nonsense").code, null);
});

test("defaultSocketPath: $CAPSULE_HOME, else $XDG_DATA_HOME/capsule, else ~/.local/share/capsule", () => {
  assert.equal(defaultSocketPath({ CAPSULE_HOME: "/h" }), "/h/serve.sock");
  assert.equal(defaultSocketPath({ XDG_DATA_HOME: "/x", HOME: "/u" }), "/x/capsule/serve.sock");
  assert.equal(defaultSocketPath({ XDG_DATA_HOME: "rel", HOME: "/u" }), "/u/.local/share/capsule/serve.sock");
});

test("connect to a socket nobody listens on: ConnectionLost naming the path", async () => {
  const where = path.join(rt, "nobody.sock");
  const e = await rejection(() => Client.connect(where));
  assert.ok(e instanceof ConnectionLost, String(e));
  assert.ok(e.message.includes(where), e.message);
  assert.equal(e.code, null);
});

// -- preparation, with progress -------------------------------------------------

test("prepare: progress notifications for this call, in order, done never going down, then the result", async () => {
  const seen = [];
  let id = null;
  const r = await c.prepare({ onProgress: (p) => seen.push(p), onRequestId: (i) => (id = i) });
  assert.equal(r.prepared, true);
  assert.ok(Array.isArray(r.built));
  assert.ok(seen.length >= 4, `${seen.length} notifications: ${JSON.stringify(seen)}`);
  assert.ok(seen.every((p) => p.request === id && p.total === 4), JSON.stringify(seen));
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].done >= seen[i - 1].done, JSON.stringify(seen));
  const last = seen.filter((p) => p.status !== "line").pop();
  assert.deepEqual([last.phase, last.status, last.done], ["template", "ready", 4]);
  assert.deepEqual(
    seen.filter((p) => p.status === "ready").map((p) => p.phase),
    ["kernel", "initramfs", "image", "template"],
  );
});

test("prepareStream: the progress as an async iterable, then its result; nothing left to build", async () => {
  const s = c.prepareStream();
  const phases = [];
  for await (const p of s) if (p.status === "ready") phases.push(p.phase);
  const r = await s.result;
  assert.deepEqual(r.built, []);
  assert.equal(r.template, true);
  assert.deepEqual(phases, ["kernel", "initramfs", "image", "template"]);
});

// -- a visitor's tool calls --------------------------------------------------------

test("a visitor's first tool call makes its sandbox: readFile of a public file", async () => {
  assert.equal((await c.status(WHO)).state, "none");
  assert.equal(qemuPids().length, 0);
  const f = await c.readFile(WHO, "README.txt");
  assert.equal(f.kind, "file");
  assert.equal(f.content, "public data for every visitor\n");
  assert.match(f.sandbox, /^v-/);
  const st = await c.status(WHO);
  assert.equal(st.state, "running");
  assert.equal(st.sandbox, f.sandbox);
});

test("readFile of a directory, and listDirectory of the public data", async () => {
  const d = await c.readFile(WHO, "docs");
  assert.equal(d.kind, "directory");
  assert.deepEqual(d.entries.map((e) => [e.name, e.type, e.size]), [["a.txt", "file", 6]]);
  const l = await c.listDirectory(WHO, { root: "public" });
  assert.deepEqual(l.entries.map((e) => e.name).sort(), ["README.txt", "docs"]);
  assert.equal(l.truncated, false);
});

test("exec: stdout, stderr, exit code, env, cwd and stdin", async () => {
  const r = await c.exec(WHO, ["sh", "-c", 'echo "$GREETING from $(pwd)"; cat; echo oops >&2; exit 3'], {
    env: { GREETING: "hello" },
    cwd: "/tmp",
    stdin: "fed in\n",
  });
  assert.equal(r.exit_code, 3);
  assert.equal(r.signal, null);
  assert.equal(r.stdout, "hello from /tmp\nfed in\n");
  assert.equal(r.stderr, "oops\n");
  assert.equal(r.timed_out, false);
  assert.equal(r.durable, true);
  assert.ok(r.duration_ms >= 0);
});

test("exec: a command killed by a signal, and one over its own timeout", async () => {
  const k = await c.exec(WHO, ["sh", "-c", "kill -9 $$"]);
  assert.equal(k.exit_code, null);
  assert.equal(k.signal, 9);
  const t0 = Date.now();
  const t = await c.exec(WHO, ["sleep", "30"], { timeout: 1 });
  assert.equal(t.timed_out, true);
  assert.ok(Date.now() - t0 < 20_000, `${Date.now() - t0} ms`);
});

test("exec: argv must be an array of strings (refused before sending)", async () => {
  const e = await rejection(() => c.exec(WHO, "echo hi"));
  assert.ok(e instanceof TypeError, String(e));
  const f = await rejection(() => c.exec({ agent: "a" }, ["true"]));
  assert.ok(f instanceof TypeError && f.message.includes("identity"), String(f));
});

test("writeFile then readFile and listDirectory of /work", async () => {
  await c.exec(WHO, ["mkdir", "-p", "/work/notes"]);
  const w = await c.writeFile(WHO, "notes/a.txt", "héllo\n");
  assert.equal(w.bytes, 7);
  const f = await c.readFile(WHO, "notes/a.txt", { root: "workspace" });
  assert.equal(f.content, "héllo\n");
  const d = await c.listDirectory(WHO, { path: "notes", root: "workspace" });
  assert.deepEqual(d.entries.map((e) => [e.name, e.type, e.size]), [["a.txt", "file", 7]]);
});

test("upload and download: every byte value both ways, the mode kept", async () => {
  const bytes = Buffer.alloc(70_000);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7 + (i >> 8)) & 0xff;
  const u = await c.upload(WHO, "blob.bin", bytes, { mode: 0o750 });
  assert.equal(u.bytes, bytes.length);
  assert.equal(u.files, 1);
  const m = await c.exec(WHO, ["stat", "-c", "%a %s", "/work/blob.bin"]);
  assert.equal(m.stdout, `750 ${bytes.length}\n`);
  const d = await c.download(WHO, "blob.bin");
  assert.ok(Buffer.isBuffer(d.content));
  assert.ok(d.content.equals(bytes), "the bytes came back unchanged");
  assert.equal(d.bytes, bytes.length);
  assert.equal("content_base64" in d, false);
  const s = await c.upload(WHO, "text.txt", "plain ✓\n");
  assert.equal(s.bytes, Buffer.byteLength("plain ✓\n"));
});

test("upload {from} a tree in a --transfer-dir and download it {to} another", async () => {
  const src = path.join(xfer, "in");
  fs.mkdirSync(path.join(src, "sub"), { recursive: true });
  fs.writeFileSync(path.join(src, "a.csv"), "a,b\n1,2\n");
  fs.writeFileSync(path.join(src, "sub", "b.txt"), "bee\n");
  const u = await c.upload(WHO, "dataset", { from: src });
  assert.equal(u.files, 2);
  const to = path.join(xfer, "out");
  const d = await c.download(WHO, "dataset", { to });
  assert.equal(d.files, 2);
  assert.equal(fs.readFileSync(path.join(to, "sub", "b.txt"), "utf8"), "bee\n");
  const e = await rejection(() => c.upload(WHO, "x", { from: "/etc" }));
  assert.ok(e instanceof InvalidParams, String(e));
  assert.ok(e.message.includes("/etc"), e.message);
});

test("an inline upload over 16 MiB is refused before sending, saying what to do", async () => {
  const e = await rejection(() => c.upload(WHO, "big", Buffer.alloc(INLINE_MAX + 1)));
  assert.ok(e instanceof InvalidParams, String(e));
  assert.equal(e.data.local, true);
  assert.match(e.message, /transfer-dir/);
});

test("errors: ToolRefused for a file that is not text, InvalidParams for a path out of its root or bad params, MethodNotFound, all with their codes", async () => {
  const r = await rejection(() => c.readFile(WHO, "blob.bin", { root: "workspace" }));
  assert.ok(r instanceof ToolRefused, String(r));
  assert.equal(r.code, -32002);
  assert.match(r.message, /blob\.bin/);
  const up = await rejection(() => c.readFile(WHO, "../etc/shadow"));
  assert.ok(up instanceof InvalidParams && /\.\./.test(up.message), String(up));
  const p = await rejection(() => c.call("exec", { identity: WHO }));
  assert.ok(p instanceof InvalidParams, String(p));
  assert.equal(p.retryable, false);
  const m = await rejection(() => c.call("no.such.method"));
  assert.ok(m instanceof MethodNotFound, String(m));
  assert.equal(m.code, -32601);
});

test("Busy: every slot held by a running call, another identity's call is refused, retryable", async () => {
  const hold = c.exec(WHO, ["sleep", "3"]);
  await sleep(500);
  const e = await rejection(() => c.exec(OTHER, ["true"]));
  assert.ok(e instanceof Busy, String(e));
  assert.equal(e.code, -32001);
  assert.equal(e.retryable, true);
  assert.equal((await hold).exit_code, 0);
});

test("many calls in flight on one connection, each answered to its own caller", async () => {
  const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => c.exec(WHO, ["sh", "-c", `sleep 0.$((${i} % 3)); echo ${i}`])));
  assert.deepEqual(rs.map((r) => r.stdout), ["0\n", "1\n", "2\n", "3\n", "4\n", "5\n"]);
});

// -- cancellation ---------------------------------------------------------------------

test("an AbortSignal cancels a call: Cancelled with the signal's reason, the command killed, the sandbox usable", async () => {
  const ac = new AbortController();
  const t0 = Date.now();
  setTimeout(() => ac.abort(new Error("the visitor left")), 700);
  const e = await rejection(() => c.exec(WHO, ["sh", "-c", "echo started > /work/cancel.txt; sleep 60; echo finished >> /work/cancel.txt"], { signal: ac.signal }));
  assert.ok(e instanceof Cancelled && !(e instanceof CallTimeout), String(e));
  assert.equal(e.code, -32800, "the server confirmed");
  assert.equal(e.cause?.message, "the visitor left");
  assert.ok(Date.now() - t0 < 15_000, `${Date.now() - t0} ms`);
  const r = await c.exec(WHO, ["sh", "-c", "sleep 1; cat /work/cancel.txt; pgrep -x sleep || echo none"]);
  assert.equal(r.stdout, "started\nnone\n");
});

test("an already aborted signal: Cancelled before anything is sent", async () => {
  const e = await rejection(() => c.exec(WHO, ["true"], { signal: AbortSignal.abort("no") }));
  assert.ok(e instanceof Cancelled, String(e));
  assert.equal(e.code, null);
});

test("callTimeoutMs: CallTimeout (a Cancelled), the server confirming the cancellation", async () => {
  const t0 = Date.now();
  const e = await rejection(() => c.exec(WHO, ["sleep", "60"], { callTimeoutMs: 800 }));
  assert.ok(e instanceof CallTimeout, String(e));
  assert.ok(e instanceof Cancelled);
  assert.equal(e.code, -32800);
  assert.match(e.message, /800 ms/);
  assert.ok(Date.now() - t0 < 15_000, `${Date.now() - t0} ms`);
  assert.equal((await c.exec(WHO, ["echo", "after"])).stdout, "after\n");
});

test("cancel(id) by the id onRequestId gave", async () => {
  let id = null;
  const call = c.exec(WHO, ["sleep", "60"], { onRequestId: (i) => (id = i) });
  await sleep(500);
  assert.equal(await c.cancel(id), true);
  const e = await rejection(() => call);
  assert.ok(e instanceof Cancelled, String(e));
  assert.equal(await c.cancel(999_999), false);
});

// -- sizes --------------------------------------------------------------------------

test("setSize: a bad size refused at the call naming the bound; a good one pending on a running VM", async () => {
  const e = await rejection(() => c.setSize(WHO, { cpus: 3 }));
  assert.ok(e instanceof InvalidParams, String(e));
  assert.match(e.message, /--max-cpus/);
  const m = await rejection(() => c.setSize(WHO, { memory_mib: 4096 }));
  assert.match(m.message, /--max-memory/);
  assert.ok((await rejection(() => c.setSize(WHO, {}))) instanceof TypeError);
  const r = await c.setSize(WHO, { memory_mib: 768 });
  assert.equal(r.size.memory_mib, 768);
  assert.deepEqual(r.size.override, { memory_mib: 768 });
  assert.equal(r.size.pending, true);
  assert.match(r.size.note, /next start/);
  const st = await c.status(WHO);
  assert.equal(st.size.memory_mib, 768);
  assert.equal(st.size.running.memory_mib, 512);
});

test("setSize: applied at the next start, shown by status; exec's size checked and kept before it runs", async () => {
  assert.equal((await c.stop(WHO)).state, "stopped");
  const r = await c.exec(WHO, ["sh", "-c", "awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo"]);
  const total = Number(r.stdout.trim());
  assert.ok(total > 600 && total <= 768, `MemTotal ${total} MiB`);
  const st = await c.status(WHO);
  assert.deepEqual([st.size.running.memory_mib, st.size.pending], [768, false]);
  const bad = await rejection(() => c.exec(OTHER, ["true"], { size: { cpus: 9 } }));
  assert.ok(bad instanceof InvalidParams, String(bad));
  assert.equal((await c.status(OTHER)).state, "none", "nothing made for a refused size");
  const x = await c.exec(OTHER, ["nproc"], { size: { cpus: 2 } });
  assert.equal(x.stdout, "2\n");
  assert.equal(x.size.cpus, 2);
});

// -- the workspace --------------------------------------------------------------------

test("diff and merge: a change in /workspace, merged into the server's --workspace", async () => {
  await c.exec(WHO, ["sh", "-c", "echo fixed >> /workspace/main.c && echo new > /workspace/NEW.md"]);
  const d = await c.diff(WHO);
  assert.deepEqual(d.changes.map((x) => [x.path, x.change]).sort(), [["NEW.md", "added"], ["main.c", "modified"]]);
  const dry = await c.merge(WHO, { dry_run: true });
  assert.equal(dry.dry_run, true);
  assert.equal(fs.existsSync(path.join(proj, "NEW.md")), false, "a dry run writes nothing");
  const m = await c.merge(WHO);
  assert.equal(m.written, 2);
  assert.equal(fs.readFileSync(path.join(proj, "NEW.md"), "utf8"), "new\n");
  assert.match(fs.readFileSync(path.join(proj, "main.c"), "utf8"), /fixed\n$/);
});

// -- images ---------------------------------------------------------------------------

test("imageCheck: the loopback registry's image read without a layer pulled", async () => {
  const r = await c.imageCheck(imageRef);
  assert.equal(r.reference, imageRef);
  assert.equal(r.platform, "linux/amd64");
  assert.equal(r.index, false);
  assert.equal(r.platform_digest, imageDigest);
  assert.equal(r.layer_count, 1);
  assert.equal(r.layers.length, 1);
  assert.equal(r.compressed_bytes, r.layers[0].size_bytes);
  assert.deepEqual([r.config.os, r.config.architecture], ["linux", "amd64"]);
  const missing = await rejection(() => c.imageCheck(`127.0.0.1:${regPort}/ts/none:1`));
  assert.ok(missing instanceof ToolRefused, String(missing));
  assert.equal(missing.data.reason, "not_found");
  assert.equal(missing.retryable, false);
});

test("imageCheck: an unreachable registry is ToolRefused, offline, retryable; a malformed reference InvalidParams", async () => {
  const port = await freePort();
  const e = await rejection(() => c.imageCheck(`127.0.0.1:${port}/ts/tiny:1`, { timeout: 3 }));
  assert.ok(e instanceof ToolRefused, String(e));
  assert.equal(e.data.reason, "offline");
  assert.equal(e.retryable, true);
  const bad = await rejection(() => c.imageCheck("UPPER CASE::"));
  assert.ok(bad instanceof InvalidParams, String(bad));
});

// -- the controller ---------------------------------------------------------------------

test("list, info, stop and remove", async () => {
  const info = await c.info();
  assert.equal(info.source, pub);
  assert.equal(info.workspace, proj);
  assert.deepEqual(info.transfer_dirs, [xfer]);
  assert.equal(info.capacity, 1);
  const l = await c.list();
  assert.deepEqual(l.sandboxes.map((s) => `${s.agent}/${s.peer}`).sort(), ["ts/one", "ts/two"]);
  assert.equal(l.capacity, 1);
  const name = (await c.status(OTHER)).sandbox;
  assert.equal((await c.stop({ sandbox: name })).state, "stopped");
  assert.equal((await c.remove(OTHER)).state, "removed");
  assert.equal((await c.status(OTHER)).state, "none");
  assert.equal((await c.remove(OTHER)).state, "none");
});

test("close(): a waiting call rejects with ConnectionLost, and the server cancels it", async () => {
  const c2 = await Client.connect(sock);
  const call = c2.exec(WHO, ["sh", "-c", "sleep 60; echo late > /work/late.txt"]).then(
    (v) => v,
    (e) => e,
  );
  await sleep(700);
  await c2.close();
  const e = await call;
  assert.ok(e instanceof ConnectionLost, String(e));
  assert.equal(c2.closed, true);
  assert.ok((await rejection(() => c2.info())) instanceof ConnectionLost);
  let st;
  for (let i = 0; i < 100; i++) {
    st = await c.status(WHO);
    if (st.active === 0) break;
    await sleep(100);
  }
  assert.equal(st.active, 0, JSON.stringify(st));
  assert.equal((await c.exec(WHO, ["sh", "-c", "test -e /work/late.txt && echo yes || echo no"])).stdout, "no\n");
});

// -- a fake server: what a real one does not do on demand ------------------------------

/** A server on its own socket answering each request line with script(req, sock). */
async function fake(script) {
  const where = path.join(rt, `fake-${Math.random().toString(36).slice(2)}.sock`);
  const srv = net.createServer((s) => {
    let buf = "";
    s.on("data", (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        script(JSON.parse(line), s);
      }
    });
    s.on("error", () => {});
  });
  await new Promise((r) => srv.listen(where, r));
  return { where, close: () => new Promise((r) => srv.close(r)) };
}

test("a connection the server drops mid-call: ConnectionLost for every waiting call", async () => {
  const f = await fake((req, s) => req.method === "exec" && s.destroy());
  const k = await Client.connect(f.where);
  const [a, b] = await Promise.allSettled([k.info(), k.exec(WHO, ["true"])]);
  assert.ok(a.reason instanceof ConnectionLost && b.reason instanceof ConnectionLost, `${a.reason} ${b.reason}`);
  await k.close();
  await f.close();
});

test("a line that is not JSON drops the connection, saying so; an error with id null reaches every waiting call", async () => {
  const f = await fake((req, s) => s.write(req.method === "info" ? "this is not json\n" : ""));
  const k = await Client.connect(f.where);
  const e = await rejection(() => k.info());
  assert.ok(e instanceof ConnectionLost && /not JSON/.test(e.message), String(e));
  await k.close();
  await f.close();
  let n = 0;
  const g = await fake((req, s) => ++n === 2 && s.write(JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32700, message: "parse error" } }) + "\n"));
  const k2 = await Client.connect(g.where);
  const [x, y] = await Promise.allSettled([k2.info(), k2.list()]);
  assert.ok(x.reason instanceof esm.ParseError && y.reason instanceof esm.ParseError, `${x.reason} ${y.reason}`);
  await k2.close();
  await g.close();
});

test("progress from a server that fails a phase: the callback's throw ignored, SandboxFailed with its phase, retryable", async () => {
  const f = await fake((req, s) => {
    const say = (o) => s.write(JSON.stringify(o) + "\n");
    say({ jsonrpc: "2.0", method: "progress", params: { request: req.id, phase: "kernel", status: "ready", done: 1, total: 4 } });
    say({ jsonrpc: "2.0", method: "progress", params: { request: 12345, phase: "kernel", status: "ready", done: 1, total: 4 } });
    say({ jsonrpc: "2.0", id: req.id, error: { code: -32000, message: "image: no space", data: { phase: "image", retryable: true } } });
  });
  const k = await Client.connect(f.where);
  const seen = [];
  const e = await rejection(() => k.prepare({ onProgress: (p) => { seen.push(p.phase); throw new Error("a buggy callback"); } }));
  assert.ok(e instanceof SandboxFailed, String(e));
  assert.equal(e.phase, "image");
  assert.equal(e.retryable, true);
  assert.deepEqual(seen, ["kernel"], "only this call's progress");
  await k.close();
  await f.close();
});

// -- the example ----------------------------------------------------------------------

test("examples/agent-backend.mjs against this server: prepares with a progress bar, serves a visitor", async () => {
  const out = await new Promise((resolve) => {
    const p = spawn(process.execPath, [path.join(pkg, "examples", "agent-backend.mjs"), sock, "--visitor", "example", "--remove"], { env });
    let text = "";
    p.stdout.on("data", (d) => (text += d));
    p.stderr.on("data", (d) => (text += d));
    p.on("exit", (code) => resolve({ code, text }));
  });
  assert.equal(out.code, 0, out.text);
  const lines = out.text.split("\n");
  assert.ok(lines.includes("[########################] 4/4 template ready"), out.text);
  assert.ok(lines.includes("visitor example: sandbox none"), out.text);
  assert.match(out.text, /read \/source\/README\.txt in sandbox v-\S+: "public data for every visitor"/);
  assert.match(out.text, /exec: exit 0 in \d+ ms: kernel \S+-capsule, uid 1000, in \/work/);
  assert.match(out.text, /uploaded 32 bytes; downloaded 19: "2\\n[0-9a-f]{16}\\n"/);
  assert.match(out.text, /gave up on a slow call: CallTimeout/);
  assert.match(out.text, /removed: removed/);
  assert.equal((await c.status(["support-bot", "example"])).state, "none");
});

test("SIGTERM: the server ends with exit 0, no QEMU of this home left", async () => {
  await c.close();
  c = null;
  server.kill("SIGTERM");
  const { code } = await exitWithin(server, 60_000);
  assert.equal(code, 0, logTail());
  for (let i = 0; i < 50 && qemuPids().length; i++) await sleep(100);
  assert.deepEqual(qemuPids(), []);
});
