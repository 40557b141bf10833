// Build dist/esm (ES modules) and dist/cjs (CommonJS) from src with the
// pinned tsc, each with its own declarations. dist/cjs gets a
// package.json of {"type": "commonjs"}: the package is "type": "module",
// so without it Node would read the CommonJS files as ES modules.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const top = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
let tsc;
try {
  tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
} catch {
  console.error("build: typescript is not installed: run `npm ci` in clients/typescript (scripts/bootstrap.sh does)");
  process.exit(1);
}
fs.rmSync(path.join(top, "dist"), { recursive: true, force: true });
for (const [config, type] of [["tsconfig.esm.json", "module"], ["tsconfig.cjs.json", "commonjs"]]) {
  try {
    execFileSync(process.execPath, [tsc, "-p", config], { cwd: top, stdio: "inherit" });
  } catch {
    console.error(`build: tsc -p ${config} failed`);
    process.exit(1);
  }
  const out = path.join(top, "dist", type === "module" ? "esm" : "cjs");
  fs.writeFileSync(path.join(out, "package.json"), JSON.stringify({ type }) + "\n");
}
