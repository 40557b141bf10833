// Drives `capsule mcp` over stdio with the official MCP TypeScript SDK
// client: tool listing, read_file on both roots and every limit, path
// escapes, non-UTF-8 and oversized files, directories, identity rules,
// cancellation. Real VMs (TCG here). Run by tests/run.sh with
// `node --test --test-reporter=tap`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const capsule = path.resolve(process.env.CAPSULE_BIN_UNDER_TEST ?? "build/capsule");
const rt = fs.mkdtempSync("/tmp/cm.");
const home = path.join(rt, "home");
const pub = path.join(rt, "pub");
const env = { ...process.env, CAPSULE_HOME: home, XDG_RUNTIME_DIR: rt };

function qemuCount() {
  try {
    return execFileSync("pgrep", ["-f", `qemu-system.*${home}/`]).toString().trim().split("\n").length;
  } catch {
    return 0;
  }
}

async function connect(args) {
  const transport = new StdioClientTransport({ command: capsule, args: ["mcp", ...args], env, stderr: "pipe" });
  const client = new Client({ name: "capsule-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

const text = (r) => r.content.map((c) => c.text).join("");
let main; // read_file only, peer fixed, public data
let tools; // every tool on, peer fixed
let meta; // no --peer: the orchestrator sets _meta

before(async () => {
  fs.mkdirSync(path.join(pub, "docs", "big"), { recursive: true });
  fs.writeFileSync(path.join(pub, "docs", "a.txt"), "hello from public\n");
  fs.writeFileSync(path.join(pub, "lines.txt"), Array.from({ length: 600 }, (_, i) => `line ${i + 1}`).join("\n") + "\n");
  fs.writeFileSync(path.join(pub, "wide.txt"), Array.from({ length: 100 }, () => "x".repeat(999)).join("\n") + "\n");
  fs.writeFileSync(path.join(pub, "long-line.txt"), "é".repeat(40000));
  fs.writeFileSync(path.join(pub, "binary.bin"), Buffer.from([0x66, 0x6f, 0xff, 0xfe, 0x00, 0x80]));
  fs.writeFileSync(path.join(pub, "three-mib.txt"), "a".repeat(3 * 1024 * 1024));
  for (let i = 0; i < 600; i++) fs.writeFileSync(path.join(pub, "docs", "big", `f${String(i).padStart(3, "0")}`), "");
  execFileSync(capsule, ["image", "build", "base"], { env, stdio: "ignore" });
  main = await connect(["--agent", "a", "--peer", "p1", "--source", pub]);
});

after(async () => {
  for (const c of [main, tools, meta]) if (c) await c.close();
  for (let i = 0; i < 100 && qemuCount() > 0; i++) await new Promise((r) => setTimeout(r, 100));
  fs.rmSync(rt, { recursive: true, force: true });
});

test("initialize and tools/list alone start no VM", async () => {
  const { tools: list } = await main.listTools();
  assert.equal(qemuCount(), 0);
  assert.deepEqual(list.map((t) => t.name), ["read_file"]);
});

test("read_file has a schema without identity, and annotations", async () => {
  const { tools: list } = await main.listTools();
  const rf = list[0];
  assert.deepEqual(Object.keys(rf.inputSchema.properties).sort(), ["limit", "offset", "path", "root"]);
  assert.deepEqual(rf.inputSchema.required, ["path"]);
  assert.equal(rf.annotations.readOnlyHint, true);
  assert.equal(rf.annotations.destructiveHint, false);
  assert.equal(rf.annotations.openWorldHint, false);
  assert.ok(!JSON.stringify(rf.inputSchema).includes("peer"));
});

test("read_file reads public data (the default root)", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "docs/a.txt" } });
  assert.equal(r.isError, false);
  assert.equal(text(r), "hello from public\n");
});

test("at most 500 lines per call, with a way to continue", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "lines.txt" } });
  const t = text(r);
  assert.match(t, /^line 1\n/);
  assert.match(t, /line 500\n/);
  assert.doesNotMatch(t, /line 501\n/);
  assert.match(t, /lines 1-500 of 600 shown; read_file with offset=501/);
  const r2 = await main.callTool({ name: "read_file", arguments: { path: "lines.txt", offset: 501 } });
  assert.match(text(r2), /^line 501\n/);
  assert.match(text(r2), /line 600\n$/);
});

test("at most 32000 characters per call", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "wide.txt" } });
  const body = text(r).split("\n[capsule:")[0];
  assert.ok(body.length <= 32000, `${body.length} characters`);
  assert.match(text(r), /truncated: lines 1-32 of 100 shown; read_file with offset=33/);
  const one = await main.callTool({ name: "read_file", arguments: { path: "long-line.txt" } });
  const start = text(one).split("\n[capsule:")[0];
  assert.equal([...start].length, 32000); // characters, not bytes
  assert.match(text(one), /longer than 32000 characters/);
});

