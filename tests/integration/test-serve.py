#!/usr/bin/env python3
"""Black-box tests of `capsule serve` with real VMs: identities and their
sandboxes, serialization, the idle lifecycle (manual clock, and real time
with lowered settings), capacity, cancellation, crash recovery, shutdown.
TAP output. CAPSULE_WALLCLOCK=1 runs the lifecycle test in real time with
the default durations (about ten minutes)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from serve_client import Client  # noqa: E402

CAPSULE = os.path.abspath(sys.argv[1])
RT = tempfile.mkdtemp(prefix="cs.", dir="/tmp")
HOME = os.path.join(RT, "home")
ENV = dict(os.environ, CAPSULE_HOME=HOME, XDG_RUNTIME_DIR=RT)
SOCK = os.path.join(RT, "serve.sock")
WALL = os.environ.get("CAPSULE_WALLCLOCK") == "1"

n = 0
failed = 0


def ok(cond, name, detail=""):
    global n, failed
    n += 1
    if cond:
        print(f"ok {n} - {name}", flush=True)
    else:
        failed += 1
        print(f"not ok {n} - {name}", flush=True)
        for line in str(detail).splitlines()[:20]:
            print(f"# {line}", flush=True)


def ident(peer, agent="a"):
    return {"agent": agent, "peer": peer}


def qemu_count():
    out = subprocess.run(["pgrep", "-f", f"qemu-system.*{HOME}/"], capture_output=True, text=True).stdout
    return len(out.split())


class Server:
    def __init__(self, *args):
        self.log = open(os.path.join(RT, "serve.log"), "a")
        self.proc = subprocess.Popen([CAPSULE, "serve", "--socket", SOCK, *args], env=ENV,
                                     stdout=self.log, stderr=self.log)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                Client(SOCK, timeout=5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("capsule serve did not start")

    def client(self):
        return Client(SOCK)

    def term(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill9(self):
        self.proc.kill()
        self.proc.wait()


def exec_(c, peer, script, **kw):
    p = {"identity": ident(peer), "argv": ["sh", "-c", script]}
    p.update(kw)
    return c.call("exec", p)


def state(c, peer):
    return c.call("status", {"identity": ident(peer)})["result"]["state"]


def wait_state(c, peer, want, seconds):
    deadline = time.time() + seconds
    s = None
    while time.time() < deadline:
        s = state(c, peer)
        if s == want:
            return s
        time.sleep(0.1)
    return s


def cleanup():
    subprocess.run(["pkill", "-KILL", "-f", f"capsule serve --socket {SOCK}"])
    for d in (os.listdir(os.path.join(HOME, "sandboxes")) if os.path.isdir(os.path.join(HOME, "sandboxes")) else []):
        subprocess.run(["pkill", "-KILL", "-f", f"capsule shim --ready-fd=3 {d}$"])
    time.sleep(0.3)
    if failed:
        log = os.path.join(RT, "serve.log")
        if os.path.exists(log):
            for line in open(log).read().splitlines()[-int(os.environ.get('SERVE_LOG_LINES', '30')):]:
                print(f"# serve.log: {line}", flush=True)
    shutil.rmtree(RT, ignore_errors=True)


def main():
    print("1..41", flush=True)
    subprocess.run([CAPSULE, "image", "build", "base"], env=ENV, capture_output=True, check=True)

    # --- identities -----------------------------------------------------------
    s = Server("--test-clock")
    c = s.client()
    r = c.call("status", {"identity": ident("p1")})
    r2 = c.call("list")
    ok(r["result"]["state"] == "none" and r2["result"]["sandboxes"] == [] and qemu_count() == 0,
       "status and list alone start no VM", r)

    r = exec_(c, "p1", "echo hello; id -u; echo secret > /work/secret")
    res = r.get("result", {})
    ok(res.get("stdout") == "hello\n1000\n" and res.get("exit_code") == 0,
       "first call for (a, p1) creates its sandbox and runs as UID 1000", r)
    name1 = res.get("sandbox")
    pid_before = subprocess.run(["pgrep", "-f", f"qemu-system.*{name1}"], capture_output=True, text=True).stdout
    r = exec_(c, "p1", "cat /work/secret")
    pid_after = subprocess.run(["pgrep", "-f", f"qemu-system.*{name1}"], capture_output=True, text=True).stdout
    ok(r["result"]["sandbox"] == name1 and r["result"]["stdout"] == "secret\n" and pid_before == pid_after,
       "a second call reuses the same sandbox and VM", r)
    st = c.call("status", {"identity": ident("p1")})["result"]
    ok(st["sandbox"] == name1 and st["state"] == "running", "status names the sandbox, running", st)

    # Peer separation: B sees nothing of A, and cannot name A's sandbox.
    r = exec_(c, "p2", "cat /work/secret", sandbox=name1, cwd="/work")
    res = r.get("result", {})
    ok(res.get("sandbox") != name1 and res.get("exit_code") != 0 and "secret\n" not in res.get("stdout", ""),
       "peer B does not see peer A's /work, even when naming A's sandbox", r)
    r = c.call("read_file", {"identity": ident("p2"), "root": "workspace", "path": "../../work/secret"})
    ok(r.get("error", {}).get("code") == -32602 and ".." in r["error"]["message"],
       "read_file refuses a path that climbs out of its root", r)
    r = c.call("read_file", {"identity": ident("p1"), "root": "workspace", "path": "secret"})
    ok(r.get("result", {}).get("content") == "secret\n", "read_file reads the identity's own /work", r)

    # Serialization: one identity's calls run one at a time, in order.
    i1 = c.send("exec", {"identity": ident("p1"), "argv": ["sh", "-c", "sleep 1; echo 1 >> /work/order"]})
    i2 = c.send("exec", {"identity": ident("p1"), "argv": ["sh", "-c", "echo 2 >> /work/order; cat /work/order"]})
    first = c.read()
    second = c.read()
    ok(first["id"] == i1 and second["id"] == i2 and second["result"]["stdout"] == "1\n2\n",
       "calls for one identity run one at a time, in arrival order", [first, second])

    # Different identities run concurrently: the fast call of B overtakes A.
    ia = c.send("exec", {"identity": ident("p1"), "argv": ["sleep", "3"]})
    ib = c.send("exec", {"identity": ident("p2"), "argv": ["echo", "fast"]})
    m1 = c.read()
    m2 = c.read()
    ok(m1["id"] == ib and m2["id"] == ia, "different identities run concurrently", [m1, m2])

    # --- lifecycle with the manual clock ---------------------------------------------
    c.call("_test.advance", {"ms": 29000})
    ok(state(c, "p1") == "running", "29 s idle: still running")
    c.call("_test.advance", {"ms": 1500})
    ok(wait_state(c, "p1", "paused", 10) == "paused", "30 s idle: paused")
    rtp = os.path.join(HOME, "sandboxes", name1, "runtime.json")
    deadline = time.time() + 5
    while time.time() < deadline and json.load(open(rtp)).get("paused") is not True:
        time.sleep(0.05)
    rt = json.load(open(rtp))
    ok(rt.get("paused") is True, "the shim reports the VM paused (QMP stop)", rt)
    c.call("_test.advance", {"ms": 600000})
    ok(wait_state(c, "p1", "stopped", 30) == "stopped", "10 min idle: stopped")
    ok(subprocess.run(["pgrep", "-f", f"qemu-system.*{name1}"], capture_output=True).returncode != 0,
       "a stopped sandbox has no QEMU")
    r = exec_(c, "p1", "cat /work/secret")
    ok(r.get("result", {}).get("stdout") == "secret\n" and state(c, "p1") == "running",
       "a call to a stopped sandbox restarts it with /work intact", r)
    # A paused VM resumes on the next call.
    c.call("_test.advance", {"ms": 31000})
    wait_state(c, "p1", "paused", 10)
    r = exec_(c, "p1", "echo awake")
    ok(r.get("result", {}).get("stdout") == "awake\n" and state(c, "p1") == "running",
       "a call to a paused sandbox resumes it", r)
    # Work in progress holds off idle transitions.
    busy = c.send("exec", {"identity": ident("p1"), "argv": ["sleep", "2"]})
    time.sleep(0.3)
    c.call("_test.advance", {"ms": 700000})
    time.sleep(0.5)
    ok(state(c, "p1") == "running", "active work prevents pause and stop")
    c.wait(busy)

    # --- cancellation ------------------------------------------------------------------
    slow = c.send("exec", {"identity": ident("p2"), "argv": ["sleep", "100"]})
    after = c.send("exec", {"identity": ident("p2"), "argv": ["echo", "next"]})
    time.sleep(0.5)
    t0 = time.time()
    cr = c.call("cancel", {"id": slow})
    rs = c.wait(slow)
    ra = c.wait(after)
    ok(cr.get("result", {}).get("cancelled") is True and rs.get("error", {}).get("code") == -32800,
       "cancel kills the running call and answers it as cancelled", [cr, rs])
    ok(ra.get("result", {}).get("stdout") == "next\n" and time.time() - t0 < 20,
       "the next call in the queue runs after a cancel", ra)
    c2 = s.client()
    c2.send("exec", {"identity": ident("p2"), "argv": ["sleep", "100"]})
    time.sleep(0.5)
    c2.close()
    t0 = time.time()
    r = exec_(c, "p2", "echo still-usable")
    ok(r.get("result", {}).get("stdout") == "still-usable\n" and time.time() - t0 < 20,
       "a closed connection cancels its calls; the sandbox stays usable", r)

    # --- protocol errors ------------------------------------------------------------------
    c.send_raw(b'{"jsonrpc": "2.0", "id": 9, "method": \n')
    e1 = c.read()
    e2 = c.call("no.such.method", {})
    e3 = c.call("exec", {"argv": ["true"]})
    ok(e1["error"]["code"] == -32700 and e2["error"]["code"] == -32601 and e3["error"]["code"] == -32602,
       "malformed JSON, unknown method and missing identity get JSON-RPC errors", [e1, e2, e3])

    # --- capacity ------------------------------------------------------------------------------
    exec_(c, "p3", "true")
    exec_(c, "p4", "true")
    # p1, p2, p3, p4 resident; p1 has been idle the longest? Make it so.
    time.sleep(0.1)
    exec_(c, "p2", "true")
    exec_(c, "p3", "true")
    exec_(c, "p4", "true")
    r = exec_(c, "p5", "echo fifth")
    sts = {p: state(c, p) for p in ("p1", "p2", "p3", "p4", "p5")}
    ok(r.get("result", {}).get("stdout") == "fifth\n" and sts["p1"] == "stopped" and
       sum(1 for v in sts.values() if v in ("running", "paused")) == 4,
       "a fifth identity at capacity 4 evicts the oldest idle VM", [r, sts])
    longs = [c.send("exec", {"identity": ident(p), "argv": ["sleep", "30"]}) for p in ("p2", "p3", "p4", "p5")]
    time.sleep(1)
    t0 = time.time()
    r = exec_(c, "p6", "true")
    err = r.get("error", {})
    ok(err.get("code") == -32001 and err.get("data", {}).get("retryable") is True and time.time() - t0 < 5,
       "with every VM busy a new identity is rejected at once, retryably", r)
    for i in longs:
        c.call("cancel", {"id": i})
        c.wait(i)

    # --- recovery after kill -9 -----------------------------------------------------------
    exec_(c, "p2", "echo survive > /work/s; sync")
    name2 = exec_(c, "p2", "true")["result"]["sandbox"]
    c.close()
    s.kill9()
    time.sleep(0.3)
    ok(subprocess.run(["pgrep", "-f", f"qemu-system.*{name2}"], capture_output=True).returncode == 0,
       "sandboxes keep running when the controller is killed")
    s = Server("--test-clock")
    c = s.client()
    st = c.call("status", {"identity": ident("p2")})["result"]
    ok(st.get("state") == "running" and st.get("sandbox") == name2, "a new controller reattaches the live shim", st)
    r = exec_(c, "p2", "cat /work/s")
    ok(r.get("result", {}).get("stdout") == "survive\n", "a call works after recovery, /work intact", r)
    disks = [d for d in os.listdir(os.path.join(HOME, "sandboxes"))
             if os.path.exists(os.path.join(HOME, "sandboxes", d, "private.ext4"))]
    ok(len(disks) == 5, "recovery removed no disk", disks)
    # A dead shim's leftovers are cleaned up: kill a shim, restart serve.
    shim = subprocess.run(["pgrep", "-f", f"capsule shim --ready-fd=3 {name2}$"], capture_output=True, text=True).stdout.split()
    c.close()
    s.kill9()
    for p in shim:
        os.kill(int(p), signal.SIGKILL)
    time.sleep(0.5)
    s = Server("--test-clock")
    c = s.client()
    st = c.call("status", {"identity": ident("p2")})["result"]
    ok(st.get("state") == "stopped" and
       not os.path.exists(os.path.join(HOME, "sandboxes", name2, "runtime.json")) and
       os.path.exists(os.path.join(HOME, "sandboxes", name2, "private.ext4")),
       "a dead shim's leftovers are cleaned, its disks kept", st)
    r = exec_(c, "p2", "cat /work/s")
    ok(r.get("result", {}).get("stdout") == "survive\n", "that sandbox restarts with its data", r)

    # --- remove, then SIGTERM --------------------------------------------------------------
    r = c.call("remove", {"identity": ident("p5")})
    ok(r.get("result", {}).get("state") == "removed" and
       not os.path.exists(os.path.join(HOME, "sandboxes", r["result"]["sandbox"])),
       "remove deletes the identity's sandbox (the only way disks go)", r)
    r = c.call("stop", {"identity": ident("p2")})
    ok(r.get("result", {}).get("state") == "stopped", "stop stops the VM and keeps the disks", r)
    c.close()
    rc = s.term()
    ok(rc == 0 and qemu_count() == 0, f"SIGTERM stops every VM (exit {rc}, {qemu_count()} QEMU left)")

    # --- real time, lowered settings (the acceptance run) ----------------------------------
    pause, stop = (30, 600) if WALL else (2, 5)
    s = Server("--idle-pause", str(pause), "--idle-stop", str(stop))
    c = s.client()
    r = exec_(c, "p1", "echo wall > /work/w")
    t0 = time.time()
    got_pause = wait_state(c, "p1", "paused", pause + 10)
    t_pause = time.time() - t0
    got_stop = wait_state(c, "p1", "stopped", stop + 30)
    t_stop = time.time() - t0
    ok(got_pause == "paused" and pause - 0.5 <= t_pause <= pause + 5,
       f"real clock: paused after {t_pause:.1f} s (setting {pause} s)")
    ok(got_stop == "stopped" and stop - 0.5 <= t_stop <= stop + 15,
       f"real clock: stopped after {t_stop:.1f} s (setting {stop} s)")
    r = exec_(c, "p1", "cat /work/w")
    ok(r.get("result", {}).get("stdout") == "wall\n", "real clock: the next call answers with /work intact", r)
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "no QEMU left after the real-time run")

    # --- warm pool -----------------------------------------------------------------
    s = Server("--test-clock", "--warm-pool", "1", "--capacity", "3")
    c = s.client()
    deadline = time.time() + 60
    while time.time() < deadline and c.call("list")["result"]["warm_pool"]["ready"] < 1:
        time.sleep(0.1)
    wp = c.call("list")["result"]["warm_pool"]
    ok(wp == {"size": 1, "members": 1, "ready": 1} and qemu_count() == 1,
       "a warm pool of 1 keeps one VM started before any call", wp)
    r = exec_(c, "w1", "echo warm > /work/w; hostname")
    got = r.get("result", {}).get("sandbox", "")
    ok(got.startswith("pool-") and r["result"]["exit_code"] == 0,
       "a new identity is given the warm VM", r)
    deadline = time.time() + 60
    while time.time() < deadline and c.call("list")["result"]["warm_pool"]["ready"] < 1:
        time.sleep(0.1)
    ok(c.call("list")["result"]["warm_pool"]["ready"] == 1 and qemu_count() == 2,
       "the pool refills; pool VMs count as resident")
    c.close()
    s.term()
    s = Server("--test-clock", "--warm-pool", "1", "--capacity", "3")
    c = s.client()
    r = exec_(c, "w1", "cat /work/w")
    ok(r.get("result", {}).get("sandbox") == got and r["result"]["stdout"] == "warm\n",
       "after a restart the identity keeps the sandbox it was given", r)
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "no QEMU left at the end")


try:
    main()
except Exception as e:  # a crash is a failure, counted by the runner
    print(f"# test-serve crashed: {e!r}", flush=True)
    import traceback
    traceback.print_exc()
finally:
    cleanup()
sys.exit(1 if failed else 0)
