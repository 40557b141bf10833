#!/usr/bin/env node
// What a Node.js agent backend does with capsule: get the server ready
// with a progress bar, then serve a visitor's tool calls in a sandbox of
// their own, made on their first call: read a public file, run a
// command, upload a file and download what the command made of it.
//
//     capsule serve --source DIR &          (any flags; --source gives /source)
//     node clients/typescript/examples/agent-backend.mjs [SOCKET] [--visitor ID] [--remove]
//
// SOCKET defaults to $CAPSULE_HOME/serve.sock, as capsule serve's own
// default. The client is imported from this checkout's build
// (clients/typescript/dist, made by `npm run build` there, which `make
// test` runs); an application imports "capsule-client" instead.
import { randomBytes } from "node:crypto";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
let capsule;
try {
  capsule = await import(pathToFileURL(path.join(here, "..", "dist", "esm", "index.js")).href);
} catch (e) {
  console.error(`agent-backend: the client is not built (${e.code ?? e.message}): run \`npm ci && npm run build\` in clients/typescript`);
  process.exit(2);
}
const { CallTimeout, CapsuleError, Client, ConnectionLost, defaultSocketPath } = capsule;

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const v = args[i + 1];
  args.splice(i, 2);
  return v;
};
const removeAt = args.indexOf("--remove");
const removeAtEnd = removeAt >= 0;
if (removeAtEnd) args.splice(removeAt, 1);
const visitor = opt("--visitor") ?? `visitor-${randomBytes(3).toString("hex")}`;
const socket = args[0] ?? defaultSocketPath();

// -- the progress bar ------------------------------------------------------------

// On a terminal, one line redrawn in place; in a pipe or a log, one line
// per phase as it starts and ends (the server's build lines left out).
function progressBar(out = process.stdout) {
  const width = 24;
  let last = "";
  return {
    show(p) {
      if (p.status === "line") return;
      const fill = Math.round((width * p.done) / p.total);
      const bar = `[${"#".repeat(fill)}${"-".repeat(width - fill)}] ${p.done}/${p.total} ${p.phase} ${p.status}`;
      if (out.isTTY) out.write(`\r${bar.padEnd(last.length)}`);
      else if (bar !== last) out.write(bar + "\n");
      last = bar;
    },
    end() {
      if (out.isTTY && last) out.write("\n");
    },
  };
}

// -- the backend -----------------------------------------------------------------

let client;
try {
  client = await Client.connect(socket);
} catch (e) {
  console.error(`agent-backend: ${e.message}`);
  process.exit(1);
}

try {
  const info = await client.info();
  console.log(`capsule serve ${info.pid} at ${socket}: image ${info.image}, public data ${info.source ?? "none (no --source)"}`);

  // Before the first visitor: kernel, initramfs, image and template.
  // Minutes the first time on a new host, nothing to do afterwards.
  const bar = progressBar();
  const ready = await client.prepare({ onProgress: (p) => bar.show(p) });
  bar.end();
  console.log(`ready in ${ready.duration_ms} ms (built now: ${ready.built.length ? ready.built.join(", ") : "nothing"})`);

  // A visitor arrives. Nothing exists for them yet; their first tool
  // call makes their sandbox (from the template: a fraction of a second).
  const who = { agent: "support-bot", peer: visitor };
  console.log(`visitor ${visitor}: sandbox ${(await client.status(who)).state}`);

  // Tool call 1: read a public file (/source, read-only, shared).
  if (info.source) {
    const top = await client.listDirectory(who, { root: "public" });
    const file = top.entries.find((e) => e.type === "file");
    if (file) {
      const f = await client.readFile(who, file.name);
      const first = (f.content ?? "").split("\n")[0];
      console.log(`read /source/${file.name} in sandbox ${f.sandbox}: ${JSON.stringify(first)}`);
    } else {
      console.log(`/source has no file at its top (${top.entries.length} entries)`);
    }
  } else {
    console.log("no public data to read: start capsule serve with --source DIR");
  }

  // Tool call 2: run a command.
  const run = await client.exec(who, ["sh", "-c", "echo kernel $(uname -r), uid $(id -u), in $(pwd)"]);
  console.log(`exec: exit ${run.exit_code} in ${run.duration_ms} ms: ${run.stdout.trim()}`);

  // Tool call 3: a file in, a command over it, its result out.
  const nonce = randomBytes(8).toString("hex");
  const upload = await client.upload(who, "inbox.txt", `order ${nonce}\nline two\n`);
  await client.exec(who, ["sh", "-c", "wc -l < /work/inbox.txt > /work/lines.txt; sha256sum /work/inbox.txt | cut -c1-16 >> /work/lines.txt"]);
  const down = await client.download(who, "lines.txt");
  console.log(`uploaded ${upload.bytes} bytes; downloaded ${down.bytes}: ${JSON.stringify(down.content.toString("utf8"))}`);

  // A call the backend will not wait for: cancelled after 1 s, the
  // sandbox untouched for the next call.
  try {
    await client.exec(who, ["sleep", "60"], { callTimeoutMs: 1000 });
  } catch (e) {
    if (!(e instanceof CallTimeout)) throw e;
    console.log(`gave up on a slow call: ${e.constructor.name} (retryable: ${e.retryable})`);
  }

  const st = await client.status(who);
  console.log(`visitor ${visitor}: sandbox ${st.sandbox} ${st.state}, ${st.size ? `${st.size.cpus} vCPU, ${st.size.memory_mib} MiB` : "size not told"}`);

  if (removeAtEnd) {
    const r = await client.remove(who);
    console.log(`removed: ${r.state}`);
  }
} catch (e) {
  if (e instanceof ConnectionLost) console.error(`agent-backend: ${e.message}`);
  else if (e instanceof CapsuleError) console.error(`agent-backend: ${e.constructor.name} ${e.code}: ${e.message} (retryable: ${e.retryable})`);
  else console.error(e);
  process.exitCode = 1;
} finally {
  await client.close();
}
