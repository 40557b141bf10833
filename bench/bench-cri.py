#!/usr/bin/python3
"""make bench, row (r): Kubernetes pods through containerd's CRI, one
runtime handler against another in the same run (bench/bench-cri.sh
starts the containerd of tests/integration/cri-lib.sh and runs this in
its network namespace).

    bench-cri.py RUNS PODS CGROUP_PARENT IMAGE HANDLER BASELINE

first output: the calls the kubelet makes for a new pod, RunPodSandbox
+ CreateContainer + StartContainer of a container that prints one line,
timed to that line in the container's CRI log (polled every 2 ms), the
two handlers alternating, each run once untimed first (capsule's first
pod builds its rootfs image and template). Stop and removal are not
timed. Printed: "first_output HANDLER_NS BASELINE_NS" (medians).

memory: PODS idle pods of each handler (a sleeping container each), 3 s
after the last started: what the host holds for them, per pod, in KiB:
the proportional anonymous + shmem memory (Pss_Anon + Pss_Shmem of
/proc/PID/smaps_rollup, as row (p) counts shims) of every process of
the pods' cgroups (pause and containers under runc; the monitors,
sandbox shim and QEMU under capsule), of their shims and the shims'
descendants, and of the capsule RAM holders of $CAPSULE_HOME (counted
whole, shared by the pods). Printed: "pod_memory HANDLER_KIB BASELINE_KIB".
A handler that fails has 0 there, and its error on stderr."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cri"))
import cri  # noqa: E402  (tests/cri/cri.py: the CRI client the suite uses)

pb = cri.pb
runs, npods, cgparent, image = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
handlers = sys.argv[5:7]
c = cri.Cri(os.environ["CRI_SOCKET"])
seq = [0]


def run_pod(handler, args):
    """A pod of HANDLER with one container running ARGS; (pod id,
    container id, its log's path)."""
    seq[0] += 1
    name = f"bench-{handler}-{seq[0]}"
    conf = cri.pod_config(name, f"{cgparent}/{name}", "")
    pid = c.RunPodSandbox(pb.RunPodSandboxRequest(config=conf, runtime_handler=handler)).pod_sandbox_id
    cc = cri.container_config("c", image, args, 0, False, False)
    cid = c.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pid, config=cc, sandbox_config=conf)).container_id
    c.StartContainer(pb.StartContainerRequest(container_id=cid))
    return pid, cid, os.path.join(conf.log_directory, cc.log_path)


def remove(pid):
    c.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pid))
    c.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pid))


def first_output(handler):
    t0 = time.monotonic_ns()
    pid, _, log = run_pod(handler, ["sh", "-c", "echo ready; exec sleep 100000"])
    deadline = time.monotonic() + 300
    while True:
        try:
            with open(log, "rb") as f:
                if b" stdout F ready\n" in f.read():
                    break
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no output in {log} after 300 s")
        time.sleep(0.002)
    t = time.monotonic_ns() - t0
    remove(pid)
    return t


def pss(p):
    n = 0
    try:
        with open(f"/proc/{p}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                    n += int(line.split()[1])
    except OSError:
        pass
    return n


def procs():
    """pid -> (ppid, argv) of every process."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                out[int(p)] = (ppid, argv)
            except (OSError, ValueError, IndexError):
                continue
    return out


def cgroup_procs(rel):
    """The pids in the memory cgroup REL and below (v1, else v2)."""
    found = set()
    for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        d = root + rel
        if os.path.isdir(d):
            for top, _, files in os.walk(d):
                if "cgroup.procs" in files:
                    with open(os.path.join(top, "cgroup.procs")) as f:
                        found |= {int(x) for x in f.read().split()}
            break
    return found


def held(handler, pods):
    time.sleep(3)
    ps = procs()
    mine = set()
    for pid in pods:
        mine |= cgroup_procs(f"{cgparent}/{pods[pid]}")
        shims = {p for p, (_, argv) in ps.items()
                 if argv and argv[0].endswith(b"-v2") and pid.encode() in argv}
        todo = list(shims)
        while todo:	# the shims' descendants
            s = todo.pop()
            if s in mine:
                continue
            mine.add(s)
            todo += [p for p, (pp, _) in ps.items() if pp == s]
    home = os.environ.get("CAPSULE_HOME", "").encode()
    if home:
        mine |= {p for p, (_, argv) in ps.items()
                 if len(argv) > 2 and argv[1] == b"ram-holder" and argv[2].startswith(home + b"/")}
    return sum(pss(p) for p in mine) // len(pods)


def main():
    ok = {}
    for h in handlers:
        try:
            first_output(h)
            ok[h] = True
        except Exception as e:  # noqa: BLE001  (a runtime that fails is reported, not timed)
            msg = e.details() if hasattr(e, "details") else e
            sys.stderr.write(f"bench-cri: runtime handler {h} failed: {msg}\n")
            ok[h] = False
    times = {h: [] for h in handlers}
    for _ in range(runs):
        for h in handlers:
            if ok[h]:
                try:
                    times[h].append(first_output(h))
                except Exception as e:  # noqa: BLE001
                    sys.stderr.write(f"bench-cri: runtime handler {h} failed: {e}\n")
                    ok[h], times[h] = False, []
    med = {h: int(statistics.median(times[h])) if times[h] else 0 for h in handlers}
    print(f"first_output {med[handlers[0]]} {med[handlers[1]]}", flush=True)
    mem = {}
    for h in handlers:
        if not ok[h]:
            mem[h] = 0
            continue
        pods = {}
        try:
            for _ in range(npods):
                pid, _, _ = run_pod(h, ["sleep", "100000"])
                pods[pid] = f"bench-{h}-{seq[0]}"
            mem[h] = held(h, pods)
        except Exception as e:  # noqa: BLE001
            sys.stderr.write(f"bench-cri: runtime handler {h} failed: {e}\n")
            mem[h] = 0
        finally:
            for pid in pods:
                remove(pid)
    print(f"pod_memory {mem[handlers[0]]} {mem[handlers[1]]}", flush=True)


main()
