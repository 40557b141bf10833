#!/usr/bin/env python3
"""Bench rows for `capsule serve` (issue 5), each against a baseline taken
in the same run: resume-from-pause to first result vs a warm call,
restart-from-stopped vs a fresh identity's first call, and calls per second
of four identities at once vs one. Prints "name value baseline" lines in
milliseconds (or calls/s) for bench/run.sh."""
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from serve_client import Client  # noqa: E402

capsule = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
rt = tempfile.mkdtemp(prefix="bs.", dir="/tmp")
env = dict(os.environ, CAPSULE_HOME=os.path.join(rt, "home"), XDG_RUNTIME_DIR=rt)
sock = os.path.join(rt, "serve.sock")
subprocess.run([capsule, "image", "build", "base"], env=env, capture_output=True, check=True)
proc = subprocess.Popen([capsule, "serve", "--socket", sock, "--test-clock", "--capacity", "16"],
                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(200):
    try:
        Client(sock).close()
        break
    except OSError:
        time.sleep(0.05)


def who(p):
    return {"agent": "bench", "peer": p}


def timed(c, peer, argv=("true",)):
    t = time.perf_counter()
    r = c.call("exec", {"identity": who(peer), "argv": list(argv)})
    assert "result" in r, r
    return (time.perf_counter() - t) * 1000


def wait_state(c, peer, want):
    for _ in range(600):
        if c.call("status", {"identity": who(peer)})["result"]["state"] == want:
            return
        time.sleep(0.02)
    raise RuntimeError(f"{peer} never became {want}")


try:
    c = Client(sock)
    timed(c, "w")
    warm = statistics.median(timed(c, "w") for _ in range(max(runs, 20)))
    resume, restart, fresh = [], [], []
    for i in range(runs):
        c.call("_test.advance", {"ms": 31000})
        wait_state(c, "w", "paused")
        resume.append(timed(c, "w"))
        c.call("_test.advance", {"ms": 601000})
        wait_state(c, "w", "stopped")
        restart.append(timed(c, "w"))
        fresh.append(timed(c, f"fresh{i}"))
        c.call("remove", {"identity": who(f"fresh{i}")})
    print(f"resume {statistics.median(resume):.1f} {warm:.1f}")
    print(f"restart {statistics.median(restart):.1f} {statistics.median(fresh):.1f}")

    # Throughput: M calls from one identity, then M calls from each of
    # four identities at once (one connection each).
    m = 20
    for p in ("t0", "t1", "t2", "t3"):
        timed(c, p)

    def worker(peer, count):
        k = Client(sock)
        for _ in range(count):
            timed(k, peer)
        k.close()

    t = time.perf_counter()
    worker("t0", 4 * m)
    one = 4 * m / (time.perf_counter() - t)
    threads = [threading.Thread(target=worker, args=(p, m)) for p in ("t0", "t1", "t2", "t3")]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    four = 4 * m / (time.perf_counter() - t)
    print(f"throughput {four:.1f} {one:.1f}")
    c.close()
finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    subprocess.run(["rm", "-rf", rt])
