#!/usr/bin/env python3
"""Idle cost of named sandboxes (issue 20): host memory of N idle
sandboxes, paused and running, and host CPU per idle running one.

Usage: bench-density.py CAPSULE BENCH_PAUSE [N...]   (default N: 1 10 50)

Sandboxes s1..sN are created and started one after another from a
template in a private CAPSULE_HOME; each is paused (bench-pause, as the
serve controller pauses an idle one) right after it started, so that the
ones already up cost no CPU while the rest start. At each N:

* paused memory: what the host holds, the change in AnonPages + Shmem of
  /proc/meminfo since before the first start (every shim, QEMU, jail
  tmpfs and shared holder included; other work on the host adds noise),
  and the VMs' memory cgroups' anonymous + shmem pages plus the shims'
  anonymous memory (attributable, but misses a holder outside them);
* all resumed, 3 s later, the same for running;
* for N <= 10, host CPU over 10 s of the QEMUs (utime + stime of
  /proc/PID/stat) and of the shims, per sandbox, in % of one core;
* then paused again before the next ones start.

At the end they are removed in stages, the last N's extra ones first:
the AnonPages + Shmem each stage released, read right before and after
it, add up to what the host held for N paused sandboxes, with less noise
from other work than the change since the start.

Prints "mem_paused N HOST_KIB CG_KIB", "mem_running N HOST_KIB CG_KIB",
"mem_released N KIB" (per sandbox) and "cpu N QEMU_PCT SHIM_PCT" lines, and "config NAME
VALUE" lines saying what ran. Every sandbox is removed at the end, also
on failure or a signal."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

capsule = os.path.abspath(sys.argv[1])
bench_pause = os.path.abspath(sys.argv[2])
ns = sorted(int(a) for a in sys.argv[3:]) or [1, 10, 50]
tick = os.sysconf("SC_CLK_TCK")
rt = tempfile.mkdtemp(prefix="bd.", dir="/tmp")
env = dict(os.environ, CAPSULE_HOME=os.path.join(rt, "home"))
names = []


def cap(*args, check=True):
    return subprocess.run([capsule, *args], env=env, capture_output=True, text=True, check=check)


def cleanup(*_):
    for n in names:
        subprocess.run([capsule, "rm", "--force", n], env=env, capture_output=True)
    shutil.rmtree(rt, ignore_errors=True)


def on_signal(sig, _):
    cleanup()
    sys.exit(128 + sig)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def meminfo_kib():
    v = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, rest = line.split(":", 1)
            v[k] = int(rest.split()[0])
    return v["AnonPages"] + v["Shmem"]


def cgroup_kib(pid):
    """Anonymous + shmem pages of the memory cgroup pid is in, in KiB."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            stat, keys = f"/sys/fs/cgroup/memory{path}/memory.stat", ("total_rss", "total_shmem")
            break
    else:
        path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        stat, keys = f"/sys/fs/cgroup{path}/memory.stat", ("anon", "shmem")
    v = {}
    with open(stat) as f:
        for line in f:
            k, n = line.split()
            v[k] = int(n)
    return sum(v[k] for k in keys) // 1024


def anon_kib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])	# utime, stime


def pids(n):
    j = json.loads(cap("inspect", "--json", n).stdout)
    return j["qemu_pid"], j["shim_pid"]


def pause(op, which):
    subprocess.run([bench_pause, op, *which], env=env, check=True)


def measure(state, base):
    time.sleep(3)
    host = meminfo_kib() - base
    cg = 0
    for n in names:
        q, s = pids(n)
        cg += cgroup_kib(q) + anon_kib(s)
    print(f"mem_{state} {len(names)} {host // len(names)} {cg // len(names)}", flush=True)


try:
    cap("image", "build", "base")
    # A first sandbox builds the template; it is gone before the baseline.
    cap("create", "warm")
    names.append("warm")
    cap("start", "warm")
    cap("rm", "--force", "warm")
    names.clear()
    print(f"config shared_ram {os.environ.get('CAPSULE_SHARED_RAM', 'default')}", flush=True)
    time.sleep(1)
    base = meminfo_kib()
    t0 = time.monotonic()
    rel = []
    for target in ns:
        while len(names) < target:
            n = f"s{len(names) + 1}"
            cap("create", n)
            names.append(n)
            cap("start", n)
            pause("pause", [n])
        measure("paused", base)
        pause("resume", names)
        measure("running", base)
        if target <= 10:
            ps = [pids(n) for n in names]
            q0 = sum(cpu_ticks(q) for q, _ in ps)
            s0 = sum(cpu_ticks(s) for _, s in ps)
            time.sleep(10)
            q1 = sum(cpu_ticks(q) for q, _ in ps)
            s1 = sum(cpu_ticks(s) for _, s in ps)
            k = 100.0 / tick / 10 / len(names)
            print(f"cpu {len(names)} {(q1 - q0) * k:.2f} {(s1 - s0) * k:.2f}", flush=True)
        pause("pause", names)
    # Teardown in stages, last started first, each stage's release of
    # AnonPages + Shmem read right before and after it (a short window,
    # little noise from the rest of the host): what N sandboxes held is
    # the sum of the releases of the stages that ended them.
    held = 0
    for target in reversed(ns):
        lower = max([m for m in ns if m < target], default=0)
        gone = names[lower:]
        m0 = meminfo_kib()
        ps = [subprocess.Popen([capsule, "rm", "--force", n], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for n in gone]
        for p in ps:
            p.wait()
        time.sleep(1)
        held += m0 - meminfo_kib()
        del names[lower:]
        rel.append((target, held))
    for target, h in sorted(rel):
        print(f"mem_released {target} {h // target}", flush=True)
    print(f"config seconds {time.monotonic() - t0:.0f}", flush=True)
finally:
    cleanup()
