// The TypeScript client's methods as test-serve-schema.py checks them:
// its method table (METHODS), the methods of its Methods class, and the
// params each method sends when called with its positional arguments and
// every one or two of its options (recorded, not sent). Prints JSON.
//   node tests/integration/serve-schema-ts.mjs clients/typescript/dist/esm/index.js
import path from "node:path";
import { pathToFileURL } from "node:url";

const { METHODS, Methods } = await import(pathToFileURL(path.resolve(process.argv[2])).href);

// Values for each argument and option, by name; several for an argument
// that takes several shapes. A new one needs a value here: the check
// says which is missing.
const SAMPLES = {
  identity: [{ agent: "agent", peer: "peer" }],
  argv: [["true"]],
  path: ["f"],
  content: ["x"],
  source: [Buffer.from("x"), { from: "/tmp/x" }],
  target: [{ agent: "agent", peer: "peer" }, { sandbox: "v-0" }],
  id: [7],
  env: [{ A: "b" }],
  cwd: ["/"],
  timeout: [1.5],
  stdin: ["x"],
  pids_max: [8],
  durable: [false],
  root: ["workspace"],
  max_bytes: [10],
  mode: [0o755],
  to: ["/tmp/y"],
  pick: ["ours"],
  dry_run: [true],
  size: [{ cpus: 1, memory_mib: 256 }],
  ref: ["registry.example/a:b"],
  name: ["snap"],
  count: [2],
  peers: [["p1", "p2"]],
};

class Recorder extends Methods {
  sent = [];
  async call(method, params) {
    this.sent.push([method, params ?? {}]);
    return {};
  }
}

function* product(lists) {
  if (lists.length === 0) return yield [];
  for (const v of lists[0]) for (const rest of product(lists.slice(1))) yield [v, ...rest];
}

function* combos(items, k, from = 0) {
  if (k === 0) return yield [];
  for (let i = from; i < items.length; i++) for (const c of combos(items, k - 1, i + 1)) yield [items[i], ...c];
}

const out = { table: {}, prototype: [], variants: {}, unknown: {} };
out.prototype = Object.getOwnPropertyNames(Methods.prototype).filter((n) => n !== "constructor" && n !== "call" && !n.startsWith("_"));
for (const [wire, entry] of Object.entries(METHODS)) {
  out.table[wire] = entry.call;
  const fn = Methods.prototype[entry.call];
  const names = [...entry.args, ...entry.options];
  out.unknown[wire] = names.filter((n) => !(n in SAMPLES));
  out.variants[wire] = [];
  if (typeof fn !== "function" || out.unknown[wire].length) continue;
  for (const args of product(entry.args.map((a) => SAMPLES[a]))) {
    for (let k = 0; k < 3; k++) {
      for (const extra of combos(entry.options, k)) {
        const opts = Object.fromEntries(extra.map((o) => [o, SAMPLES[o][0]]));
        const r = new Recorder();
        try {
          await fn.call(r, ...args, opts);
        } catch (e) {
          if (e instanceof TypeError) continue; // a combination the method refuses (mode with {from})
          throw e;
        }
        const kw = [...entry.args.map((a, i) => `${a}=${JSON.stringify(args[i])}`), ...extra];
        for (const [method, params] of r.sent) out.variants[wire].push({ kw, method, params });
      }
    }
  }
}
process.stdout.write(JSON.stringify(out) + "\n");
