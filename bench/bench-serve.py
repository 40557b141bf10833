#!/usr/bin/env python3
"""Bench rows for `capsule serve` (issues 5 and 12), each against a baseline
taken in the same run: resume-from-pause to first result vs a warm call,
restart-from-stopped vs a fresh identity's first call, a new identity's
first call given a warmed spare (--spares 1) vs without, calls per second of
four identities at once vs one, and one identity's exec latency while
another identity's 10000-file public data is refreshed (its VM stopped, the
projection rebuilt, the VM restarted) vs the same identity's latency idle.
Prints "name value baseline" lines in milliseconds (or calls/s) for
bench/run.sh."""
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python", "src"))
from capsule_client import Connection  # noqa: E402  (the bare wire: send now, read answers as they come)

capsule = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
# Each refresh round rebuilds the 10000-file projection (tens of seconds
# under TCG on a small host); three rounds give a few hundred calls.
refresh_rounds = int(os.environ.get("BENCH_REFRESH_ROUNDS", "3"))
rt = tempfile.mkdtemp(prefix="bs.", dir="/tmp")
env = dict(os.environ, CAPSULE_HOME=os.path.join(rt, "home"), XDG_RUNTIME_DIR=rt)
sock = os.path.join(rt, "serve.sock")
subprocess.run([capsule, "image", "build", "base"], env=env, capture_output=True, check=True)


def start_server(*extra):
    """One controller per CAPSULE_HOME: call only after the last one exited."""
    p = subprocess.Popen([capsule, "serve", "--socket", sock, "--test-clock", "--capacity", "16", *extra],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(400):
        if p.poll() is not None:
            raise RuntimeError(f"capsule serve exited with {p.returncode}")
        try:
            Connection(sock).close()
            return p
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("capsule serve never answered")


def stop_server(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)


proc = start_server()


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


def open_loop(c, peer, interval, more):
    """Send exec `true` for peer on connection c every interval seconds, on
    a schedule that does not wait for answers, while more() is true; the
    identity runs them one at a time, so a call that is held up delays the
    ones sent after it, as it would a caller that does not stop to wait.
    Returns (scheduled send, answer) times, in seconds."""
    pending, out = {}, []
    due = time.perf_counter()
    sending = True
    while sending or pending:
        now = time.perf_counter()
        if sending and now >= due:
            if more():
                pending[c.send("exec", {"identity": who(peer), "argv": ["true"]})] = due
                due += interval
            else:
                sending = False
            continue
        if b"\n" not in c.buf:
            ready, _, _ = select.select([c.sock], [], [], due - now if sending else 120)
            if not ready:
                if not sending:
                    raise RuntimeError(f"{peer}: no answer in 120 s")
                continue
        m = c.read()
        assert "result" in m, m
        out.append((pending.pop(m["id"]), time.perf_counter()))
    return out


def refresh_row(rounds, idle_per_round=30):
    """Identity "quiet" (no public data) calls exec `true` on a fixed
    schedule while identity "src" refreshes its 10000-file projection, and
    on the same schedule with nothing else going on, idle batches
    alternating with refresh rounds. A refresh-round call counts if it was
    sent after src's call and before src's answer came. Calls are not sent
    back to back: then a call stuck behind a 30-second refresh would be one
    sample among the dozens taken while src boots, and the median would not
    see it. The schedule is ten times quiet's own latency, so the calls
    queued behind a stall drain quickly and add little of their own."""
    c = Connection(sock)
    kb = Connection(sock)
    timed(kb, "src")        # creates src with the projection
    timed(c, "quiet")       # restarts quiet (stopped by the last server)
    interval = max(0.02, 10 * statistics.median(timed(c, "quiet") for _ in range(20)) / 1000)
    idle, busy, stall = [], [], []
    for r in range(rounds):
        left = [idle_per_round]

        def count():
            left[0] -= 1
            return left[0] >= 0

        idle.extend((a - s) * 1000 for s, a in open_loop(c, "quiet", interval, count))
        with open(os.path.join(tree, "d0", "f0"), "w") as f:
            f.write(f"round {r}\n")
        sent = time.perf_counter()
        rid = kb.send("exec", {"identity": who("src"), "argv": ["true"]})
        answer = {}
        done = threading.Event()

        def wait_b():
            answer["r"] = kb.wait(rid)
            answer["t"] = time.perf_counter()
            done.set()

        th = threading.Thread(target=wait_b)
        th.start()
        samples = open_loop(c, "quiet", interval, lambda: not done.is_set())
        th.join()
        assert "result" in answer["r"], answer["r"]
        stall.append((answer["t"] - sent) * 1000)
        busy.extend((a - s) * 1000 for s, a in samples if sent <= s < answer["t"])
    c.close()
    kb.close()
    if not busy:
        raise RuntimeError("no exec of quiet was sent while src refreshed")
    print(f"bench-serve: refresh: one call every {interval * 1000:.0f} ms; {len(busy)} calls "
          f"during {rounds} refreshes (src's call p50 {statistics.median(stall):.0f} ms), "
          f"max {max(busy):.0f} ms; {len(idle)} idle, max {max(idle):.0f} ms", file=sys.stderr)
    return statistics.median(busy), statistics.median(idle)


try:
    c = Connection(sock)
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
        k = Connection(sock)
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
    timed(c, "quiet")       # no public data: this server has no --source
    c.close()

    # Spares: a server with a warm pool of 1 (each VM warmed by one
    # command); a new identity's first result, the pool refilled between
    # calls, against a new identity's first result without one (above).
    stop_server(proc)
    proc = start_server("--spares", "1")
    c = Connection(sock)
    spare = []
    for i in range(runs):
        for _ in range(1200):
            if c.call("list")["result"]["warm_pool"]["ready"] >= 1:
                break
            time.sleep(0.05)
        spare.append(timed(c, f"spare{i}"))
        c.call("remove", {"identity": who(f"spare{i}")})
    print(f"spare {statistics.median(spare):.1f} {statistics.median(fresh):.1f}")
    c.close()

    # Refresh: a sandbox keeps the source recorded at its creation, so
    # "quiet" (made above) has none while "src", made by a server with
    # --source, projects a 10000-file tree.
    stop_server(proc)
    proc = None
    tree = os.path.join(rt, "pub")
    for d in range(100):
        os.makedirs(os.path.join(tree, f"d{d}"))
        for f in range(100):
            with open(os.path.join(tree, f"d{d}", f"f{f}"), "wb") as fh:
                fh.write(os.urandom(1024))
    proc = start_server("--source", tree)
    t = time.perf_counter()
    busy, idle = refresh_row(refresh_rounds)
    print(f"bench-serve: refresh row took {time.perf_counter() - t:.1f} s", file=sys.stderr)
    print(f"refresh {busy:.1f} {idle:.1f}")
finally:
    if proc is not None:
        stop_server(proc)
    subprocess.run(["rm", "-rf", rt])
