#!/usr/bin/env python3
"""A full host, small (issue 20, item 3; make bench row (o) is the 64-VM
version): `capsule serve --capacity 8` with 8 identities, each created by
a first call that writes a mark in /work (disk) and in /tmp (guest RAM),
then paused; two rounds of calls over all 8 in random order, two at a
time: each identity found paused, a call that resumes it and one more to
the running VM, both reading the marks back. Then nothing lost (each
identity's QEMU the one it had, every VM resident, QEMU processes ==
resident VMs), a ninth identity at capacity stops exactly one idle VM,
whose next call starts it again with /work kept, and SIGTERM leaves no
QEMU. The lifecycle runs on the manual clock (--test-clock), so a VM is
paused exactly when the test says. TAP output; every wait is bounded."""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
from capsule_client import Connection  # noqa: E402  (the bare wire: these tests speak the protocol itself)

CAPSULE = os.path.abspath(sys.argv[1])
RT = tempfile.mkdtemp(prefix="cfh.", dir="/tmp")
HOME = os.path.join(RT, "home")
ENV = dict(os.environ, CAPSULE_HOME=HOME, XDG_RUNTIME_DIR=RT)
SOCK = os.path.join(RT, "serve.sock")
LOG = os.path.join(RT, "serve.log")
N = 8
ROUNDS = 2
CONC = 2
PLAN = 10
START = time.time()

n = 0
failed = 0
proc = None


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


def elapsed(what):
    print(f"# {what} after {time.time() - START:.1f} s", flush=True)


def who(i):
    return {"agent": "fullhost", "peer": f"p{i}"}


def qemu_pids():
    out = subprocess.run(["pgrep", "-f", f"qemu-system.*{HOME}/"], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def runtime_qemu(name):
    try:
        with open(os.path.join(HOME, "sandboxes", name, "runtime.json")) as f:
            return json.load(f).get("qemu_pid")
    except (OSError, ValueError):
        return None


def call(c, method, params=None):
    """c.call that reports a silent or closed server as {"exception": ...}."""
    try:
        return c.call(method, params)
    except (OSError, EOFError, ValueError) as e:
        return {"exception": repr(e)}


def states(c):
    r = call(c, "list")
    return {s["peer"]: s["state"] for s in r.get("result", {}).get("sandboxes", [])}


def resident(st):
    return sum(1 for v in st.values() if v in ("running", "paused"))


def advance_until_paused(c):
    """Past --idle-pause on the manual clock, then until every VM is paused
    (the pause is a request to each shim; bounded)."""
    call(c, "_test.advance", {"ms": 31000})
    deadline = time.time() + 60
    st = {}
    while time.time() < deadline:
        st = states(c)
        if len(st) == N and all(v == "paused" for v in st.values()):
            return True, st
        time.sleep(0.1)
    return False, st


def log_tail():
    try:
        with open(LOG, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-15:])
    except OSError:
        return ""


def run_workers(jobs, fn):
    """fn(connection, i) for every i in jobs, CONC at a time."""
    q = list(jobs)
    lock = threading.Lock()

    def worker():
        c = Connection(SOCK, timeout=120)
        while True:
            with lock:
                if not q:
                    break
                i = q.pop()
            fn(c, i)
        c.close()

    th = [threading.Thread(target=worker) for _ in range(CONC)]
    for t in th:
        t.start()
    for t in th:
        t.join()


def marks(i):
    return f"p{i}\np{i}\n"


