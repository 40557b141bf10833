#!/usr/bin/env python3
"""Black-box tests of `capsule serve` with real VMs: identities and their
sandboxes, serialization, the idle lifecycle (manual clock, and real time
with lowered settings), capacity, cancellation, the protocol's edges, crash
recovery, remove, one controller per home (a second serve, `capsule rm` and
`capsule stop`, `capsule mcp` as a client), shutdown, the warm pool.
TAP output. CAPSULE_WALLCLOCK=1 runs the lifecycle test in real time with
the default durations (about ten minutes).

Every wait is bounded: a controller that never answers makes a test fail
("not ok"), never hangs the suite."""
import base64
import fcntl
import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
from capsule_client import Connection  # noqa: E402  (the bare wire: these tests speak the protocol itself)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servelib import call, wait_or_kill  # noqa: E402  (call reports a silent server as {"exception": ...})

CAPSULE = os.path.abspath(sys.argv[1])
RT = tempfile.mkdtemp(prefix="cs.", dir="/tmp")
HOME = os.path.join(RT, "home")
ENV = dict(os.environ, CAPSULE_HOME=HOME, XDG_RUNTIME_DIR=RT)
SOCK = os.path.join(RT, "serve.sock")
LOG = os.path.join(RT, "serve.log")
WALL = os.environ.get("CAPSULE_WALLCLOCK") == "1"
BIGROOT = tempfile.mkdtemp(prefix="cs-big.", dir="/dev/shm") if os.access("/dev/shm", os.W_OK) else RT
PLAN = 119
LINE_MAX = 24 * 1024 * 1024   # a request line (docs/serve.md): room for a 16 MiB upload in base64
INLINE_MAX = 16 * 1024 * 1024

n = 0
failed = 0
NAMES = set()   # every sandbox name seen, for the cleanup
PROCS = []      # every process started here, for the cleanup


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


def sandbox_name(peer, agent="a"):
    """The name docs/serve.md derives from an identity."""
    return "v-" + hashlib.sha256(f"{agent}\0{peer}\0".encode()).hexdigest()[:20]


def sbdir(name):
    return os.path.join(HOME, "sandboxes", name)


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def qemu_count():
    return len(pids(f"qemu-system.*{HOME}/"))


def qemu_of(name):
    return pids(f"qemu-system.*{name}")


def shim_of(name):
    return pids(f"capsule shim --ready-fd=3 {name}$")


