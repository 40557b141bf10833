#!/usr/bin/env python3
"""Sizes per identity (docs/serve.md, "Sizes") against a real `capsule
serve` and real VMs: the server's defaults and bounds checked at its
start; an identity's size refused at the call that gives it (naming the
field and the bound, nothing kept), a good one kept, applied at the
sandbox's next start (the guest's CPUs and memory), never to a running
VM (the answer says so, and the guest keeps its size), shown by status,
kept across a restart of serve; a disk sized once, at creation; and
serve --root, which an identity's sandbox follows from its next start. TAP.

    python3 tests/integration/test-serve-size.py build/capsule"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servelib import Connection, Home, Server, Tap, call  # noqa: E402

CAPSULE = os.path.abspath(sys.argv[1])
PLAN = 31
A = {"agent": "sizer", "peer": "alice"}
B = {"agent": "sizer", "peer": "bob"}
C = {"agent": "sizer", "peer": "carol"}

t = Tap()
home = Home("csize.")
servers = []
PROBE = ["sh", "-c", "nproc; awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo; "
         "df -m /work | awk 'NR == 2 { print $2 }'"]


def start():
    s = Server(CAPSULE, home, "--cpus", "1", "--memory", "512", "--max-cpus", "2", "--max-memory", "1024",
               "--idle-pause", "600", "--idle-stop", "3600", "--capacity", "4")
    servers.append(s)
    return s


def probe(c, ident, **kw):
    """(result, [cpus, MiB of memory the guest sees, MiB of /work]) of one exec."""
    r = call(c, "exec", dict({"identity": ident, "argv": PROBE, "timeout": 60}, **kw), timeout=300)
    try:
        return r, [int(x) for x in r["result"]["stdout"].split()]
    except (KeyError, TypeError, ValueError):
        return r, None


def near(mib, want):
    """The guest's MemTotal is its memory less what the kernel keeps."""
    return want * 0.8 < mib <= want


def err_msg(r):
    e = r.get("error") or {}
    return e.get("code"), e.get("message", "")


def status(c, ident):
    return (call(c, "status", {"identity": ident}).get("result") or {}).get("size") or {}