test("limit chooses fewer lines", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "lines.txt", offset: 10, limit: 3 } });
  assert.match(text(r), /^line 10\nline 11\nline 12\n/);
});

test("a 3 MiB file is refused", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "three-mib.txt" } });
  assert.equal(r.isError, true);
  assert.match(text(r), /over the 2097152-byte limit/);
});

test("a non-UTF-8 file is refused", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "binary.bin" } });
  assert.equal(r.isError, true);
  assert.match(text(r), /not UTF-8/);
});

test("a directory is listed, at most 500 entries", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "docs" } });
  assert.equal(r.isError, false);
  assert.match(text(r), /a\.txt\t18 bytes/);
  assert.match(text(r), /big\//);
  const big = await main.callTool({ name: "read_file", arguments: { path: "docs/big" } });
  const names = text(big).split("\n").filter((l) => /^f\d{3}\t/.test(l));
  assert.equal(names.length, 500);
  assert.match(text(big), /truncated: 500 entries shown, the directory has more/);
});

test("path escapes are refused, naming the rule", async () => {
  const up = await main.callTool({ name: "read_file", arguments: { path: "../../etc/passwd" } });
  assert.equal(up.isError, true);
  assert.match(text(up), /climbs out of its root with '\.\.'/);
  const abs = await main.callTool({ name: "read_file", arguments: { path: "/etc/passwd" } });
  assert.equal(abs.isError, true);
  assert.match(text(abs), /is absolute/);
  const missing = await main.callTool({ name: "read_file", arguments: { path: "nope.txt" } });
  assert.equal(missing.isError, true);
  assert.match(text(missing), /No such file/);
});

test("disabled tools do not exist", async () => {
  await assert.rejects(main.callTool({ name: "run_command", arguments: { command: "id" } }), /unknown tool/);
});

test("the workspace root: write, read back, and a symlink out of /work is refused", async () => {
  tools = await connect(["--agent", "a", "--peer", "p2", "--source", pub, "--enable", "write_file",
    "--enable", "run_command", "--enable", "list_directory"]);
  const { tools: list } = await tools.listTools();
  assert.deepEqual(list.map((t) => t.name).sort(), ["list_directory", "read_file", "run_command", "write_file"]);
  const w = await tools.callTool({ name: "write_file", arguments: { path: "notes.md", content: "mine\n" } });
  assert.equal(w.isError, false, text(w));
  const r = await tools.callTool({ name: "read_file", arguments: { path: "notes.md", root: "workspace" } });
  assert.equal(text(r), "mine\n");
  const ln = await tools.callTool({ name: "run_command", arguments: { command: "ln -s /etc /work/esc && ln -s notes.md /work/inside && id -u" } });
  assert.equal(ln.isError, false, text(ln));
  assert.match(text(ln), /exit code 0/);
  assert.equal(ln.structuredContent.stdout, "1000\n");
  const esc = await tools.callTool({ name: "read_file", arguments: { path: "esc/passwd", root: "workspace" } });
  assert.equal(esc.isError, true);
  assert.match(text(esc), /resolves outside \/work/);
  const ok = await tools.callTool({ name: "read_file", arguments: { path: "inside", root: "workspace" } });
  assert.equal(text(ok), "mine\n");
  const ls = await tools.callTool({ name: "list_directory", arguments: { root: "workspace" } });
  assert.match(text(ls), /notes\.md\t5 bytes/);
  const pubw = await tools.callTool({ name: "write_file", arguments: { path: "../source/x", content: "x" } });
  assert.equal(pubw.isError, true);
});

test("peers do not see each other's workspace", async () => {
  const r = await main.callTool({ name: "read_file", arguments: { path: "notes.md", root: "workspace" } });
  assert.equal(r.isError, true);
  assert.match(text(r), /No such file/);
});

test("cancelling a call kills it in the guest; the sandbox stays usable", async () => {
  const ac = new AbortController();
  const started = Date.now();
  const p = tools.callTool({ name: "run_command", arguments: { command: "sleep 100" } }, undefined, { signal: ac.signal });
  setTimeout(() => ac.abort(), 1000);
  await assert.rejects(p);
  const r = await tools.callTool({ name: "run_command", arguments: { command: "echo after" } });
  assert.match(text(r), /after/);
  assert.ok(Date.now() - started < 30000);
});

test("the peer comes from _meta set by the orchestrator, and is required", async () => {
  meta = await connect(["--agent", "a", "--source", pub]);
  await assert.rejects(meta.callTool({ name: "read_file", arguments: { path: "docs/a.txt" } }), /no peer identity/);
  const r = await meta.callTool({ name: "read_file", arguments: { path: "notes.md", root: "workspace" },
    _meta: { "capsule/peer": "p2" } });
  assert.equal(text(r), "mine\n");
});
