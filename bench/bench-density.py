#!/usr/bin/env python3
"""Idle cost of named sandboxes (issue 20): host memory held by N idle
sandboxes, paused and running, and host CPU per idle running one.

Usage: bench-density.py CAPSULE BENCH_PAUSE [N...]   (default N: 1 10 50)

Sandboxes s1..sN are created and started one after another from a
template in a private CAPSULE_HOME; each is paused (bench-pause, as the
serve controller pauses an idle one) right after it started, so that the
ones already up cost no CPU while the rest start. At each N the figures
below are taken paused, then all are resumed and, 3 s later, taken
running; for N <= 10 their CPU is measured over 10 s; then all are
paused again before the next ones start. At the end they are removed in
stages, the last N's extra ones first. The environment passes through
(CAPSULE_SHARED_RAM=0, the engine's knobs); CAPSULE_RAM_HOLDER_IDLE_S is
2 unless set, so that the template's RAM holder is gone before the
baseline and after the last stage of the teardown.

Printed keys (memory in KiB per sandbox, i.e. divided by N):

  held STATE N KIB     what the host holds for them, attributed: the sum
                       over the VMs' jail memory cgroups of anonymous +
                       shmem pages + kernel memory (v1: rss + shmem +
                       memory.kmem.usage_in_bytes; v2: anon + shmem +
                       kernel), plus the shims' and RAM holders'
                       proportional anonymous + shmem memory (Pss_Anon +
                       Pss_Shmem), plus the holders' template memfds
                       (their allocated pages, counted once for all VMs of
                       the template, less the pages of them the VMs'
                       cgroups already count as shmem: the holes a VM's
                       first writes filled). STATE: paused or running.
                       This is the figure make bench's rows (p) and
                       (q) show.
  parts STATE N VM_ANON VM_SHMEM VM_KERNEL SHIMS HOLDERS
                       the same, by part (HOLDERS: anonymous + memfd).
  charged STATE N KIB  cross-check of "held" by what the kernel charged:
                       the VMs' cgroups as above, plus the change since
                       before the first start of the anonymous + shmem +
                       kernel memory charged to a memory cgroup of the
                       bench's own (the shims and holders start in it, so
                       it has their whole anonymous memory rather than
                       its proportional share, and the memfd pages the
                       holder's copy made). Absent when the bench cannot
                       make a cgroup.
  host STATE N KIB     cross-check, noisy: the change of AnonPages +
                       Shmem in /proc/meminfo since before the first
                       start (everything else on the host adds to it;
                       has no kernel memory).
  avail STATE N AVAIL TOTAL
                       the host's MemAvailable and MemTotal then, KiB
                       (not per sandbox): how much room is left.
  released N KIB       cross-check of "held paused" without its kernel
                       memory: the AnonPages + Shmem of /proc/meminfo that
                       the teardown stages ending s1..sN released (each
                       read right before the stage's removals and 2 s
                       after them; the first stage's after the holder
                       ended too).
  cpu N QEMU_PCT SHIM_PCT
                       host CPU (utime + stime) per idle running sandbox
                       over 10 s, QEMU and shim, in % of one core.
  clock NAME           the clock the first sandbox's guest keeps (tsc,
                       tsc-early, refined-jiffies: /sys/devices/system/
                       clocksource/clocksource0/current_clocksource).
  config NAME VALUE    what ran: shared_ram and guest_tsc (the
                       environment's value or "default"); accel, what
                       the sandboxes' QEMUs were started with (the value
                       of their -accel up to a comma: kvm or tcg;
                       "mixed:A,B" if they differ; printed after each N,
                       the last one counts); seconds.

BENCH_DENSITY_CPU=0 leaves out the CPU figures (and their 10 s waits):
in a nested guest they measure nothing real.

Every sandbox is removed at the end, also on failure or a signal."""
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
home = os.path.join(rt, "home")
env = dict(os.environ, CAPSULE_HOME=home)
env.setdefault("CAPSULE_RAM_HOLDER_IDLE_S", "2")
names = []
accels = set()
own = None


def cap(*args, check=True):
    return subprocess.run([capsule, *args], env=env, capture_output=True, text=True, check=check)


def cleanup(*_):
    for n in names:
        subprocess.run([capsule, "rm", "--force", n], env=env, capture_output=True)
    names.clear()
    leave_cgroup(own)
    shutil.rmtree(rt, ignore_errors=True)


def on_signal(sig, _):
    cleanup()
    sys.exit(128 + sig)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)