print(f"1..{PLAN}", flush=True)
try:
    # --- the server's own sizes, checked before it serves -------------------------
    def refused(*args):
        p = subprocess.run([CAPSULE, "serve", "--socket", os.path.join(home.rt, "x.sock"), *args],
                           env=home.env, capture_output=True, text=True, timeout=30)
        return p.returncode, p.stderr.strip()
    rc, e = refused("--cpus", "2", "--max-cpus", "1")
    t.ok(rc == 2 and "--cpus 2" in e and "--max-cpus 1" in e,
         f"serve --cpus 2 --max-cpus 1 exits 2 naming both (exit {rc}: {e})")
    rc, e = refused("--memory", "64")
    t.ok(rc == 2 and "--memory 64" in e and "128" in e, f"serve --memory 64 exits 2 naming the range (exit {rc}: {e})")
    rc, e = refused("--cpus", "two")
    t.ok(rc == 2 and "--cpus 'two'" in e, f"serve --cpus two exits 2 naming the value (exit {rc}: {e})")

    start()
    c = Connection(home.sock, timeout=300)

    # --- refused at the call, naming the bound; nothing kept ----------------------------
    r = call(c, "set_size", {"identity": A, "size": {"cpus": 3}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "size.cpus 3" in m and "--max-cpus" in m and "2" in m,
         f"set_size cpus 3 over --max-cpus 2 is refused naming the bound ({code}: {m})")
    r = call(c, "set_size", {"identity": A, "size": {"memory_mib": 2048}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "size.memory_mib 2048" in m and "--max-memory" in m,
         f"set_size memory_mib 2048 over --max-memory 1024 is refused ({code}: {m})")
    r = call(c, "set_size", {"identity": A, "size": {"memory_mib": 64}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "64" in m and "128" in m, f"memory_mib 64 is refused naming the range ({code}: {m})")
    r = call(c, "set_size", {"identity": A, "size": {"gpus": 1}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "size.gpus" in m, f"an unknown size field is refused by name ({code}: {m})")
    r = call(c, "set_size", {"identity": A, "size": {"cpus": 0}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "size.cpus" in m, f"cpus 0 is refused ({code}: {m})")
    r = call(c, "exec", {"identity": A, "argv": ["true"], "size": {"cpus": 3}})
    code, m = err_msg(r)
    st = call(c, "status", {"identity": A}).get("result") or {}
    t.ok(code == -32602 and "size.cpus 3" in m and st.get("state") == "none",
         f"exec with a bad size is refused before anything starts ({code}: {m}; state {st.get('state')})")
    sz = st.get("size") or {}
    t.ok(sz.get("cpus") == 1 and sz.get("memory_mib") == 512 and sz.get("override") == {},
         f"after the refusals status shows the server's defaults and no override ({sz})")

    # --- a good one: kept, applied at the first start, shown by status ---------------------
    r, got = probe(c, A, size={"cpus": 2, "memory_mib": 768})
    res = r.get("result") or {}
    t.ok(got is not None and got[0] == 2 and near(got[1], 768),
         f"exec with size cpus 2, memory_mib 768 runs in a VM of 2 vCPUs and ~768 MiB (guest: {got}; {r.get('error')})")
    t.ok((res.get("size") or {}).get("pending") is False and (res.get("size") or {}).get("cpus") == 2,
         f"... and its answer carries the size, not pending ({res.get('size')})")
    sz = status(c, A)
    t.ok(sz.get("cpus") == 2 and sz.get("memory_mib") == 768 and sz.get("running") == {"cpus": 2, "memory_mib": 768}
         and sz.get("override") == {"cpus": 2, "memory_mib": 768}, f"status shows size, override and running ({sz})")

    # --- a change while it runs: kept, said so, not applied -------------------------------
    r = call(c, "set_size", {"identity": A, "size": {"memory_mib": 1024}})
    sz = (r.get("result") or {}).get("size") or {}
    t.ok(sz.get("pending") is True and "next start" in (sz.get("note") or "") and sz.get("memory_mib") == 1024
         and sz.get("running", {}).get("memory_mib") == 768,
         f"set_size on a running VM says it applies at the next start ({sz or r})")
    r, got = probe(c, A)
    t.ok(got is not None and near(got[1], 768), f"the running VM is not resized (guest: {got})")
    r = call(c, "stop", {"identity": A}, timeout=120)
    t.ok("result" in r, f"stop the identity's VM ({r})")
    r, got = probe(c, A)
    t.ok(got is not None and got[0] == 2 and near(got[1], 1024),
         f"its next start has 2 vCPUs and ~1024 MiB (guest: {got}; {r.get('error')})")
    sz = status(c, A)
    t.ok(sz.get("running") == {"cpus": 2, "memory_mib": 1024} and sz.get("pending") is False,
         f"status: running 2 / 1024, nothing pending ({sz})")
    with open(os.path.join(home.home, "workspaces", "sizer", "alice", "record.json")) as f:
        rec = json.load(f)
    t.ok(rec.get("size") == {"cpus": 2, "memory_mib": 1024}, f"the identity's record keeps its override ({rec.get('size')})")

    # --- disks: sized once, at creation -------------------------------------------------------
    r = call(c, "set_size", {"identity": A, "size": {"work_mib": 1024}})
    code, m = err_msg(r)
    t.ok(code == -32602 and "size.work_mib 1024" in m and "512 MiB" in m and "remove" in m,
         f"another /work size for an existing sandbox is refused naming its size ({code}: {m})")
    r = call(c, "set_size", {"identity": B, "size": {"work_mib": 256}})
    sz = (r.get("result") or {}).get("size") or {}
    st = call(c, "status", {"identity": B}).get("result") or {}
    t.ok(sz.get("work_mib") == 256 and st.get("state") == "none",
         f"set_size before the identity's first call keeps it and starts nothing ({sz}; state {st.get('state')})")
    r, got = probe(c, B)
    t.ok(got is not None and 200 <= got[2] <= 256 and got[0] == 1,
         f"its sandbox is made with a 256 MiB /work and the default 1 vCPU (guest: {got}; {r.get('error')})")

    # --- an identity that asks for nothing gets the server's defaults --------------------------
    r, got = probe(c, C)
    t.ok(got is not None and got[0] == 1 and near(got[1], 512) and 400 <= got[2] <= 512,
         f"an identity without sizes gets --cpus 1, --memory 512 and the default /work (guest: {got})")
    sz = status(c, C)
    t.ok(sz.get("override") == {} and sz.get("cpus") == 1, f"... and status says it has no override ({sz})")

    # --- kept across a restart of serve ------------------------------------------------------------
    c.close()
    rc = servers[-1].term()
    t.ok(rc == 0, f"serve stops on SIGTERM (exit {rc})")
    start()
    c = Connection(home.sock, timeout=300)
    sz = status(c, A)
    t.ok(sz.get("cpus") == 2 and sz.get("memory_mib") == 1024 and sz.get("running") is None,
         f"a new serve shows the identity's sizes, nothing running ({sz})")
    r, got = probe(c, A)
    t.ok(got is not None and got[0] == 2 and near(got[1], 1024), f"... and starts it with them (guest: {got})")
    r = call(c, "exec", {"identity": A, "argv": ["id", "-u"], "timeout": 60}, timeout=300)
    t.ok((r.get("result") or {}).get("stdout") == "1000\n", f"without --root, commands run as the tool user ({r})")
    c.close()
    rc = servers[-1].term()
    t.ok(rc == 0 and not home.qemu_pids(), f"serve stops every VM (exit {rc}, QEMU left: {home.qemu_pids()})")

    # --- serve --root: the server's choice, which its sandboxes follow --------------------------
    servers.append(Server(CAPSULE, home, "--root", "--idle-pause", "600", "--idle-stop", "3600"))
    c = Connection(home.sock, timeout=300)
    r = call(c, "exec", {"identity": A, "argv": ["sh", "-c", "id -u; echo $USER"], "timeout": 60}, timeout=300)
    with open(os.path.join(home.home, "workspaces", "sizer", "alice", "record.json")) as f:
        name_a = json.load(f).get("sandbox", "?")
    with open(os.path.join(home.home, "sandboxes", name_a, "record.json")) as f:
        rec = json.load(f)
    t.ok((r.get("result") or {}).get("stdout") == "0\nroot\n" and rec.get("tools_root") is True,
         f"under serve --root an identity's sandbox made before runs its commands as root from its next start "
         f"({r}; record tools_root {rec.get('tools_root')})")
    c.close()
    rc = servers[-1].term()
    t.ok(rc == 0 and not home.qemu_pids(), f"serve --root stops every VM (exit {rc}, QEMU left: {home.qemu_pids()})")
except Exception as e:  # a crash of the suite is a failure, with what it was
    t.ok(False, f"the suite ran to its end ({e!r})", home.log_tail())
finally:
    for s in servers:
        s.kill()
    for pid in home.qemu_pids():
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    if t.failed:
        print("# serve.log:\n# " + home.log_tail(30).replace("\n", "\n# "), flush=True)
    shutil.rmtree(home.rt, ignore_errors=True)
sys.exit(1 if t.failed or t.n != PLAN else 0)
