#!/usr/bin/env python3
"""A full host (issue 20, item 3): `capsule serve --capacity N` (N = 64 by
default) in a private home and socket. N identities are created by a first
call each (it writes a mark in /work, on disk, and in /tmp, in guest RAM),
left idle until the server has paused every VM (a short --idle-pause,
real time), and the host memory held at N paused VMs is read: the change
in AnonPages + Shmem in /proc/meminfo since before the first identity, and
the sum of the VMs' memory cgroups (the template's shared RAM, held by
its capsule ram-holder outside them, is in the first figure only), and the CPU that the paused QEMUs and
the server use over 5 s. Then ROUNDS rounds of calls spread over
all N in random order, CONCURRENCY at a time: each identity's status (must
be paused), a call that resumes it, and a second call at once to the now
running VM, both reading the two marks back. Between rounds the server
pauses every VM again.

Checks: every call answered, with the marks; no VM lost (each identity's
QEMU the one it had after its first call, both marks there, every VM
resident); QEMU processes == resident VMs; after SIGTERM no QEMU left.

Prints "name value baseline" lines for bench/run.sh (times in ms, memory
in KiB); what went wrong goes to stderr, with the server's log lines
about the identities at fault. Usage:
bench-fullhost.py CAPSULE [N [ROUNDS [CONCURRENCY [IDLE_PAUSE_S]]]]"""
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from servelib import Connection, Home, run_workers as pool  # noqa: E402

capsule = os.path.abspath(sys.argv[1])
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
CONC = int(sys.argv[4]) if len(sys.argv) > 4 else 4
PAUSE = sys.argv[5] if len(sys.argv) > 5 else "2"
H = Home("bfh.")
rt, home, env, sock, log_path = H.rt, H.home, H.env, H.sock, H.log
qemu_pids, runtime_qemu = H.qemu_pids, H.runtime_qemu
t0 = time.time()
problems = []       # what the controller did wrong, for stderr
faulty = set()      # identities named in them


def say(msg):
    print(f"bench-fullhost: {time.time() - t0:6.1f} s: {msg}", file=sys.stderr, flush=True)


def problem(msg, i=None):
    problems.append(msg)
    if i is not None:
        faulty.add(i)
    say("PROBLEM: " + msg)


def who(i):
    return {"agent": "fullhost", "peer": f"p{i}"}


def meminfo():
    """AnonPages + Shmem, KiB."""
    v = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, rest = line.split(":", 1)
            v[k] = int(rest.split()[0])
    return v["AnonPages"] + v["Shmem"], v["MemTotal"]


def cgroup_usage(pid):
    """The memory cgroup usage (KiB) of a process's own cgroup (the jail's
    vm-N), v1 or v2; None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        for name, base, file in (("memory", "/sys/fs/cgroup/memory", "memory.usage_in_bytes"),
                                 ("", "/sys/fs/cgroup", "memory.current")):
            if ctrl == name and path != "/":
                try:
                    with open(f"{base}{path}/{file}") as f:
                        return int(f.read()) // 1024
                except OSError:
                    pass
    return None


def cpu_ticks(pids):
    """utime + stime of these processes (every thread), in clock ticks."""
    t = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            t += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return t


def pct(xs, q):
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def log_lines(names, limit=20):
    """The server's log lines that name one of these sandboxes or say
    something failed."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    keys = [n for n in names if n] + ["error", "fail", "cannot", "lost", "died", "killed", "went away", "refus"]
    return [l for l in lines if any(k in l for k in keys)][-limit:]


proc = None
names = {}          # i -> sandbox name
qpid = {}           # i -> QEMU pid after the first call
answered = 0
sent = 0
lock = threading.Lock()


def start_server():
    global proc
    log = open(log_path, "a")
    proc = subprocess.Popen([capsule, "serve", "--socket", sock, "--capacity", str(N), "--idle-pause", PAUSE,
                             "--idle-stop", "3600"], env=env, stdout=log, stderr=log, start_new_session=True)
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"capsule serve exited with {proc.returncode}")
        try:
            Connection(sock, timeout=5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("capsule serve never answered")


def stop_server():
    """SIGTERM, then make sure no QEMU of this home is left (SIGKILL to
    those that are, by pid, reported)."""
    global proc
    if proc is None:
        return None
    t = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=240)
    except subprocess.TimeoutExpired:
        problem("capsule serve did not exit within 240 s of SIGTERM; killed")
        proc.kill()
        rc = proc.wait()
    took = time.perf_counter() - t
    proc = None
    left = qemu_pids()
    if left:
        problem(f"{len(left)} QEMU process(es) left after the server exited: {left}")
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    say(f"server exited {rc} after SIGTERM in {took:.1f} s; QEMU left: {len(left)}")
    return rc, took, len(left)