def meminfo():
    v = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, rest = line.split(":", 1)
            v[k] = int(rest.split()[0])
    return v


def meminfo_kib():
    v = meminfo()
    return v["AnonPages"] + v["Shmem"]


def read_kv(path):
    v = {}
    with open(path) as f:
        for line in f:
            k, n = line.split()
            v[k] = int(n)
    return v


def cgroup_kib(pid):
    """(anon, shmem, kernel) KiB of the memory cgroup pid is in."""
    with open(f"/proc/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            d = f"/sys/fs/cgroup/memory{path}"
            v = read_kv(f"{d}/memory.stat")
            with open(f"{d}/memory.kmem.usage_in_bytes") as f:
                kernel = int(f.read())
            return v["total_rss"] // 1024, v["total_shmem"] // 1024, kernel // 1024
    path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
    v = read_kv(f"/sys/fs/cgroup{path}/memory.stat")
    return v["anon"] // 1024, v["shmem"] // 1024, kernel_v2(v) // 1024


def kernel_v2(v):
    """Kernel memory of a v2 memory.stat ("kernel" since Linux 5.18)."""
    if "kernel" in v:
        return v["kernel"]
    return sum(v.get(k, 0) for k in ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock", "slab"))


def cg_dir():
    """The memory cgroup directory of this process (v1, else v2)."""
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            return f"/sys/fs/cgroup/memory{path}"
    return "/sys/fs/cgroup" + next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def own_cgroup():
    """Move this process into a memory cgroup of its own, under its
    current one (the shims and RAM holders it starts follow); its path,
    or None when that is not possible."""
    parent = cg_dir()
    d = f"{parent}/bench-density-{os.getpid()}"
    try:
        os.mkdir(d)
    except OSError:
        return None
    try:
        cg_dir_kib(d)	# v2: memory not enabled for children
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        return d
    except OSError:
        leave_cgroup(d)
        return None


def leave_cgroup(d):
    if d is None:
        return
    try:
        with open(f"{os.path.dirname(d)}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        for _ in range(20):	# a holder may still be ending
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.5)
    except OSError:
        pass


def cg_dir_kib(d):
    """anon + shmem + kernel KiB charged to the memory cgroup d."""
    v = read_kv(f"{d}/memory.stat")
    if "total_rss" in v:
        with open(f"{d}/memory.kmem.usage_in_bytes") as f:
            return (v["total_rss"] + v["total_shmem"] + int(f.read())) // 1024
    return (v["anon"] + v["shmem"] + kernel_v2(v)) // 1024


def pss_kib(pid):
    """Proportional anonymous + shmem memory of a process, in KiB."""
    n = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                n += int(line.split()[1])
    return n


def holders():
    """pid -> allocated KiB of its template memfds, for the RAM holders of
    our CAPSULE_HOME (`capsule ram-holder HOME/templates/KEY`)."""
    found = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if len(argv) < 3 or argv[1] != b"ram-holder" or \
               not argv[2].decode().startswith(home + "/"):
                continue
            kib = 0
            for fd in os.listdir(f"/proc/{p}/fd"):
                if os.readlink(f"/proc/{p}/fd/{fd}").startswith("/memfd:"):
                    kib += os.stat(f"/proc/{p}/fd/{fd}").st_blocks // 2
            found[int(p)] = kib
        except (OSError, UnicodeDecodeError):
            continue
    return found


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])	# utime, stime


pid_cache = {}


def pids(n):
    """(QEMU, shim) pids of sandbox n, asked once: pausing and resuming
    keep them (each `capsule inspect` takes ~0.6 s in a nested guest)."""
    if n not in pid_cache:
        j = json.loads(cap("inspect", "--json", n).stdout)
        pid_cache[n] = j["qemu_pid"], j["shim_pid"]
    return pid_cache[n]


