#!/usr/bin/env python3
"""Black-box tests of durable results through `capsule serve` (issue 19):
a visitor's command writes a file in /work without sync, the call
returns, the visitor's QEMU is killed with SIGKILL at once, and the next
call (which starts the VM again from its disks) finds the file with its
content: 20 cycles, none lost, every result "durable": true. write_file
and upload then a kill: kept. "durable": false shows the old behaviour
(writes lost from the guest's page cache, "durable": false in the
result), so the test can fail. TAP output; every wait is bounded."""
import base64
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servelib  # noqa: E402
from servelib import Connection, Home, Tap  # noqa: E402

CAPSULE = os.path.abspath(sys.argv[1])
H = Home("cd.")
RT, HOME, SOCK, LOG = H.rt, H.home, H.sock, H.log
PLAN = 12
CYCLES = 20
NOSYNC_CYCLES = 5
TOKEN = os.getpid()

T = Tap()
ok, elapsed = T.ok, T.elapsed
SERVERS = []
NAMES = set()


def ident(peer, agent="a"):
    return {"agent": agent, "peer": peer}


def Server(*args):
    s = servelib.Server(CAPSULE, H, *args)
    SERVERS.append(s)
    return s


def call(c, method, params=None, timeout=60):
    """servelib.call, noting the sandboxes the answers name (cleanup)."""
    r = servelib.call(c, method, params, timeout)
    sb = r.get("result", {}).get("sandbox") if isinstance(r.get("result"), dict) else None
    if sb:
        NAMES.add(sb)
    return r


def exec_(c, peer, script, **kw):
    p = {"identity": ident(peer), "argv": ["sh", "-c", script]}
    p.update(kw)
    return call(c, "exec", p)


def state(c, peer):
    return call(c, "status", {"identity": ident(peer)}, 30).get("result", {}).get("state")


def crash(c, peer, name):
    """SIGKILL the QEMU of the visitor's sandbox at once; wait (bounded)
    until the controller has seen it stop. Returns what went wrong, or ""."""
    qpid = H.runtime_qemu(name)
    if not qpid:
        return f"no qemu_pid for {name}"
    os.kill(qpid, signal.SIGKILL)
    deadline = time.time() + 10
    st = None
    while time.time() < deadline:
        st = state(c, peer)
        if st == "stopped" and not os.path.exists(f"/proc/{qpid}"):
            return ""
        time.sleep(0.05)
    return f"{name}: still {st} 10 s after SIGKILL of QEMU {qpid}"


def cleanup():
    for sv in SERVERS:
        sv.kill()
    subprocess.run(["pkill", "-KILL", "-f", f"capsule serve --socket {RT}/"])
    sbs = os.path.join(HOME, "sandboxes")
    for d in set(os.listdir(sbs) if os.path.isdir(sbs) else []) | NAMES:
        subprocess.run(["pkill", "-KILL", "-f", f"capsule shim --ready-fd=3 {d}$"])
    subprocess.run(["pkill", "-KILL", "-f", f"qemu-system.*{HOME}/"])
    time.sleep(0.3)
    if T.failed and os.path.exists(LOG):
        for line in open(LOG, errors="replace").read().splitlines()[-10:]:
            print(f"# serve.log: {line}", flush=True)
    shutil.rmtree(RT, ignore_errors=True)


def read_back(c, peer, prefix, count):
    """{i: content of /work/PREFIX_i or None} in one call; the files are
    listed first so that a missing one is told from an empty one."""
    r = exec_(c, peer, f"i=1; while [ $i -le {count} ]; do [ -f /work/{prefix}_$i ] && printf '%s=%s\\n' $i \"$(cat /work/{prefix}_$i)\"; i=$((i + 1)); done")
    got = {}
    for line in r.get("result", {}).get("stdout", "").splitlines():
        k, _, v = line.partition("=")
        got[int(k)] = v
    return got, r