class Server:
    def __init__(self, *args, sock=SOCK):
        self.sock = sock
        self.log = open(LOG, "a")
        self.proc = subprocess.Popen([CAPSULE, "serve", "--socket", sock, *args], env=ENV,
                                     stdout=self.log, stderr=self.log)
        PROCS.append(self.proc)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"capsule serve exited with {self.proc.returncode}")
            try:
                Connection(sock, timeout=5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("capsule serve did not start")

    def client(self, timeout=90):
        return Connection(self.sock, timeout=timeout)

    def term(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "hung"

    def kill9(self):
        self.proc.kill()
        self.proc.wait()


def wait_answer(c, id, timeout):
    old = c.sock.gettimeout()
    c.sock.settimeout(timeout)
    try:
        return c.wait(id)
    except (OSError, EOFError, ValueError) as e:
        return {"exception": repr(e)}
    finally:
        c.sock.settimeout(old)


def read_next(c, timeout):
    """The next message on the connection, whatever its id (bounded)."""
    old = c.sock.gettimeout()
    c.sock.settimeout(timeout)
    try:
        return c.read()
    except (OSError, EOFError, ValueError) as e:
        return {"exception": repr(e)}
    finally:
        c.sock.settimeout(old)


def exec_(c, peer, script, timeout=None, **kw):
    p = {"identity": ident(peer), "argv": ["sh", "-c", script]}
    p.update(kw)
    r = call(c, "exec", p, timeout)
    if r.get("result", {}).get("sandbox"):
        NAMES.add(r["result"]["sandbox"])
    return r


def status(c, peer):
    return call(c, "status", {"identity": ident(peer)}, 30).get("result", {})


def state(c, peer):
    return status(c, peer).get("state")


def wait_state(c, peer, want, seconds):
    deadline = time.time() + seconds
    s = None
    while time.time() < deadline:
        s = state(c, peer)
        if s == want:
            return s
        time.sleep(0.1)
    return s


def wait_active(c, peer, seconds=30, active=1):
    """Until the identity's status says `active` calls run (bounded)."""
    deadline = time.time() + seconds
    st = {}
    while time.time() < deadline:
        st = status(c, peer)
        if st.get("active") == active:
            return True
        time.sleep(0.05)
    return False


def wait_until(cond, seconds, step=0.05):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def run_cli(*args, timeout=60):
    """A capsule CLI command on our home: (exit code, stdout, stderr)."""
    try:
        p = subprocess.run([CAPSULE, *args], env=ENV, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return "timeout", e.stdout or "", e.stderr or ""


class Mcp:
    """`capsule mcp` on pipes: one JSON-RPC message per line, read by a
    thread so that every read has a deadline."""

    def __init__(self, *args):
        self.err = open(os.path.join(RT, f"mcp.{len(PROCS)}.err"), "w+")
        self.proc = subprocess.Popen([CAPSULE, "mcp", *args], env=ENV, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err)
        PROCS.append(self.proc)
        self.q = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        for line in self.proc.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                self.q.put({"unparsable": line.decode(errors="replace")})
        self.q.put(None)

    def send(self, msg):
        try:
            self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def request(self, id, method, params, timeout=90):
        self.send({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        deadline = time.time() + timeout
        while True:
            try:
                m = self.q.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                return {"exception": f"no answer to {method} in {timeout} s"}
            if m is None:
                return {"exception": f"mcp closed stdout (exit {self.proc.poll()})"}
            if m.get("id") == id:
                return m

    def initialize(self):
        r = self.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                           "clientInfo": {"name": "test-serve", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r

    def close_stdin(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def wait(self, timeout):
        return wait_or_kill(self.proc, timeout)

    def stderr(self):
        self.err.flush()
        self.err.seek(0)
        return self.err.read()


def tool_text(r):
    res = r.get("result", {})
    sc = res.get("structuredContent") or {}
    if "stdout" in sc:
        return sc["stdout"]
    return "".join(x.get("text", "") for x in res.get("content", []))


def cleanup():
    for p in PROCS:
        if p.poll() is None:
            p.kill()
    subprocess.run(["pkill", "-KILL", "-f", f"capsule serve --socket {RT}/"])
    sbs = os.path.join(HOME, "sandboxes")
    for d in set(os.listdir(sbs) if os.path.isdir(sbs) else []) | NAMES:
        subprocess.run(["pkill", "-KILL", "-f", f"capsule shim --ready-fd=3 {d}$"])
    subprocess.run(["pkill", "-KILL", "-f", f"qemu-system.*{HOME}/"])
    time.sleep(0.3)
    if failed and os.path.exists(LOG):
        for line in open(LOG, errors="replace").read().splitlines()[-int(os.environ.get('SERVE_LOG_LINES', '30')):]:
            print(f"# serve.log: {line}", flush=True)
    shutil.rmtree(RT, ignore_errors=True)
    shutil.rmtree(BIGROOT, ignore_errors=True)


# Prints "pid N gone" when the process whose pid the file holds has exited.
GONE = 'p=$(cat {0}); test -n "$p" && echo "pid $p" && ! kill -0 "$p" 2>/dev/null && echo "pid $p gone"; true'


def main():
    print(f"1..{PLAN}", flush=True)
    subprocess.run([CAPSULE, "image", "build", "base"], env=ENV, capture_output=True, check=True)

    # --- identities -----------------------------------------------------------
    s = Server("--test-clock")
    c = s.client()
    r = call(c, "status", {"identity": ident("p1")})
    r2 = call(c, "list")
    ok(r["result"]["state"] == "none" and r2["result"]["sandboxes"] == [] and qemu_count() == 0,
       "status and list alone start no VM", r)
    r = call(c, "info")
    ok(r.get("result", {}).get("network") == [], "info reports no network policy by default", r)

    r = exec_(c, "p1", "echo hello; id -u; echo secret > /work/secret")
    res = r.get("result", {})
    ok(res.get("stdout") == "hello\n1000\n" and res.get("exit_code") == 0,
       "first call for (a, p1) creates its sandbox and runs as UID 1000", r)
    name1 = res.get("sandbox")
    pid_before = qemu_of(name1)
    r = exec_(c, "p1", "cat /work/secret")
    pid_after = qemu_of(name1)
    ok(r["result"]["sandbox"] == name1 and r["result"]["stdout"] == "secret\n" and pid_before == pid_after,
       "a second call reuses the same sandbox and VM", r)
    st = status(c, "p1")
    ok(st["sandbox"] == name1 and st["state"] == "running", "status names the sandbox, running", st)
    # The server's sandboxes follow its one policy: capsule net set refuses
    # them, naming the server (docs/network.md).
    rec_before = open(os.path.join(sbdir(name1), "record.json")).read()
    rc, out, err = run_cli("net", "set", name1, "--allow-lan")
    ok(rc not in (0, "timeout") and "capsule serve" in err and str(s.proc.pid) in err and
       open(os.path.join(sbdir(name1), "record.json")).read() == rec_before,
       "capsule net set of a sandbox owned by capsule serve is refused, naming it", [rc, err])

    # Peer separation: B sees nothing of A, and cannot name A's sandbox.
    r = exec_(c, "p2", "cat /work/secret", sandbox=name1, cwd="/work")
    res = r.get("result", {})
    ok(res.get("sandbox") != name1 and res.get("exit_code") != 0 and "secret\n" not in res.get("stdout", ""),
       "peer B does not see peer A's /work, even when naming A's sandbox", r)
    r = call(c, "read_file", {"identity": ident("p2"), "root": "workspace", "path": "../../work/secret"})
    ok(r.get("error", {}).get("code") == -32602 and ".." in r["error"]["message"],
       "read_file refuses a path that climbs out of its root", r)
    r = call(c, "read_file", {"identity": ident("p1"), "root": "workspace", "path": "secret"})
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
    call(c, "_test.advance", {"ms": 29000})
    ok(state(c, "p1") == "running", "29 s idle: still running")
    call(c, "_test.advance", {"ms": 1500})
    ok(wait_state(c, "p1", "paused", 10) == "paused", "30 s idle: paused")
    rtp = os.path.join(sbdir(name1), "runtime.json")
    wait_until(lambda: json.load(open(rtp)).get("paused") is True, 5)
    rt = json.load(open(rtp))
    ok(rt.get("paused") is True, "the shim reports the VM paused (QMP stop)", rt)
    call(c, "_test.advance", {"ms": 600000})
    ok(wait_state(c, "p1", "stopped", 30) == "stopped", "10 min idle: stopped")
    ok(not qemu_of(name1), "a stopped sandbox has no QEMU",
       subprocess.run(["pgrep", "-af", f"qemu-system.*{name1}"], capture_output=True, text=True).stdout)
    r = exec_(c, "p1", "cat /work/secret")
    ok(r.get("result", {}).get("stdout") == "secret\n" and state(c, "p1") == "running",
       "a call to a stopped sandbox restarts it with /work intact", r)
    # A paused VM resumes on the next call.
    call(c, "_test.advance", {"ms": 31000})
    wait_state(c, "p1", "paused", 10)
    r = exec_(c, "p1", "echo awake")
    ok(r.get("result", {}).get("stdout") == "awake\n" and state(c, "p1") == "running",
       "a call to a paused sandbox resumes it", r)
    # Work in progress holds off idle transitions.
    busy = c.send("exec", {"identity": ident("p1"), "argv": ["sleep", "3"]})
    running = wait_active(c, "p1")
    call(c, "_test.advance", {"ms": 700000})
    time.sleep(0.5)   # a transition that must not happen: give it time to
    st = status(c, "p1")
    ok(running and st.get("state") == "running", "active work prevents pause and stop", st)
    wait_answer(c, busy, 60)

    # --- cancellation ------------------------------------------------------------------
    # The running command records its pid; after the cancel that process
    # must be gone, not merely the call answered.
    exec_(c, "p2", "rm -f /work/pid /work/pid2")
    slow = c.send("exec", {"identity": ident("p2"),
                           "argv": ["sh", "-c", "echo $$ > /work/pid; exec sleep 100"]})
    after = c.send("exec", {"identity": ident("p2"), "argv": ["echo", "next"]})
    started = wait_active(c, "p2")
    time.sleep(1)     # the guest needs a moment to start sh (no status for that)
    t0 = time.time()
    cr = call(c, "cancel", {"id": slow}, 30)
    rs = wait_answer(c, slow, 30)
    ra = wait_answer(c, after, 30)
    ok(cr.get("result", {}).get("cancelled") is True and rs.get("error", {}).get("code") == -32800,
       "cancel answers the running call as cancelled", [started, cr, rs])
    ok(ra.get("result", {}).get("stdout") == "next\n" and time.time() - t0 < 20,
       "the next call in the queue runs after a cancel", ra)
    r = exec_(c, "p2", GONE.format("/work/pid"))
    res = r.get("result", {})
    ok(res.get("stdout", "").startswith("pid ") and res.get("stdout", "").endswith(" gone\n"),
       "cancel killed the running command in the guest (its pid is gone)", r)
    c2 = s.client()
    c2.send("exec", {"identity": ident("p2"), "argv": ["sh", "-c", "echo $$ > /work/pid2; exec sleep 100"]})
    started = wait_active(c, "p2")
    time.sleep(1)
    c2.close()
    t0 = time.time()
    r = exec_(c, "p2", "echo still-usable; " + GONE.format("/work/pid2"), timeout=30)
    res = r.get("result", {})
    ok(started and res.get("stdout", "").startswith("still-usable\npid ") and
       res.get("stdout", "").endswith(" gone\n") and time.time() - t0 < 20,
       "a closed connection kills its running command; the sandbox stays usable", r)

    # --- protocol ------------------------------------------------------------------
    c.send_raw(b'{"jsonrpc": "2.0", "id": 9, "method": \n')
    e1 = wait_answer(c, 9, 10)     # Connection returns the id-null error
    e2 = call(c, "no.such.method", {})
    e3 = call(c, "exec", {"argv": ["true"]})
    ok(e1.get("error", {}).get("code") == -32700 and e2["error"]["code"] == -32601 and
       e3["error"]["code"] == -32602,
       "malformed JSON, unknown method and missing identity get JSON-RPC errors", [e1, e2, e3])
    bad = []
    for part in ("../x", "a/b", ".x", "x" * 65):
        for who in (ident("p1", agent=part), ident(part)):
            r = call(c, "status", {"identity": who}, 10)
            if r.get("error", {}).get("code") != -32602:
                bad.append([who, r])
    ok(not bad, "status refuses the identities other methods refuse (-32602)", bad)
    # Notifications get no answer: the next message is the answer to the
    # request that follows them. A fresh connection, so that a stray
    # answer cannot confuse later tests.
    cn = s.client(timeout=30)
    cn.notify("exec", {"identity": ident("p1"), "argv": ["true"]})
    cn.notify("status", {"identity": ident("p1")})
    rid = cn.send("exec", {"identity": ident("p1"), "argv": ["echo", "after-notify"]})
    try:
        m = cn.read()
    except (OSError, EOFError, ValueError) as e:
        m = {"exception": repr(e)}
    ok(m.get("id") == rid and m.get("result", {}).get("stdout") == "after-notify\n",
       "a notification gets no answer", m)
    cn.close()
    cl = s.client(timeout=30)
    cl.send_raw(b"x" * (LINE_MAX + 10) + b"\n")
    e = wait_answer(cl, None, 30)
    r = call(cl, "status", {"identity": ident("p1")}, 30)
    ok(e.get("error", {}).get("code") == -32600 and e.get("id") is None and
       r.get("result", {}).get("state") == "running",
       "a line of 24 MiB + 10 bytes gets -32600; the connection keeps working", [e, r])
    req = {"jsonrpc": "2.0", "id": 77, "method": "status",
           "params": {"identity": ident("p1"), "pad": ""}}
    line = json.dumps(req, separators=(",", ":")).encode()
    line = line.replace(b'"pad":""', b'"pad":"' + b"x" * (LINE_MAX - len(line)) + b'"')
    assert len(line) == LINE_MAX
    cl.send_raw(line + b"\n")
    m = wait_answer(cl, 77, 30)
    ok(m.get("id") == 77 and m.get("error", {}).get("code") != -32600,
       "a line of exactly 24 MiB of valid JSON is not refused as too long", m)
    cl.close()
    # The connection limit is said, not a silent drop or a stall.
    many = []
    for _ in range(512):
        many.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        many[-1].connect(SOCK)
    extra = Connection(SOCK, timeout=10)
    try:
        over = extra.read()
    except (EOFError, OSError) as e:
        over = repr(e)
    extra.close()
    for k in many:
        k.close()
    after = c.call("status", {"identity": ident("p1")})
    ok(isinstance(over, dict) and over.get("error", {}).get("data", {}).get("retryable") is True and
       "512" in over["error"]["message"] and after.get("result", {}).get("state") == "running",
       "connection 513 is told the limit of 512 and closed; the server keeps serving", [over, after])

    # A guest that does not end a command on time (its QEMU frozen with
    # SIGSTOP) is given up on by the host at the timeout plus 5 s: the
    # call answers timed out, on time, saying why; the VM is killed, the
    # disks kept, and the next call starts it again.
    exec_(c, "p1", "echo frozen-ok > /work/f; sync")
    name_f = status(c, "p1").get("sandbox")
    t0 = time.time()
    fid = c.send("exec", {"identity": ident("p1"), "argv": ["sh", "-c", "exec sleep 60"], "timeout": 2})
    wait_active(c, "p1")
    qpid = json.load(open(os.path.join(HOME, "sandboxes", name_f, "runtime.json")))["qemu_pid"]
    os.kill(qpid, signal.SIGSTOP)
    fr = wait_answer(c, fid, 20)
    took = time.time() - t0
    res = fr.get("result", {})
    ok(res.get("timed_out") is True and took < 9.5 and "did not end the command" in res.get("note", ""),
       f"a command the guest does not end answers timed out at its timeout + 5 s ({took:.1f} s)", fr)
    r = exec_(c, "p1", "cat /work/f", timeout=60)
    ok(r.get("result", {}).get("stdout") == "frozen-ok\n",
       "its VM was killed and the next call starts it again with its disks", r)

    # Contained in the guest: a fork bomb with a setsid escapee ends on
    # time and leaves nothing behind for the next call; pids_max is the
    # command's own.
    # Timed from when the call runs: what comes before (the identity's
    # VM resumed or started) is not the fork bomb's (one run here waited
    # 11 s before it, for a guest duration of 5.3 s).
    t0 = time.time()
    bid = c.send("exec", {"identity": ident("p2"), "timeout": 5, "argv": [
        "sh", "-c", "setsid sleep 1000 & f(){ f|f& }; f 2>/dev/null; sleep 100"]})
    wait_active(c, "p2")
    t1 = time.time()
    br = wait_answer(c, bid, 60)
    took = time.time() - t1
    ok(br.get("result", {}).get("timed_out") is True and took < 12 and
       br["result"].get("duration_ms", 99999) < 7000,
       f"a fork bomb with timeout 5 answers timed out {took:.1f} s after it ran "
       f"({t1 - t0:.1f} s before; {br.get('result', {}).get('duration_ms')} ms in the guest)", br)
    r = exec_(c, "p2", "ps -o pid,args | grep -c '[s]leep 1000'", timeout=60)
    ok(r.get("result", {}).get("stdout") == "0\n", "nothing it started is left for the next call", r)
    r = call(c, "exec", {"identity": ident("p2"), "pids_max": 7, "argv": [
        "sh", "-c", "cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/pids.max"]}, 60)
    ok(r.get("result", {}).get("stdout") == "7\n", "pids_max sets the command's cgroup pids.max", r)

    # --- capacity ------------------------------------------------------------------------------
    exec_(c, "p3", "true")
    exec_(c, "p4", "true")
    # p1, p2, p3, p4 resident; make p1 the one idle the longest (the
    # manual clock moves only when told).
    call(c, "_test.advance", {"ms": 1000})
    exec_(c, "p2", "true")
    exec_(c, "p3", "true")
    exec_(c, "p4", "true")
    r = exec_(c, "p5", "echo fifth")
    sts = {p: state(c, p) for p in ("p1", "p2", "p3", "p4", "p5")}
    ok(r.get("result", {}).get("stdout") == "fifth\n" and sts["p1"] == "stopped" and
       sum(1 for v in sts.values() if v in ("running", "paused")) == 4,
       "a fifth identity at capacity 4 evicts the oldest idle VM", [r, sts])
    longs = [c.send("exec", {"identity": ident(p), "argv": ["sleep", "30"]}) for p in ("p2", "p3", "p4", "p5")]
    for p in ("p2", "p3", "p4", "p5"):
        wait_active(c, p)
    t0 = time.time()
    r = exec_(c, "p6", "true", timeout=30)
    err = r.get("error", {})
    ok(err.get("code") == -32001 and err.get("data", {}).get("retryable") is True and time.time() - t0 < 5,
       "with every VM busy a new identity is rejected at once, retryably", r)
    for i in longs:
        call(c, "cancel", {"id": i}, 30)
        wait_answer(c, i, 30)

    # --- recovery after kill -9 -----------------------------------------------------------
    # Restarted controllers get room for more VMs: the first calls of new
    # identities below must not wait for an eviction.
    exec_(c, "p2", "echo survive > /work/s; sync")
    name2 = exec_(c, "p2", "true")["result"]["sandbox"]
    c.close()
    s.kill9()
    time.sleep(0.3)
    ok(qemu_of(name2), "sandboxes keep running when the controller is killed")
    s = Server("--test-clock", "--capacity", "8")
    c = s.client()
    st = status(c, "p2")
    ok(st.get("state") == "running" and st.get("sandbox") == name2, "a new controller reattaches the live shim", st)
    r = exec_(c, "p2", "cat /work/s")
    ok(r.get("result", {}).get("stdout") == "survive\n", "a call works after recovery, /work intact", r)
    disks = [d for d in os.listdir(os.path.join(HOME, "sandboxes"))
             if os.path.exists(os.path.join(sbdir(d), "private.ext4"))]
    ok(len(disks) == 5, "recovery removed no disk", disks)

    # A dead shim's leftovers are cleaned up: kill the controller, the
    # shim and its QEMU (nothing gets to clean anything), restart serve.
    c.close()
    s.kill9()
    victims = shim_of(name2) + qemu_of(name2)
    for p in victims:
        os.kill(p, signal.SIGKILL)
    wait_until(lambda: not shim_of(name2) and not qemu_of(name2), 10)
    s = Server("--test-clock", "--capacity", "8")
    c = s.client()
    st = status(c, "p2")
    d2 = sbdir(name2)
    stale = [f for f in ("runtime.json", "control.sock", "agent.sock", "qmp.sock")
             if os.path.lexists(os.path.join(d2, f))]
    kept = [f for f in ("console.log", "private.ext4") if os.path.exists(os.path.join(d2, f))]
    ok(victims and st.get("state") == "stopped" and not stale and len(kept) == 2,
       "a dead shim's runtime.json and sockets are removed, console.log and disks kept",
       [victims, st, "stale: " + " ".join(stale), "kept: " + " ".join(kept)])
    r = exec_(c, "p2", "cat /work/s")
    ok(r.get("result", {}).get("stdout") == "survive\n", "that sandbox restarts with its data", r)

    # --- remove, stop ---------------------------------------------------------------
    r = call(c, "remove", {"identity": ident("p5")}, 60)
    ok(r.get("result", {}).get("state") == "removed" and
       not os.path.exists(sbdir(r["result"]["sandbox"])),
       "remove deletes the identity's sandbox (the only way disks go)", r)
    r = call(c, "stop", {"identity": ident("p2")}, 60)
    ok(r.get("result", {}).get("state") == "stopped", "stop stops the VM and keeps the disks", r)
    # remove of a stopped identity answers at once. A connection of its
    # own: a call that never answers must not block the others.
    cr = s.client(timeout=15)
    t0 = time.time()
    r = call(cr, "remove", {"identity": ident("p2")})
    dt = time.time() - t0
    ok(r.get("result", {}).get("state") == "removed" and dt < 10 and not os.path.exists(d2),
       f"remove of a stopped identity answers at once ({dt:.1f} s), its sandbox gone", r)
    cr.close()
    # ... and after an idle stop.
    name3 = sandbox_name("p3")
    call(c, "_test.advance", {"ms": 700000})
    got = wait_state(c, "p3", "stopped", 30)
    cr = s.client(timeout=15)
    t0 = time.time()
    r = call(cr, "remove", {"identity": ident("p3")})
    dt = time.time() - t0
    ok(got == "stopped" and r.get("result", {}).get("state") == "removed" and dt < 10 and
       not os.path.exists(sbdir(name3)),
       f"remove after an idle stop answers at once ({dt:.1f} s), its sandbox gone", [got, r])
    cr.close()

    # --- the controller killed during an identity's first call ----------------------
    # Killed while the new identity's VM is starting (its shim is there):
    # the next controller must find that VM starting or running, not
    # stopped with its shim and QEMU alive.
    name8 = sandbox_name("p8")
    NAMES.add(name8)
    c.send("exec", {"identity": ident("p8"), "argv": ["echo", "first"]})
    t0 = time.time()
    wait_until(lambda: shim_of(name8), 10, step=0.01)    # its VM is starting
    time.sleep(max(0.0, 0.15 - (time.time() - t0)))
    killed_after = time.time() - t0
    c.close()
    s.kill9()
    log_from = os.path.getsize(LOG)
    s = Server("--test-clock", "--capacity", "8")
    c = s.client()
    seen = []
    deadline = time.time() + 60
    while time.time() < deadline:
        st = status(c, "p8")
        if not seen or seen[-1][0] != st.get("state"):
            seen.append((st.get("state"), bool(shim_of(name8)), bool(qemu_of(name8))))
        if st.get("state") == "running":
            break
        time.sleep(0.1)
    ok(seen and seen[-1][0] == "running",
       f"killed {killed_after:.2f} s into a first call: the next controller finds that VM running",
       ["states seen (state, shim alive, QEMU alive):"] + seen)
    t0 = time.time()
    r = exec_(c, "p8", "echo again", timeout=60)
    with open(LOG, errors="replace") as f:
        f.seek(log_from)
        tail = f.read()
    ok(r.get("result", {}).get("stdout") == "again\n" and time.time() - t0 < 60 and
       "cannot connect to the sandbox at :" not in tail,
       "and the next call for it answers", [r] + [x for x in tail.splitlines() if "p8" in x or name8 in x][:8])

    # A sandbox without public data, for the non-blocking test below.
    r = exec_(c, "n2", "echo no-source")
    name_n2 = r.get("result", {}).get("sandbox")
    c.close()
    rc = s.term()
    ok(rc == 0 and qemu_count() == 0, f"SIGTERM stops every VM (exit {rc}, {qemu_count()} QEMU left)")

    # --- a slow sandbox creation holds up no one else ----------------------------------------
    # 30000 small files: copying them into a new sandbox takes seconds.
    # Made in tmpfs when there is one (a disk can take ten times longer).
    big = os.path.join(BIGROOT, "big")
    for d in range(300):
        os.makedirs(os.path.join(big, f"d{d:03}"))
        for f in range(100):
            with open(os.path.join(big, f"d{d:03}", f"f{f:03}.txt"), "w") as fh:
                fh.write(f"{d} {f}\n")
    # Short idle settings for the test of the manual clock below.
    s = Server("--test-clock", "--idle-pause", "1", "--idle-stop", "3", "--source", big)
    c = s.client(timeout=120)
    t0 = time.time()
    i_big = c.send("exec", {"identity": ident("n1"), "argv": ["sh", "-c", "ls /source | wc -l"]})
    i_n2 = c.send("exec", {"identity": ident("n2"), "argv": ["echo", "hi"]})
    m1 = read_next(c, 120)
    t1 = time.time() - t0
    ok(m1.get("id") == i_n2 and m1.get("result", {}).get("stdout") == "hi\n" and t1 < 3,
       f"another identity is answered while a sandbox with big public data is created ({t1:.1f} s)",
       [m1.get("id"), {"n1": i_big, "n2": i_n2}, m1])
    m_big = m1 if m1.get("id") == i_big else wait_answer(c, i_big, 120)
    r = exec_(c, "n2", "ls /source | wc -l")
    ok(m_big.get("result", {}).get("stdout") == "300\n" and
       r.get("result", {}).get("stdout") == "0\n" and r["result"]["sandbox"] == name_n2,
       "the new sandbox sees its public data; the older one keeps its own (none)", [m_big, r])
    NAMES.add(sandbox_name("n1"))

    # --- the manual clock does not move with the wall clock ---------------------------
    # (this server: --test-clock --idle-pause 1 --idle-stop 3)
    r = exec_(c, "n2", "true")
    time.sleep(4.5)
    st = status(c, "n2")
    ok(r.get("result", {}).get("exit_code") == 0 and st.get("state") == "running",
       "test clock: 4.5 s of real time past --idle-stop 3 change nothing", [r, st])
    call(c, "_test.advance", {"ms": 1100})
    got = wait_state(c, "n2", "paused", 10)
    ok(got == "paused", "test clock: _test.advance past --idle-pause 1 pauses", got)
    c.close()
    s.term()

    # --- one controller per home ---------------------------------------------------------
    s = Server("--test-clock")
    c = s.client()
    serve_pid = str(s.proc.pid)

    # capsule rm and capsule stop refuse a sandbox the controller owns,
    # paused here (a running one the CLI refused already).
    token4 = f"tok4-{os.getpid()}"
    r = exec_(c, "p4", f"echo {token4} > /work/y")
    name4 = r.get("result", {}).get("sandbox") or sandbox_name("p4")
    call(c, "_test.advance", {"ms": 31000})
    got = wait_state(c, "p4", "paused", 10)
    qemu4 = qemu_of(name4)
    rc, out, err = run_cli("rm", name4)
    ok(got == "paused" and rc not in (0, "timeout") and "capsule serve" in err and serve_pid in err and
       "--force" in err and os.path.exists(os.path.join(sbdir(name4), "private.ext4")),
       "capsule rm of a paused sandbox owned by capsule serve is refused, naming it", [got, rc, err])
    rc, out, err = run_cli("stop", name4)
    st = status(c, "p4")
    ok(rc not in (0, "timeout") and "capsule serve" in err and serve_pid in err and "--force" in err and
       st.get("state") == "paused" and qemu_of(name4) == qemu4 and qemu4,
       "capsule stop of it is refused too; the VM stays paused", [rc, err, st])
    r = exec_(c, "p4", "cat /work/y", timeout=60)
    ok(r.get("result", {}).get("stdout") == token4 + "\n" and qemu_of(name4) == qemu4,
       "after the refusals the identity answers, same VM", r)
    # capsule rm --force goes through the controller.
    rc, out, err = run_cli("rm", "--force", name4)
    st = status(c, "p4")
    ok(rc == 0 and not os.path.exists(sbdir(name4)) and st.get("state") == "none" and not qemu_of(name4),
       "capsule rm --force removes it through serve (status: none)", [rc, err, st])

    # A second serve on the same home refuses to start; the first keeps
    # its VMs.
    token = f"tok-{os.getpid()}-{time.time()}"
    r = exec_(c, "p1", f"echo {token} > /work/x; hostname")
    host1 = r.get("result", {}).get("stdout", "").strip()
    name1 = r.get("result", {}).get("sandbox") or name1
    qemu1 = qemu_of(name1)
    sock2 = os.path.join(RT, "serve2.sock")
    with open(os.path.join(RT, "serve2.err"), "w+") as e2f:
        p2 = subprocess.Popen([CAPSULE, "serve", "--socket", sock2, "--test-clock"], env=ENV,
                              stdout=e2f, stderr=e2f)
        PROCS.append(p2)
        try:
            rc2 = p2.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p2.kill()   # not SIGTERM: that would stop the VMs it took over
            p2.wait()
            rc2 = "still running after 5 s"
        e2f.seek(0)
        err2 = e2f.read()
    ok(rc2 not in (0, "still running after 5 s") and serve_pid in err2 and SOCK in err2,
       "a second capsule serve on the same home exits at once, naming the first (pid, socket)", [rc2, err2])
    st = status(c, "p1")
    ok(qemu1 and st.get("state") in ("running", "paused") and qemu_of(name1) == qemu1,
       "the first serve keeps its VMs and answers", st)

    # capsule mcp on the same home is a client of that serve.
    cfgp = os.path.join(RT, "mcp.json")
    with open(cfgp, "w") as f:
        json.dump({"tools": {"run_command": True}}, f)
    qemus = pids(f"qemu-system.*{HOME}/")
    m = Mcp("--agent", "a", "--peer", "p1", "--config", cfgp)
    init = m.initialize()
    r = m.request(2, "tools/call", {"name": "run_command", "arguments": {"command": "cat /work/x; hostname"}})
    text = tool_text(r)
    ok(init.get("result") and text == f"{token}\n{host1}\n" and qemu_of(name1) == qemu1 and
       pids(f"qemu-system.*{HOME}/") == qemus,
       "capsule mcp runs its tools in serve's sandbox of the identity (no VM of its own)", r)
    m.close_stdin()
    rcm = m.wait(30)
    st = status(c, "p1")
    ok(rcm == 0 and st.get("state") in ("running", "paused") and qemu_of(name1) == qemu1,
       "when mcp's stdin closes it exits and serve's VM keeps running", [rcm, st])
    lines = [x for x in m.stderr().splitlines() if x.strip()]
    ok(all(x.startswith("capsule mcp:") for x in lines),
       "mcp logs as capsule mcp, never as capsule serve", lines)
    other = os.path.join(RT, "other-source")
    os.makedirs(other, exist_ok=True)
    m = Mcp("--agent", "a", "--peer", "p1", "--source", other)
    m.initialize()
    m.request(2, "tools/call", {"name": "read_file", "arguments": {"path": "x"}}, timeout=15)
    rcm = m.wait(15)
    ok(rcm not in (0, "hung") and "--source" in m.stderr(),
       "capsule mcp --source while serve runs without it is refused", [rcm, m.stderr()])
    c.close()
    rc = s.term()
    ok(rc == 0 and qemu_count() == 0, f"SIGTERM after the CLI and mcp (exit {rc}, {qemu_count()} QEMU left)")

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
    wait_until(lambda: call(c, "list")["result"]["warm_pool"]["ready"] >= 1, 60, step=0.1)
    wp = call(c, "list")["result"]["warm_pool"]
    ok(wp == {"size": 1, "members": 1, "ready": 1} and qemu_count() == 1,
       "a warm pool of 1 keeps one VM started before any call", wp)
    r = exec_(c, "w1", "echo warm > /work/w; hostname; cat /proc/self/cgroup")
    got = r.get("result", {}).get("sandbox", "")
    ok(got.startswith("pool-") and r["result"]["exit_code"] == 0,
       "a new identity is given the warm VM", r)
    # A sandbox's first command runs in cgroup cmd-1 (the agent numbers
    # them from 1 in each boot): the spare ran one before.
    ok("0::/cmd-2" in r.get("result", {}).get("stdout", "").split("\n"),
       "the warm VM was warmed by one command before it was given", r)
    wait_until(lambda: call(c, "list")["result"]["warm_pool"]["ready"] >= 1, 60, step=0.1)
    ok(call(c, "list")["result"]["warm_pool"]["ready"] == 1 and qemu_count() == 2,
       "the pool refills; pool VMs count as resident")
    c.close()
    s.term()
    s = Server("--test-clock", "--warm-pool", "1", "--capacity", "3")
    c = s.client()
    r = exec_(c, "w1", "cat /work/w")
    ok(r.get("result", {}).get("sandbox") == got and r["result"]["stdout"] == "warm\n",
       "after a restart the identity keeps the sandbox it was given", r)
    c.close()
    s.term()
    network_policy()
    transfers()
    workspace()
    forks()


def b64(data):
    return base64.b64encode(data).decode()


def transfers():
    """upload and download (inline base64, and from/to --transfer-dir
    trees), the project root (/workspace from --workspace), and the
    private import (docs/serve.md)."""
    td = os.path.join(RT, "xfer")
    tree = os.path.join(td, "in", "tree")
    os.makedirs(os.path.join(tree, "sub"))
    with open(os.path.join(tree, "run.sh"), "w") as f:
        f.write("#!/bin/sh\necho ran\n")
    os.chmod(os.path.join(tree, "run.sh"), 0o755)
    blob = os.urandom(300000)
    with open(os.path.join(tree, "sub", "b.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(RT, "secret.txt"), "w") as f:
        f.write("not for guests\n")
    os.symlink(RT, os.path.join(td, "out-link"))      # inside, pointing out
    imp = os.path.join(RT, "import")
    p1 = os.path.join(imp, "a", "imp1")
    os.makedirs(os.path.join(p1, "sub"))
    with open(os.path.join(p1, "a.txt"), "w") as f:
        f.write("visitor's a\n")
    with open(os.path.join(p1, "sub", "b.bin"), "wb") as f:
        f.write(bytes(range(256)) * 3)
    os.symlink("a.txt", os.path.join(p1, "link"))
    os.mkfifo(os.path.join(p1, "fifo"))
    os.makedirs(os.path.join(imp, "a", "imp2"))
    with open(os.path.join(imp, "a", "imp2", "a.txt"), "w") as f:
        f.write("imported\n")
    proj = os.path.join(RT, "proj")
    os.makedirs(proj)
    with open(os.path.join(proj, "README.md"), "w") as f:
        f.write("# project\n")
    before = {n: os.lstat(os.path.join(p1, n)) for n in ("a.txt", "link", "fifo")}

    s = Server("--test-clock", "--transfer-dir", td, "--private-import", imp, "--workspace", proj)
    c = s.client()
    info = call(c, "info").get("result", {})
    ok(info.get("transfer_dirs") == [os.path.realpath(td)] and info.get("private_import") == os.path.realpath(imp)
       and info.get("workspace") == os.path.realpath(proj) and info.get("inline_max") == INLINE_MAX,
       "info shows the transfer directories, the private import and the workspace", info)

    # The first call makes the sandbox: the private import comes with it.
    every = bytes(range(256))
    r = call(c, "upload", {"identity": ident("imp1"), "path": "all.bin", "content_base64": b64(every)}, 120)
    res = r.get("result", {})
    NAMES.add(res.get("sandbox") or sandbox_name("imp1"))
    im = res.get("import", {})
    ok(res.get("bytes") == 256 and res.get("files") == 1 and im.get("files") == 2 and im.get("conflicts") == []
       and sorted(x.split(":")[0] for x in im.get("refused", [])) == ["fifo", "link"],
       "the first call imports DIR/agent/peer: 2 files, the link and the FIFO refused and named", r)
    r = exec_(c, "imp1", "cat /work/a.txt; sha256sum < /work/sub/b.bin; ls -A /work")
    out = r.get("result", {}).get("stdout", "").split("\n")
    ok(out[:2] == ["visitor's a", hashlib.sha256(bytes(range(256)) * 3).hexdigest() + "  -"] and
       "sub" in out[2:] and "link" not in out[2:] and "fifo" not in out[2:],
       "the guest's /work has a.txt and sub/b.bin, not the link or the FIFO", r)
    after = {n: os.lstat(os.path.join(p1, n)) for n in ("a.txt", "link", "fifo")}
    ok(all(before[k].st_ino == after[k].st_ino and before[k].st_mode == after[k].st_mode for k in before) and
       open(os.path.join(p1, "a.txt")).read() == "visitor's a\n",
       "the host copy of the private files is left in place", after)
    ok("import" not in r.get("result", {}), "the import runs once: the next call carries none", r)
    st = status(c, "imp1")
    ok(isinstance(st.get("imported"), int) and st["imported"] > 0, "status says when the import ran", st)

    # Inline base64: binary-safe both ways, mode kept, the cap stated.
    r = call(c, "download", {"identity": ident("imp1"), "path": "all.bin"}, 60)
    ok(base64.b64decode(r.get("result", {}).get("content_base64", "")) == every and r["result"].get("bytes") == 256,
       "download gives back all 256 byte values as uploaded", r)
    r = call(c, "upload", {"identity": ident("imp1"), "path": "sub/x.sh", "content_base64": b64(b"#!/bin/sh\necho x\n"),
                           "mode": "0755"}, 60)
    r2 = exec_(c, "imp1", "stat -c %a /work/sub/x.sh; /work/sub/x.sh")
    ok(r.get("result", {}).get("path") == "sub/x.sh" and r2.get("result", {}).get("stdout") == "755\nx\n",
       "upload writes one file under an existing directory with the mode asked", [r, r2])
    r = call(c, "upload", {"identity": ident("imp1"), "path": "big.bin",
                           "content_base64": b64(b"\0" * (INLINE_MAX + 1))}, 60)
    e = r.get("error", {})
    ok(e.get("code") == -32602 and "16 MiB" in e.get("message", "") and "from" in e.get("message", ""),
       "an inline upload over 16 MiB is refused, naming the cap and from", e)
    r = exec_(c, "imp1", f"head -c {INLINE_MAX + 1} /dev/zero > /work/big.bin && echo made")
    r2 = call(c, "download", {"identity": ident("imp1"), "path": "big.bin"}, 60)
    e = r2.get("error", {})
    ok(r.get("result", {}).get("stdout") == "made\n" and e.get("code") == -32002 and "\"to\"" in e.get("message", ""),
       "an inline download over 16 MiB is refused, saying to use to", [r, e])
    r = call(c, "download", {"identity": ident("imp1"), "path": "sub"}, 60)
    e = r.get("error", {})
    ok(e.get("code") == -32002 and "directory" in e.get("message", "") and "\"to\"" in e.get("message", ""),
       "downloading a directory without to is refused", e)

    # Trees through a --transfer-dir, both ways, the exec bit kept.
    r = call(c, "upload", {"identity": ident("imp1"), "path": "tree", "from": tree}, 60)
    res = r.get("result", {})
    r2 = exec_(c, "imp1", "/work/tree/run.sh; stat -c %a /work/tree/run.sh; sha256sum < /work/tree/sub/b.bin")
    ok(res.get("files") == 2 and res.get("bytes") == len(blob) + len("#!/bin/sh\necho ran\n") and
       r2.get("result", {}).get("stdout") == "ran\n755\n" + hashlib.sha256(blob).hexdigest() + "  -\n",
       "upload from a --transfer-dir tree: nested files, exec bit kept", [r, r2])
    out = os.path.join(td, "out")
    r = call(c, "download", {"identity": ident("imp1"), "path": "tree", "to": out}, 60)
    got = open(os.path.join(out, "sub", "b.bin"), "rb").read() if os.path.exists(os.path.join(out, "sub", "b.bin")) else b""
    ok(r.get("result", {}).get("to") == os.path.realpath(out) and got == blob and
       os.stat(os.path.join(out, "run.sh")).st_mode & 0o777 == 0o755,
       "download of a tree to a new path in a --transfer-dir, exec bit kept", r)
    r = call(c, "upload", {"identity": ident("imp1"), "path": "s.txt", "from": os.path.join(RT, "secret.txt")}, 30)
    r2 = call(c, "upload", {"identity": ident("imp1"), "path": "s.txt",
                            "from": os.path.join(td, "out-link", "secret.txt")}, 30)
    e, e2 = r.get("error", {}), r2.get("error", {})
    ok(e.get("code") == -32602 and e.get("data", {}).get("refused") == [os.path.join(RT, "secret.txt")] and
       e2.get("code") == -32602 and "resolves to" in e2.get("message", ""),
       "from outside the transfer directories is refused, also through a symlink inside them", [e, e2])
    r = call(c, "download", {"identity": ident("imp1"), "path": "all.bin", "to": out}, 30)
    r2 = call(c, "download", {"identity": ident("imp1"), "path": "all.bin", "to": os.path.join(RT, "stolen")}, 30)
    ok(r.get("error", {}).get("code") == -32602 and "exists" in r["error"].get("message", "") and
       r2.get("error", {}).get("code") == -32602 and not os.path.exists(os.path.join(RT, "stolen")),
       "download to an existing path or outside the transfer directories is refused", [r, r2])

    # The project root is /workspace (the --workspace copy).
    r = call(c, "download", {"identity": ident("imp1"), "root": "project", "path": "README.md"}, 60)
    r2 = call(c, "upload", {"identity": ident("imp1"), "root": "project", "path": "new.txt",
                            "content_base64": b64(b"new\n")}, 60)
    r3 = exec_(c, "imp1", "cat /workspace/new.txt")
    ok(base64.b64decode(r.get("result", {}).get("content_base64", "")) == b"# project\n" and
       r3.get("result", {}).get("stdout") == "new\n", "root project is /workspace, the --workspace copy", [r, r2, r3])

    # A conflicting file at a re-run (a crash before the note) is kept and named.
    r = exec_(c, "imp2", "cat /work/a.txt")
    name2 = r.get("result", {}).get("sandbox") or sandbox_name("imp2")
    NAMES.add(name2)
    ok(r.get("result", {}).get("stdout") == "imported\n" and r["result"].get("import", {}).get("files") == 1,
       "a second identity gets its own private files", r)
    rec = os.path.join(HOME, "workspaces", "a", "imp2", "record.json")
    j = json.load(open(rec))
    j.pop("imported", None)
    with open(rec, "w") as f:
        json.dump(j, f)
    exec_(c, "imp2", "echo guest-version > /work/a.txt")
    call(c, "stop", {"identity": ident("imp2")}, 60)
    r = exec_(c, "imp2", "cat /work/a.txt")
    res = r.get("result", {})
    ok(res.get("stdout") == "guest-version\n" and res.get("import", {}).get("conflicts") == ["a.txt"] and
       res["import"].get("files") == 0, "a re-run keeps a differing guest file and names it as a conflict", r)
    ok("imported" in json.load(open(rec)) and "import" not in exec_(c, "imp2", "true").get("result", {}),
       "the re-run is noted again and runs once", json.load(open(rec)))
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "no QEMU left after the transfer tests")


def tree_bytes(d):
    """Every entry below d: relative path -> (mode, content or link target)."""
    got = {}
    for base, dirs, files in os.walk(d):
        for name in dirs + files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, d)
            if os.path.islink(p):
                got[rel] = ("l", os.readlink(p))
            elif os.path.isdir(p):
                got[rel] = (oct(st.st_mode & 0o7777), None)
            else:
                got[rel] = (oct(st.st_mode & 0o7777), open(p, "rb").read())
    return got


def forks():
    """snapshot and fork (docs/serve.md, "Snapshots and forks"): a fork
    after an identity's write gives new identities of the same agent whose
    sandboxes read it, write apart and are their own machines; peers as
    asked; an existing identity is refused as a child; snapshot names the
    snapshot taken."""
    s = Server("--test-clock", "--capacity", "6")
    c = s.client()
    exec_(c, "fp", "echo 1 > /work/x")
    r = call(c, "fork", {"identity": ident("fp"), "count": 2}, 120)
    kids = r.get("result", {}).get("children", [])
    ok(len(kids) == 2 and [k["identity"] for k in kids] == [ident("fp-1"), ident("fp-2")] and
       r["result"]["snapshot"] == sandbox_name("fp") + "-fork1",
       "fork gives new identities fp-1 and fp-2 after the identity's acknowledged write", r)
    for k in kids:
        NAMES.add(k["sandbox"])
    a = exec_(c, "fp-1", "cat /work/x; echo one > /work/y; hostname; head -c 8 /dev/urandom | od -An -tx1")
    b = exec_(c, "fp-2", "cat /work/x; echo two > /work/y; hostname; head -c 8 /dev/urandom | od -An -tx1")
    la = a.get("result", {}).get("stdout", "").split("\n")
    lb = b.get("result", {}).get("stdout", "").split("\n")
    ok(la[:1] == ["1"] and lb[:1] == ["1"] and la[1] != lb[1] and la[2] != lb[2] and
       a["result"]["sandbox"] == kids[0]["sandbox"],
       "each child has the parent's file, a hostname and entropy of its own", (a, b))
    p = exec_(c, "fp", "cat /work/y 2>/dev/null || echo none")
    ok(p.get("result", {}).get("stdout") == "none\n" and
       exec_(c, "fp-2", "cat /work/y").get("result", {}).get("stdout") == "two\n",
       "the children's writes are their own; the parent's disk is unchanged", p)
    r = call(c, "fork", {"identity": ident("fp"), "peers": ["fx"]}, 120)
    ok([k["identity"] for k in r.get("result", {}).get("children", [])] == [ident("fx")],
       "fork with peers names the children as asked", r)
    for k in r.get("result", {}).get("children", []):
        NAMES.add(k["sandbox"])
    r = call(c, "fork", {"identity": ident("fp"), "peers": ["fp-1"]}, 60)
    ok(r.get("error", {}).get("code") == -32002 and "exists already" in r["error"]["message"],
       "an identity that exists is refused as a fork's child", r)
    r = call(c, "snapshot", {"identity": ident("fp"), "name": "fp-snap"}, 60)
    ok(r.get("result", {}).get("snapshot") == "fp-snap" and
       os.path.isfile(os.path.join(HOME, "snapshots", "fp-snap", "state")),
       "snapshot saves the identity's sandbox under the name asked", r)
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "serve stops the forks' VMs too")


def workspace():
    """diff and merge (docs/serve.md, docs/workspace.md): an identity's
    /workspace changes as `capsule diff --json` lists them, merged into the
    server's --workspace DIR byte for byte; another identity's conflicting
    change refused with nothing written, then settled with pick theirs; an
    identity never seen gets nothing made; a server without --workspace
    refuses both."""
    t0 = time.time()
    proj = os.path.join(RT, "wsproj")
    os.makedirs(os.path.join(proj, "src"))
    with open(os.path.join(proj, "README.md"), "w") as f:
        f.write("# project\n")
    with open(os.path.join(proj, "src", "a.txt"), "w") as f:
        f.write("a\n")
    s = Server("--test-clock", "--workspace", proj)
    c = s.client()

    # An identity never seen: nothing to diff or merge, and nothing made.
    r = call(c, "diff", {"identity": ident("ws0")}, 30)
    r2 = call(c, "merge", {"identity": ident("ws0")}, 30)
    e, e2 = r.get("error", {}), r2.get("error", {})
    ok(e.get("code") == -32002 and "nothing to diff" in e.get("message", "") and
       e2.get("code") == -32002 and "nothing to merge" in e2.get("message", "") and
       state(c, "ws0") == "none" and not os.path.exists(os.path.join(HOME, "workspaces", "a", "ws0")) and
       not os.path.exists(sbdir(sandbox_name("ws0"))) and qemu_count() == 0,
       "diff and merge of an identity never seen answer nothing to diff/merge and make nothing", [e, e2])

    # B's sandbox is made now, from the project as it is.
    r = exec_(c, "wsB", "cat /workspace/README.md")
    ok(r.get("result", {}).get("stdout") == "# project\n", "an identity's sandbox has the project at /workspace", r)
    r = exec_(c, "wsA", "printf '# project\\nedited by A\\n' > /workspace/README.md && "
              "printf 'new\\n' > /workspace/new.txt && chmod 755 /workspace/new.txt")
    name_a = r.get("result", {}).get("sandbox") or sandbox_name("wsA")
    r = call(c, "diff", {"identity": ident("wsA")}, 60)
    res = r.get("result", {})
    ch = {x.get("path"): x for x in res.get("changes", [])}
    readme = b"# project\nedited by A\n"
    ok(res.get("sandbox") == name_a and [x.get("path") for x in res.get("changes", [])] == ["README.md", "new.txt"] and
       ch["README.md"] == {"path": "README.md", "change": "modified", "type": "file", "mode": "0644",
                           "old_mode": "0644", "size": len(readme), "sha256": hashlib.sha256(readme).hexdigest()} and
       ch["new.txt"] == {"path": "new.txt", "change": "added", "type": "file", "mode": "0755", "old_mode": None,
                         "size": 4, "sha256": hashlib.sha256(b"new\n").hexdigest()},
       "diff lists exactly the edited and the added file, with their modes, sizes and hashes", r)
    rc, out, err = run_cli("diff", name_a, "--json")
    try:
        cli = json.loads(out)
    except ValueError:
        cli = out
    ok(rc == 0 and cli == res, "diff's result is what capsule diff --json prints", [rc, cli, err])

    r = call(c, "merge", {"identity": ident("wsA"), "dry_run": True}, 60)
    ok(r.get("result", {}).get("dry_run") is True and r["result"].get("written") == 2 and
       open(os.path.join(proj, "README.md")).read() == "# project\n" and not os.path.exists(os.path.join(proj, "new.txt")),
       "merge with dry_run says what it would write and writes nothing", r)
    r = call(c, "merge", {"identity": ident("wsA")}, 60)
    res = r.get("result", {})
    ok(res == {"sandbox": name_a, "into": os.path.realpath(proj), "dry_run": False, "written": 2, "removed": 0,
               "created": 0, "chmod": 0, "links": 0, "git_left_out": 0} and
       open(os.path.join(proj, "README.md"), "rb").read() == readme and
       open(os.path.join(proj, "new.txt"), "rb").read() == b"new\n" and
       os.stat(os.path.join(proj, "new.txt")).st_mode & 0o777 == 0o755 and
       not [x for x in os.listdir(proj) if x.startswith(".capsule-merge.")],
       "merge writes both files into DIR byte for byte, the mode kept, no staging left", r)
    r = call(c, "diff", {"identity": ident("wsA")}, 60)
    ok(r.get("result", {}).get("changes") == [], "after the merge the base moved: diff lists nothing", r)

    # Merges into DIR run one at a time: one waits while DIR is locked.
    exec_(c, "wsA", "echo a2 > /workspace/src/a.txt")
    held = os.open(proj, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    mid = c.send("merge", {"identity": ident("wsA")})
    early = read_next(c, 1.5)
    unchanged = open(os.path.join(proj, "src", "a.txt")).read() == "a\n"
    os.close(held)
    r = wait_answer(c, mid, 60)
    ok("exception" in early and unchanged and r.get("result", {}).get("written") == 1 and
       open(os.path.join(proj, "src", "a.txt")).read() == "a2\n",
       "a merge waits while another holds DIR's lock, then writes", [early, r])

    # B changes the same file its own way: its base is the project before A.
    exec_(c, "wsB", "echo 'B version' > /workspace/README.md")
    before = tree_bytes(proj)
    r = call(c, "merge", {"identity": ident("wsB")}, 60)
    e = r.get("error", {})
    ok(e.get("code") == -32002 and e.get("data", {}).get("conflicts") == [{"path": "README.md", "why": "changed on both sides"}]
       and "pick" in e.get("message", "") and tree_bytes(proj) == before and
       not [x for x in os.listdir(proj) if x.startswith(".capsule-merge.")],
       "another identity's change of the same file is a conflict naming the path; DIR unchanged", r)
    r = call(c, "merge", {"identity": ident("wsB"), "pick": "mine"}, 30)
    ok(r.get("error", {}).get("code") == -32602 and "theirs" in r["error"].get("message", ""),
       "a pick other than refuse, theirs or ours is refused", r)
    r = call(c, "merge", {"identity": ident("wsB"), "pick": "theirs"}, 60)
    res = r.get("result", {})
    after = tree_bytes(proj)
    ok(res.get("written") == 1 and open(os.path.join(proj, "README.md")).read() == "B version\n" and
       after.get("new.txt") == before.get("new.txt") and after.get("src/a.txt") == before.get("src/a.txt"),
       "pick theirs takes B's version; A's merged file, which B never had, stays", r)
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "no QEMU left after the workspace tests")

    # A server without --workspace has no project to diff or merge.
    s = Server("--test-clock")
    c = s.client()
    r = call(c, "diff", {"identity": ident("wsA")}, 30)
    r2 = call(c, "merge", {"identity": ident("wsA")}, 30)
    ok(all(x.get("error", {}).get("code") == -32602 and "--workspace" in x["error"].get("message", "") for x in (r, r2))
       and qemu_count() == 0, "without --workspace, diff and merge are refused saying so", [r, r2])
    c.close()
    s.term()
    print(f"# workspace tests done after {time.time() - t0:.0f} s", flush=True)


def record_network(name):
    """The "network" words of a sandbox's record, None without the key."""
    try:
        return json.load(open(os.path.join(sbdir(name), "record.json"))).get("network")
    except (OSError, ValueError) as e:
        return repr(e)


def network_policy():
    """One policy for the server's sandboxes: info reports it, a sandbox
    made under it records it, and one made under another takes the
    server's at its next start (docs/network.md)."""
    s = Server("--test-clock", "--allow-egress", "203.0.113.10", "--allow-lan")
    c = s.client()
    r = call(c, "info")
    ok(r.get("result", {}).get("network") == ["allow-lan", "allow-egress=203.0.113.10"],
       "info reports the server's network policy as words", r)
    r = exec_(c, "net1", "echo with-nic")
    name = r.get("result", {}).get("sandbox") or sandbox_name("net1")
    NAMES.add(name)
    ok(record_network(name) == ["allow-lan", "allow-egress=203.0.113.10"],
       "a sandbox serve creates records the server's policy", [record_network(name), r])
    ok(r.get("result", {}).get("stdout") == "with-nic\n", "a sandbox with a NIC runs the call", r)
    call(c, "stop", {"identity": ident("net1")}, 60)
    c.close()
    s.term()
    # Another server's policy is taken at the next start.
    s = Server("--test-clock", "--allow-public")
    c = s.client()
    r = exec_(c, "net1", "true")
    ok(record_network(name) == ["allow-public"],
       "after a stop, the next start under another server's policy records that policy",
       [record_network(name), r])
    call(c, "stop", {"identity": ident("net1")}, 60)
    c.close()
    s.term()
    # ... and a server without one takes the NIC away.
    s = Server("--test-clock")
    c = s.client()
    r = exec_(c, "net1", "true")
    ok(record_network(name) is None and r.get("result", {}).get("exit_code") == 0,
       "the next start under a server without a policy records none", [record_network(name), r])
    c.close()
    ok(s.term() == 0 and qemu_count() == 0, "no QEMU left at the end")


ONLY = os.environ.get("SERVE_ONLY")   # "transfers" (20 tests), "workspace" (13): that part alone
try:
    if ONLY == "transfers":
        PLAN = 20
        print(f"1..{PLAN}", flush=True)
        subprocess.run([CAPSULE, "image", "build", "base"], env=ENV, capture_output=True, check=True)
        transfers()
    elif ONLY == "workspace":
        PLAN = 13
        print(f"1..{PLAN}", flush=True)
        subprocess.run([CAPSULE, "image", "build", "base"], env=ENV, capture_output=True, check=True)
        workspace()
    else:
        main()
except Exception as e:  # a crash is a failure, counted by the runner
    print(f"# test-serve crashed: {e!r}", flush=True)
    import traceback
    traceback.print_exc()
finally:
    cleanup()
sys.exit(1 if failed or n != PLAN else 0)