print(f"1..{PLAN}", flush=True)
try:
    subprocess.run([CAPSULE, "image", "build", "base"], env=ENV, capture_output=True, check=True)
    log = open(LOG, "a")
    proc = subprocess.Popen([CAPSULE, "serve", "--socket", SOCK, "--capacity", str(N), "--test-clock"],
                            env=ENV, stdout=log, stderr=log)
    up = False
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        try:
            Connection(SOCK, timeout=5).close()
            up = True
            break
        except OSError:
            time.sleep(0.05)
    c = Connection(SOCK, timeout=300) if up else None
    r = call(c, "prepare") if c else {"exception": "capsule serve did not start"}
    ok("result" in r, f"capsule serve --capacity {N} started and prepared", f"{r}\n{log_tail()}")
    elapsed("prepared")

    # Fill the host.
    names, qpid, bad = {}, {}, []
    lock = threading.Lock()

    def create(c, i):
        r = call(c, "exec", {"identity": who(i),
                             "argv": ["sh", "-c", f"echo p{i} >/work/mark && echo p{i} >/tmp/mark"]})
        with lock:
            if r.get("result", {}).get("exit_code") == 0:
                names[i] = r["result"]["sandbox"]
                qpid[i] = runtime_qemu(names[i])
            else:
                bad.append((i, r))

    run_workers(random.sample(range(N), N), create)
    ok(len(names) == N and not bad and all(qpid.values()),
       f"{N} identities created by a first call each", f"{bad}\n{log_tail()}")
    elapsed(f"{N} identities created")

    paused, st = advance_until_paused(c)
    ok(paused, f"all {N} VMs paused when idle", f"{st}\n{log_tail()}")
    qp = qemu_pids()
    ok(len(qp) == resident(st) == N, f"{N} paused: QEMU processes == resident VMs == {N}",
       f"QEMU {qp}, states {st}")

    # Calls spread over them.
    resumed, warm, wrong = 0, 0, []

    def visit(c, i):
        global resumed, warm
        s = call(c, "status", {"identity": who(i)}).get("result", {}).get("state")
        r = call(c, "exec", {"identity": who(i), "argv": ["cat", "/work/mark", "/tmp/mark"]})
        s2 = call(c, "status", {"identity": who(i)}).get("result", {}).get("state")
        r2 = call(c, "exec", {"identity": who(i), "argv": ["cat", "/work/mark", "/tmp/mark"]})
        with lock:
            if s == "paused" and s2 == "running" and r.get("result", {}).get("stdout") == marks(i):
                resumed += 1
            else:
                wrong.append(("resume", i, s, s2, r))
            if r2.get("result", {}).get("stdout") == marks(i):
                warm += 1
            else:
                wrong.append(("running", i, r2))

    for rnd in range(ROUNDS):
        run_workers(random.sample(range(N), N), visit)
        paused, st = advance_until_paused(c)
        if not paused:
            wrong.append(("not paused again", rnd, st))
    ok(resumed == ROUNDS * N and not [w for w in wrong if w[0] != "running"],
       f"{ROUNDS} rounds: each of the {ROUNDS * N} calls found its VM paused, resumed it and read both marks",
       f"{resumed} resumed; {wrong[:6]}\n{log_tail()}")
    ok(warm == ROUNDS * N, f"{ROUNDS * N} calls to the running VMs answered with both marks",
       f"{warm} right; {[w for w in wrong if w[0] == 'running'][:6]}")
    elapsed(f"{ROUNDS} rounds")

    lost = [(i, names.get(i), qpid.get(i), runtime_qemu(names[i]) if i in names else None)
            for i in range(N) if i not in names or runtime_qemu(names[i]) != qpid.get(i)
            or not os.path.exists(f"/proc/{qpid.get(i)}")]
    st = states(c)
    qp = qemu_pids()
    ok(not lost and resident(st) == N and len(qp) == N,
       "no VM lost: each identity's QEMU the one its first call made, all resident, QEMU == resident",
       f"lost (identity, sandbox, QEMU then, now): {lost}; states {st}; QEMU {qp}")

    # A ninth identity at capacity stops exactly one idle VM...
    r = call(c, "exec", {"identity": who(N), "argv": ["true"]})
    st = states(c)
    gone = sorted(k for k, v in st.items() if v == "stopped")
    qp = qemu_pids()
    ok("result" in r and len(gone) == 1 and resident(st) == N and len(qp) == N,
       f"a ninth identity at capacity {N}: one idle VM stopped, QEMU == resident == {N}",
       f"{r}\nstopped {gone}; states {st}; QEMU {qp}")
    # ... whose next call starts it again from its disks: /work kept,
    # /tmp (guest RAM) new.
    if gone:
        i = int(gone[0][1:])
        r = call(c, "exec", {"identity": who(i), "argv": ["sh", "-c", "cat /work/mark; ls /tmp/mark 2>&1 || true"]})
        st = states(c)
        qp = qemu_pids()
        out = r.get("result", {}).get("stdout", "")
        ok(out.startswith(f"p{i}\n") and "No such file" in out and resident(st) == N and len(qp) == N,
           f"the stopped identity's next call started it again: /work kept, /tmp new, QEMU == resident == {N}",
           f"{r}\nstates {st}; QEMU {qp}")
    else:
        ok(False, "the stopped identity's next call started it again", "no identity was stopped")
    c.close()

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "hung"
    proc = None
    left = qemu_pids()
    ok(rc == 0 and not left, "SIGTERM: the server exits 0 and no QEMU is left", f"exit {rc}; QEMU {left}\n{log_tail()}")
    elapsed("done")
except Exception as e:
    ok(False, "the suite ran to its end", f"{e!r}\n{log_tail()}")
finally:
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for p in qemu_pids():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["rm", "-rf", RT])
sys.exit(1 if failed else 0)