def main():
    print(f"1..{PLAN}", flush=True)
    subprocess.run([CAPSULE, "image", "build", "base"], env=H.env, capture_output=True, check=True)
    s = Server("--test-clock")
    c = Connection(SOCK, timeout=90)
    peer = "d1"

    # --- exec: 20 write-and-kill cycles ----------------------------------------------
    r = exec_(c, peer, "true")
    name = r.get("result", {}).get("sandbox")
    if not name:
        raise RuntimeError(f"the first call made no sandbox: {r}")
    elapsed("first call")
    bad = []        # results that were not exit 0 and "durable": true
    crashes = []
    for i in range(1, CYCLES + 1):
        r = exec_(c, peer, f"printf %s 'content-{i}-{TOKEN}' > /work/f_{i}")
        res = r.get("result", {})
        if res.get("exit_code") != 0 or res.get("durable") is not True or not isinstance(res.get("sync_ms"), int):
            bad.append((i, r))
        e = crash(c, peer, name)
        if e:
            crashes.append((i, e))
    elapsed(f"{CYCLES} write-and-kill cycles")
    got, rb = read_back(c, peer, "f", CYCLES)
    lost = [i for i in range(1, CYCLES + 1) if got.get(i) != f"content-{i}-{TOKEN}"]
    ok(not lost and not crashes,
       f"exec: a file written without sync survives SIGKILL of QEMU right after the call: {len(lost)} of {CYCLES} lost",
       [f"lost: {lost}", f"read back: {rb.get('result', rb)}", f"crashes: {crashes}"])
    ok(not bad, f"every one of those {CYCLES} results says \"durable\": true with a sync_ms ({len(bad)} did not)",
       "\n".join(f"cycle {i}: {r}" for i, r in bad[:5]))

    r = exec_(c, peer, "true")
    res = r.get("result", {})
    ok(res.get("durable") is True and res.get("sync_ms") == 0,
       "a command that wrote nothing is durable without a flush (sync_ms 0)", r)

    # --- write_file and upload, then a kill ----------------------------------------------
    content = f"written-{TOKEN}\n" * 100
    r = call(c, "write_file", {"identity": ident(peer), "path": "wf.txt", "content": content})
    e = crash(c, peer, name)
    r2 = exec_(c, peer, "cat /work/wf.txt")
    ok(r.get("result", {}).get("bytes") == len(content) and r.get("result", {}).get("durable") is True and not e
       and r2.get("result", {}).get("stdout") == content,
       "write_file then SIGKILL of QEMU: the file is kept, the result says \"durable\": true",
       [r, e, f"read back: {r2.get('result', r2)}"[:600]])

    blob = os.urandom(200000)
    want = hashlib.sha256(blob).hexdigest()
    r = call(c, "upload", {"identity": ident(peer), "path": "up.bin",
                           "content_base64": base64.b64encode(blob).decode()}, 120)
    e = crash(c, peer, name)
    r2 = exec_(c, peer, "sha256sum /work/up.bin")
    got_sum = r2.get("result", {}).get("stdout", "").split(" ")[0]
    ok(r.get("result", {}).get("bytes") == len(blob) and r.get("result", {}).get("durable") is True and not e
       and got_sum == want,
       f"upload then SIGKILL of QEMU: the file is kept (sha256 {got_sum[:16]}, want {want[:16]}), \"durable\": true",
       [r, e, r2])
    elapsed("write_file and upload")

    # --- "durable": false: the old behaviour -------------------------------------------
    bad = []
    crashes = []
    for i in range(1, NOSYNC_CYCLES + 1):
        r = exec_(c, peer, f"printf %s 'nosync-{i}-{TOKEN}' > /work/n_{i}", durable=False)
        res = r.get("result", {})
        if res.get("exit_code") != 0 or res.get("durable") is not False:
            bad.append((i, r))
        e = crash(c, peer, name)
        if e:
            crashes.append((i, e))
    got, rb = read_back(c, peer, "n", NOSYNC_CYCLES)
    lost = [i for i in range(1, NOSYNC_CYCLES + 1) if got.get(i) != f"nosync-{i}-{TOKEN}"]
    ok(not bad, f"exec with \"durable\": false runs and its results say \"durable\": false ({len(bad)} did not)",
       "\n".join(f"cycle {i}: {r}" for i, r in bad[:5]))
    ok(len(lost) >= 1 and not crashes and not bad,
       f"with \"durable\": false a kill right after the call loses writes (the old behaviour): {len(lost)} of {NOSYNC_CYCLES} lost",
       [f"lost: {lost}", f"read back: {rb.get('result', rb)}", f"crashes: {crashes}"])
    elapsed("durable false cycles")

    r = call(c, "write_file", {"identity": ident(peer), "path": "wf2.txt", "content": "x", "durable": False})
    ok(r.get("result", {}).get("bytes") == 1 and r.get("result", {}).get("durable") is False,
       "write_file with \"durable\": false says \"durable\": false", r)
    r = call(c, "upload", {"identity": ident(peer), "path": "up2.bin", "content_base64": base64.b64encode(b"y").decode(),
                           "durable": False})
    ok(r.get("result", {}).get("bytes") == 1 and r.get("result", {}).get("durable") is False,
       "upload with \"durable\": false says \"durable\": false", r)
    # A later durable call flushes what an earlier one left (docs/serve.md).
    r = exec_(c, peer, "printf %s later > /work/later")
    e = crash(c, peer, name)
    r2 = exec_(c, peer, "cat /work/wf2.txt /work/up2.bin /work/later")
    ok(r.get("result", {}).get("durable") is True and not e and r2.get("result", {}).get("stdout") == "xylater",
       "a durable call after them flushes their writes with its own: all kept after a kill", [r, e, r2])

    r = exec_(c, peer, "true", durable="no")
    ok(r.get("error", {}).get("code") == -32602 and "durable" in r["error"].get("message", ""),
       "a non-boolean \"durable\" is refused (-32602) naming it", r)

    c.close()
    rc = s.term()
    left = subprocess.run(["pgrep", "-f", f"qemu-system.*{HOME}/"], capture_output=True, text=True).stdout.split()
    ok(rc == 0 and not left, f"serve ends on SIGTERM (exit {rc}), no QEMU left", left)
    elapsed("done")


try:
    main()
except Exception as e:  # a crash is a failure, counted by the runner
    print(f"# test-durable crashed: {e!r}", flush=True)
    import traceback
    traceback.print_exc()
finally:
    cleanup()
sys.exit(1 if T.failed or T.n != PLAN else 0)
