#!/usr/bin/env python3
"""Bench row for `capsule mcp` (issue 6): read_file of a 100 KiB file
through MCP on a warm sandbox, against `capsule exec NAME -- cat` of the
same file in the same sandbox, in the same run. Prints "read_file MS BASE"."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

capsule = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
rt = tempfile.mkdtemp(prefix="bm.", dir="/tmp")
env = dict(os.environ, CAPSULE_HOME=os.path.join(rt, "home"), XDG_RUNTIME_DIR=rt)
pub = os.path.join(rt, "pub")
os.makedirs(pub)
with open(os.path.join(pub, "f.txt"), "w") as f:
    f.write(("x" * 99 + "\n") * 1024)  # 100 KiB of text
subprocess.run([capsule, "image", "build", "base"], env=env, capture_output=True, check=True)
p = subprocess.Popen([capsule, "mcp", "--agent", "bench", "--peer", "p", "--source", pub], env=env,
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
next_id = 0


def call(method, params):
    global next_id
    next_id += 1
    p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}) + "\n").encode())
    p.stdin.flush()
    while True:
        m = json.loads(p.stdout.readline())
        if m.get("id") == next_id:
            return m


try:
    call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}})
    args = {"name": "read_file", "arguments": {"path": "f.txt"}}
    assert not call("tools/call", args)["result"]["isError"]  # warm: the VM is up
    name = subprocess.run([capsule, "ls"], env=env, capture_output=True, text=True).stdout.split("\n")[1].split()[0]
    mcp, cat = [], []
    for _ in range(runs):
        t = time.perf_counter()
        call("tools/call", args)
        mcp.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        subprocess.run([capsule, "exec", name, "--", "cat", "/source/f.txt"], env=env, capture_output=True, check=True)
        cat.append((time.perf_counter() - t) * 1000)
    print(f"read_file {statistics.median(mcp):.1f} {statistics.median(cat):.1f}")
finally:
    p.stdin.close()
    p.wait(timeout=60)
    subprocess.run(["rm", "-rf", rt])
