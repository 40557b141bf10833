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
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servelib import Connection, Home, Server, Tap, call, run_workers as pool  # noqa: E402

CAPSULE = os.path.abspath(sys.argv[1])
H = Home("cfh.")
N = 8
ROUNDS = 2
CONC = 2
PLAN = 10
T = Tap()
ok, elapsed = T.ok, T.elapsed
qemu_pids, runtime_qemu, log_tail = H.qemu_pids, H.runtime_qemu, H.log_tail
server = None


def who(i):
    return {"agent": "fullhost", "peer": f"p{i}"}


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


def run_workers(jobs, fn):
    """fn(connection, i) for every i in jobs, CONC at a time."""
    pool(H.sock, jobs, fn, CONC)


def marks(i):
    return f"p{i}\np{i}\n"


print(f"1..{PLAN}", flush=True)
try:
    subprocess.run([CAPSULE, "image", "build", "base"], env=H.env, capture_output=True, check=True)
    server = Server(CAPSULE, H, "--capacity", str(N), "--test-clock")
    c = Connection(H.sock, timeout=300)
    r = call(c, "prepare")
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

    rc = server.term(120)
    server = None
    left = qemu_pids()
    ok(rc == 0 and not left, "SIGTERM: the server exits 0 and no QEMU is left", f"exit {rc}; QEMU {left}\n{log_tail()}")
    elapsed("done")
except Exception as e:
    ok(False, "the suite ran to its end", f"{e!r}\n{log_tail()}")
finally:
    if server is not None:
        server.term(120)
    for p in qemu_pids():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["rm", "-rf", H.rt])
sys.exit(1 if T.failed else 0)
