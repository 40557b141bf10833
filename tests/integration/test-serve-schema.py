#!/usr/bin/env python3
"""The clients' methods against the serve method table (`capsule serve
--schema`, src/serve/serve-methods.c): the Python client's (clients/python,
_methods.py) and the TypeScript client's (clients/typescript, the METHODS
table of src/methods.ts and its Methods class, built with tsc first). For
each: the same methods; each method's params only ones the table
declares, of the declared JSON types, the required ones always, exactly
one of a one_of pair; and every parameter the table offers a client
reachable from the client's method. Each method is called with its
required arguments and every one or two of its optional ones, its params
recorded instead of sent (for TypeScript by
tests/integration/serve-schema-ts.mjs). No VM, no server. TAP output.

    python3 tests/integration/test-serve-schema.py build/capsule"""
import inspect
import itertools
import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "clients", "python", "src"))
from capsule_client._methods import Methods  # noqa: E402

# A value for each argument the Python methods take, by name. A new
# argument needs one here: the check says which is missing.
SAMPLES = {
    "identity": ("agent", "peer"), "argv": ["true"], "env": {"A": "b"}, "cwd": "/", "timeout": 1.5,
    "stdin": "x", "pids_max": 8, "durable": False, "path": "f", "root": "workspace", "max_bytes": 10,
    "content": "x", "from_path": "/tmp/x", "mode": 0o755, "to": "/tmp/y", "pick": "ours",
    "dry_run": True, "sandbox": "v-0", "request_id": 7, "size": {"cpus": 2}, "ref": "127.0.0.1:5000/x:1",
    "name": "snap", "count": 2, "peers": ["p1", "p2"],
}
NOT_PARAMS = {"on_progress"}  # call options (docs in Methods), not params
JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
              "object": (dict,), "array": (list, tuple)}

n = 0
failed = 0


def ok(cond, name, detail=()):
    global n, failed
    n += 1
    print(f"{'ok' if cond else 'not ok'} {n} - {name}", flush=True)
    if not cond:
        failed += 1
        for line in list(detail)[:20]:
            print(f"# {line}", flush=True)


def type_ok(value, declared):
    for t in declared.split("|"):
        if isinstance(value, bool) and t in ("integer", "number"):
            continue  # a bool is an int in Python, not in JSON
        if isinstance(value, JSON_TYPES[t]):
            return True
    return False


class Recorder(Methods):
    def _invoke(self, method, params, wrap, **opts):
        self.sent.append((method, params))
        return None


def calls(name, fn):
    """(kwargs, method, params) for each way of calling fn that it takes."""
    sig = inspect.signature(fn)
    required, optional, unknown = [], [], []
    for p in list(sig.parameters.values())[1:]:
        if p.kind == p.VAR_KEYWORD or p.name in NOT_PARAMS:
            continue
        if p.name not in SAMPLES:
            unknown.append(p.name)
        elif p.default is p.empty:
            required.append(p.name)
        else:
            optional.append(p.name)
    out = []
    for k in range(3):
        for extra in itertools.combinations(optional, k):
            kw = {a: SAMPLES[a] for a in required + list(extra)}
            r = Recorder()
            r.sent = []
            try:
                fn(r, **kw)
            except TypeError:
                continue  # a combination the method refuses (upload without content)
            for method, params in r.sent:
                out.append((kw, method, params or {}))
    return out, unknown


def check_methods(client, table, served, ours, variants_of):
    """ours: the client's methods (wire names); variants_of(name): the
    (kwargs, method, params) of each way of calling it, and the arguments
    it takes that have no sample value."""
    ok(served == ours, f"the {client} client has a method for each served method, and no other",
       [f"served only: {sorted(served - ours)}", f"{client} only: {sorted(ours - served)}"])
    for name in sorted(ours & served):
        decl = table[name]["params"]
        variants, unknown = variants_of(name)
        why = [f"argument {a} has no sample value in this test" for a in unknown]
        seen = set()
        if not variants:
            why.append("no way of calling it sends a request")
        for kw, method, params in variants:
            where = f"{name}({', '.join(sorted(kw))})"
            if method != name:
                why.append(f"{where} sends method {method}")
            for key, value in params.items():
                seen.add(key)
                if key not in decl:
                    why.append(f"{where} sends params.{key}, which the table does not declare")
                elif not type_ok(value, decl[key]["type"]):
                    why.append(f"{where} sends params.{key} = {value!r}, not {decl[key]['type']}")
            for key, d in decl.items():
                if d["required"] and key not in params:
                    why.append(f"{where} leaves out params.{key}, which the table requires")
            pair = table[name].get("one_of")
            if pair and sum(k in params for k in pair) != 1:
                why.append(f"{where} sends {sum(k in params for k in pair)} of {pair}, not exactly one")
        for key, d in decl.items():
            if key not in seen and not d.get("tolerated"):
                why.append(f"params.{key} (in the table) cannot be sent by the {client} method")
        ok(not why, f"{name}: the {client} method agrees with the table", why)


def typescript():
    """The TypeScript client built, then its methods recorded: the output
    of serve-schema-ts.mjs, or None with a failure reported."""
    pkg = os.path.join(TOP, "clients", "typescript")
    if not os.path.isdir(os.path.join(pkg, "node_modules", "typescript")):
        ok(False, "the TypeScript client builds (tsc)",
           ["clients/typescript/node_modules has no typescript: run scripts/bootstrap.sh (npm ci there)"])
        return None
    try:
        b = subprocess.run(["npm", "run", "--silent", "build"], cwd=pkg, capture_output=True, text=True,
                           timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        ok(False, "the TypeScript client builds (tsc)", [str(e)])
        return None
    ok(b.returncode == 0, "the TypeScript client builds (tsc)", (b.stdout + b.stderr).splitlines())
    if b.returncode:
        return None
    try:
        r = subprocess.run(["node", os.path.join(TOP, "tests", "integration", "serve-schema-ts.mjs"),
                            os.path.join(pkg, "dist", "esm", "index.js")], capture_output=True, text=True,
                           timeout=60)
        out = json.loads(r.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        ok(False, "the TypeScript client's methods can be recorded", [str(e), *(locals().get("r") and
                                                                          r.stderr.splitlines() or [])])
        return None
    ok(True, "the TypeScript client's methods can be recorded")
    return out


def main():
    try:
        schema = json.loads(subprocess.run([sys.argv[1], "serve", "--schema"], check=True,
                                           capture_output=True, text=True, timeout=30).stdout)
        table = schema["methods"]
        ok(isinstance(table, dict) and table, "capsule serve --schema prints the method table")
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        ok(False, "capsule serve --schema prints the method table", [str(e)])
        print(f"1..{n}")
        return 1
    served = {m for m, d in table.items() if not d.get("test_only")}
    ours = {m for m, f in inspect.getmembers(Methods, inspect.isfunction) if not m.startswith("_")}
    check_methods("Python", table, served, ours, lambda name: calls(name, getattr(Methods, name)))

    ts = typescript()
    if ts is not None:
        # The table names each method's TypeScript method; the class has
        # no other.
        named = set(ts["table"].values())
        proto = set(ts["prototype"])
        ok(named == proto, "every method of the TypeScript Methods class is in its METHODS table, and back",
           [f"class only: {sorted(proto - named)}", f"table only: {sorted(named - proto)}"])
        check_methods("TypeScript", table, served, set(ts["table"]),
                      lambda name: ([(v["kw"], v["method"], v["params"]) for v in ts["variants"][name]],
                                    ts["unknown"][name]))
    print(f"1..{n}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