def on_signal(sig, frame):
    raise KeyboardInterrupt


def call(c, i, argv, what):
    """One exec for identity i; its answer (dict) or None, reported."""
    global answered, sent
    with lock:
        sent += 1
    try:
        r = c.call("exec", {"identity": who(i), "argv": argv})
    except (OSError, EOFError, ValueError) as e:
        problem(f"p{i} {what}: no answer: {e!r}", i)
        return None
    if "result" not in r:
        problem(f"p{i} {what}: error answer: {r.get('error')}", i)
        return None
    with lock:
        answered += 1
    return r["result"]


def state(c, i):
    return c.call("status", {"identity": who(i)})["result"]["state"]


def wait_all_paused(c, timeout):
    """Until every identity's VM is paused (list); the states otherwise."""
    deadline = time.time() + timeout
    while True:
        sb = c.call("list")["result"]["sandboxes"]
        states = {s["peer"]: s["state"] for s in sb}
        if len(states) == N and all(v == "paused" for v in states.values()):
            return None
        if time.time() > deadline:
            return states
        time.sleep(0.2)


MARK = ["cat", "/work/mark", "/tmp/mark"]


def run_workers(jobs, fn):
    pool(sock, jobs, fn, CONC, timeout=180)


signal.signal(signal.SIGTERM, on_signal)
try:
    subprocess.run([capsule, "image", "build", "base"], env=env, capture_output=True, check=True)
    start_server()
    c = Connection(sock, timeout=600)
    r = c.call("prepare")
    if "result" not in r:
        raise RuntimeError(f"prepare failed: {r}")
    time.sleep(1)
    base_mem, total_mem = meminfo()
    say(f"serve --capacity {N} --idle-pause {PAUSE} ready and prepared; AnonPages+Shmem {base_mem // 1024} MiB")

    # Fill the host: N first calls, CONC at a time.
    create_ms = []

    def create(c, i):
        t = time.perf_counter()
        r = call(c, i, ["sh", "-c", f"echo p{i} >/work/mark && echo p{i} >/tmp/mark"], "first call")
        if r is None:
            return
        if r.get("exit_code") != 0:
            problem(f"p{i} first call: exit {r.get('exit_code')}: {r.get('stderr')}", i)
        with lock:
            create_ms.append((time.perf_counter() - t) * 1000)
            names[i] = r["sandbox"]
            qpid[i] = runtime_qemu(r["sandbox"])

    t = time.perf_counter()
    run_workers(random.sample(range(N), N), create)
    say(f"{len(names)} identities created in {time.perf_counter() - t:.1f} s "
        f"(first call p50 {statistics.median(create_ms) if create_ms else 0:.0f} ms)")
    left = wait_all_paused(c, 120 + 2 * N)
    if left:
        problem(f"not every VM paused within {120 + 2 * N} s: "
                f"{sorted((k, v) for k, v in left.items() if v != 'paused')}")
    say("every VM paused")
    time.sleep(2)
    full_mem, _ = meminfo()
    held = full_mem - base_mem
    qp = qemu_pids()
    cg = [cgroup_usage(p) for p in qp]
    cg_sum = sum(x for x in cg if x is not None) if cg and all(x is not None for x in cg) else 0
    resident = sum(1 for s in c.call("list")["result"]["sandboxes"] if s["state"] in ("running", "paused"))
    say(f"{N} paused: host AnonPages+Shmem +{held // 1024} MiB ({held / max(1, N) / 1024:.1f} MiB per VM), "
        f"cgroups {cg_sum // 1024} MiB; QEMU processes {len(qp)}, resident {resident}")
    if len(qp) != resident:
        problem(f"{len(qp)} QEMU processes, {resident} resident VMs, at {N} paused")
    # What the paused VMs cost the host's CPU (they should cost nothing).
    a = cpu_ticks(qp + [proc.pid])
    t = time.perf_counter()
    time.sleep(5)
    b = cpu_ticks(qp + [proc.pid])
    paused_cpu = (b - a) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - t) * 100
    say(f"{N} paused QEMUs and the server over 5 s: {paused_cpu:.2f} % of a core")

    # Calls spread over them.
    resume_ms, warm_ms, bad_state = [], [], []

    def visit(c, i):
        s = state(c, i)
        t = time.perf_counter()
        r = call(c, i, MARK, "resume call")
        a = (time.perf_counter() - t) * 1000
        s2 = state(c, i)
        t = time.perf_counter()
        r2 = call(c, i, MARK, "warm call")
        b = (time.perf_counter() - t) * 1000
        for x, what in ((r, "resume call"), (r2, "warm call")):
            if x is not None and x.get("stdout") != f"p{i}\np{i}\n":
                problem(f"p{i} {what}: marks {x.get('stdout')!r}, exit {x.get('exit_code')}, stderr {x.get('stderr')!r}", i)
        with lock:
            if s != "paused" or s2 != "running":
                bad_state.append((i, s, s2))
            if r is not None:
                (resume_ms if s == "paused" else warm_ms).append(a)
            if r2 is not None:
                (warm_ms if s2 == "running" else resume_ms).append(b)

    # While the rounds run: the CPU of every QEMU and the server, and how
    # many VMs are running (not paused) on average, sampled every 0.5 s.
    running_samples = []
    sampling = threading.Event()

    def sampler():
        k = Connection(sock, timeout=60)
        while not sampling.wait(0.5):
            sb = k.call("list")["result"]["sandboxes"]
            running_samples.append(sum(1 for x in sb if x["state"] == "running"))
        k.close()

    sth = threading.Thread(target=sampler, daemon=True)
    sth.start()
    rounds_a = cpu_ticks(qp + [proc.pid])
    rounds_t = time.perf_counter()
    for rnd in range(ROUNDS):
        t = time.perf_counter()
        run_workers(random.sample(range(N), N), visit)
        say(f"round {rnd + 1}: {N} identities, 2 calls each, in {time.perf_counter() - t:.1f} s")
        left = wait_all_paused(c, 120)
        if left:
            problem(f"round {rnd + 1}: not every VM paused again: "
                    f"{sorted((k, v) for k, v in left.items() if v != 'paused')}")
    rounds_cpu = (cpu_ticks(qp + [proc.pid]) - rounds_a) / os.sysconf("SC_CLK_TCK") / (time.perf_counter() - rounds_t) * 100
    sampling.set()
    sth.join()
    say(f"during the rounds: QEMUs and the server used {rounds_cpu:.0f} % of a core; "
        f"{statistics.mean(running_samples) if running_samples else 0:.1f} VMs running on average "
        f"(max {max(running_samples, default=0)}), the rest paused")
    if bad_state:
        say(f"{len(bad_state)} visits did not find paused-then-running: {bad_state[:10]}")

    # Nothing lost: the same QEMU for every identity, every VM resident,
    # and QEMU processes == resident VMs.
    lost = []
    for i in range(N):
        name = names.get(i)
        now = runtime_qemu(name) if name else None
        if name is None or now is None or now != qpid.get(i) or not os.path.exists(f"/proc/{now}"):
            lost.append((i, name, qpid.get(i), now))
            faulty.add(i)
    sb = c.call("list")["result"]["sandboxes"]
    resident = sum(1 for s in sb if s["state"] in ("running", "paused"))
    qp = qemu_pids()
    end_mem, _ = meminfo()
    say(f"at the end: {resident} resident, {len(qp)} QEMU, AnonPages+Shmem +{(end_mem - base_mem) // 1024} MiB")
    if lost:
        problem(f"{len(lost)} VM(s) lost or restarted (identity, sandbox, QEMU pid then, now): {lost[:10]}")
    if len(qp) != resident:
        problem(f"{len(qp)} QEMU processes, {resident} resident VMs at the end")
    c.close()
    rc, took, qleft = stop_server()
    if rc != 0:
        problem(f"capsule serve exited {rc} on SIGTERM")

    total = N + ROUNDS * 2 * N
    print(f"answered {answered} {total}")
    print(f"resume_p50 {statistics.median(resume_ms):.1f} {statistics.median(warm_ms):.1f}")
    print(f"resume_p99 {pct(resume_ms, 99):.1f} {pct(warm_ms, 99):.1f}")
    print(f"create_p50 {statistics.median(create_ms):.1f} {statistics.median(warm_ms):.1f}")
    print(f"mem_total {held} {total_mem}")
    print(f"mem_per_vm {held / N:.0f} {cg_sum / N:.0f}")
    print(f"lost {len(lost)} {N}")
    print(f"qemu {len(qp)} {resident}")
    print(f"shutdown {took * 1000:.0f} {qleft}")
    print(f"paused_cpu {paused_cpu:.2f} {N}")
    say(f"{len(resume_ms)} resumes p50 {statistics.median(resume_ms):.1f} p99 {pct(resume_ms, 99):.1f} max "
        f"{max(resume_ms):.1f} ms; {len(warm_ms)} warm p50 {statistics.median(warm_ms):.1f} p99 "
        f"{pct(warm_ms, 99):.1f} max {max(warm_ms):.1f} ms")
except BaseException as e:
    problem(f"the bench failed: {e!r}")
    raise
finally:
    if proc is not None:
        stop_server()
    lines = log_lines([names.get(i) for i in faulty])
    if problems or lines:
        say(f"{len(problems)} problem(s); server log lines about them or about failures:")
        for line in lines:
            print(f"bench-fullhost: log: {line}", file=sys.stderr)
    subprocess.run(["rm", "-rf", rt])