def accel(pid):
    """The accelerator QEMU pid was started with: its -accel's value up
    to a comma ("kvm", "tcg")."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    for a, v in zip(argv, argv[1:]):
        if a == "-accel":
            return v.split(",")[0]
    return "unknown"


def pause(op, which):
    subprocess.run([bench_pause, op, *which], env=env, check=True)


def measure(state, base, own_base):
    time.sleep(3)
    host = meminfo_kib() - base
    own_now = cg_dir_kib(own) if own else 0
    anon = shmem = kernel = shims = 0
    for n in names:
        q, s = pids(n)
        a, sh, k = cgroup_kib(q)
        anon, shmem, kernel, shims = anon + a, shmem + sh, kernel + k, shims + pss_kib(s)
    hs = holders()
    # The memfd pages a VM's writes added (holes filled) are charged to
    # that VM's cgroup as shmem: count them there, the rest once here.
    # Per-VM copies (no holder) are the VMs' own shmem.
    memfd = sum(hs.values())
    held_by_holders = sum(pss_kib(p) for p in hs) + (max(0, memfd - shmem) if hs else 0)
    total = anon + shmem + kernel + shims + held_by_holders
    k = len(names)
    print(f"held {state} {k} {total // k}", flush=True)
    print(f"parts {state} {k} {anon // k} {shmem // k} {kernel // k} {shims // k} {held_by_holders // k}",
          flush=True)
    if own:
        print(f"charged {state} {k} {(anon + shmem + kernel + own_now - own_base) // k}", flush=True)
    print(f"host {state} {k} {host // k}", flush=True)
    m = meminfo()
    print(f"avail {state} {k} {m['MemAvailable']} {m['MemTotal']}", flush=True)


def wait_holders_gone(limit):
    until = time.monotonic() + limit
    while holders() and time.monotonic() < until:
        time.sleep(0.5)


try:
    for k, e in (("shared_ram", "CAPSULE_SHARED_RAM"), ("guest_tsc", "CAPSULE_GUEST_TSC")):
        print(f"config {k} {os.environ.get(e, 'default')}", flush=True)
    idle = int(env["CAPSULE_RAM_HOLDER_IDLE_S"]) + 5
    own = own_cgroup()
    cap("image", "build", "base")
    # A first sandbox builds the template; it and its RAM holder are gone
    # before the baseline.
    cap("create", "warm")
    names.append("warm")
    cap("start", "warm")
    cap("rm", "--force", "warm")
    names.clear()
    wait_holders_gone(idle)
    time.sleep(1)
    own_base = cg_dir_kib(own) if own else 0
    base = meminfo_kib()
    t0 = time.monotonic()
    for target in ns:
        while len(names) < target:
            n = f"s{len(names) + 1}"
            cap("create", n)
            names.append(n)
            cap("start", n)
            accels.add(accel(pids(n)[0]))
            pause("pause", [n])
        measure("paused", base, own_base)
        pause("resume", names)
        measure("running", base, own_base)
        if target == ns[0]:
            r = cap("exec", names[0], "--", "cat", "/sys/devices/system/clocksource/clocksource0/current_clocksource")
            print(f"clock {r.stdout.strip() or 'unknown'}", flush=True)
        if target <= 10 and os.environ.get("BENCH_DENSITY_CPU") != "0":
            ps = [pids(n) for n in names]
            q0 = sum(cpu_ticks(q) for q, _ in ps)
            s0 = sum(cpu_ticks(s) for _, s in ps)
            time.sleep(10)
            q1 = sum(cpu_ticks(q) for q, _ in ps)
            s1 = sum(cpu_ticks(s) for _, s in ps)
            k = 100.0 / tick / 10 / len(names)
            print(f"cpu {len(names)} {(q1 - q0) * k:.2f} {(s1 - s0) * k:.2f}", flush=True)
        pause("pause", names)
        # After each N (the last one counts), so that the figures of a
        # pass cut short still say what they ran under.
        print(f"config accel {next(iter(accels)) if len(accels) == 1 else 'mixed:' + ','.join(sorted(accels))}",
              flush=True)
    # Teardown in stages, last started first, each stage's release of
    # AnonPages + Shmem read right before and 2 s after it (a short
    # window, little noise from the rest of the host); the last stage
    # also waits for the holder to end. What s1..sN held is the sum of
    # the releases of the stages that ended them: that of N's own stage
    # and of every smaller N's.
    rel = {}
    for target in reversed(ns):
        lower = max([m for m in ns if m < target], default=0)
        gone = names[lower:]
        m0 = meminfo_kib()
        ps = [subprocess.Popen([capsule, "rm", "--force", n], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for n in gone]
        for p in ps:
            p.wait()
        del names[lower:]
        if not names:
            wait_holders_gone(idle)
        time.sleep(2)
        rel[target] = m0 - meminfo_kib()
    for target in ns:
        held = sum(r for t, r in rel.items() if t <= target)
        print(f"released {target} {held // target}", flush=True)
    print(f"config seconds {time.monotonic() - t0:.0f}", flush=True)
finally:
    cleanup()
