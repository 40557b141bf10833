#!/usr/bin/env python3
"""Preparation (docs/serve.md, "prepare") and socket activation of
`capsule serve`, against the real binary on private homes: the first
tool call of an unprepared server prepares (progress notifications for
its id, "prepared" in its result); prepare's notifications in order
(phases in order, done never going down, ready for each), a second one
building nothing, two at once answered alike; `capsule prepare` asking
the running server, one line per phase in a pipe; a failing image phase
(data.phase "image", retryable) retried after the image is imported; the
kernel phase with a fake builder (a failing one, then one that makes the
kernel), and without one; serve on a socket passed as descriptor 3 with
LISTEN_PID/LISTEN_FDS. The real cached kernel is used (CAPSULE_KERNEL):
nothing compiles a kernel. TAP output.

    python3 tests/integration/test-prepare.py build/capsule"""
import json
import os
import pty
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

CAPSULE = os.path.abspath(sys.argv[1])
BUILD = os.path.dirname(CAPSULE)
RT = tempfile.mkdtemp(prefix="cprep.", dir="/tmp")
CACHE = os.environ.get("CAPSULE_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "capsule")
KERNEL = os.environ.get("CAPSULE_KERNEL") or os.path.join(CACHE, "vmlinux")
BASE_ENV = dict(os.environ, CAPSULE_KERNEL=KERNEL, XDG_RUNTIME_DIR=RT)
BASE_ENV.setdefault("CAPSULE_AGENT", os.path.join(BUILD, "capsule-agent"))
BASE_ENV.pop("CAPSULE_KERNEL_BUILDER", None)
BASE_ENV.pop("CAPSULE_TEMPLATES", None)
PHASES = ["kernel", "initramfs", "image", "template"]

n = 0
failed = 0
servers = []


def ok(cond, what, detail=""):
    global n, failed
    n += 1
    if cond:
        print(f"ok {n} - {what}")
    else:
        failed += 1
        print(f"not ok {n} - {what}")
        for line in str(detail).splitlines()[:30]:
            print(f"# {line}")
    sys.stdout.flush()
    return cond


def env_for(home, **extra):
    e = dict(BASE_ENV, CAPSULE_HOME=home)
    e.update(extra)
    return e


def run(args, env, timeout=120):
    return subprocess.run([CAPSULE] + args, env=env, capture_output=True, text=True, timeout=timeout)


class Conn:
    """One connection: requests with ids, notifications collected."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile("r")
        self.next = 1

    def call(self, method, params=None, timeout=60):
        rid = self.next
        self.next += 1
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.s.sendall((json.dumps(msg) + "\n").encode())
        notes = []
        self.s.settimeout(timeout)
        while True:
            line = self.f.readline()
            if not line:
                raise RuntimeError(f"connection closed during {method}")
            m = json.loads(line)
            if "id" not in m:
                notes.append(m)
                continue
            if m["id"] == rid:
                return m, notes, rid

    def close(self):
        self.f.close()
        self.s.close()


def start_serve(home, sock, *extra, env=None):
    log = open(os.path.join(RT, os.path.basename(home) + ".serve.log"), "w")
    p = subprocess.Popen([CAPSULE, "serve", "--socket", sock] + list(extra), env=env or env_for(home),
                         stdout=log, stderr=log)
    servers.append(p)
    for _ in range(600):
        if os.path.exists(sock):
            try:
                c = Conn(sock)
                c.close()
                return p
            except OSError:
                pass
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("serve did not start: " + open(log.name).read())


def stop(p):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_pty(args, env, timeout=120):
    """args with stderr on a terminal: (exit status, what the terminal got)."""
    mfd, sfd = pty.openpty()
    p = subprocess.Popen([CAPSULE] + args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=sfd)
    os.close(sfd)
    out = b""
    end = time.time() + timeout
    while time.time() < end:
        try:
            d = os.read(mfd, 65536)
        except OSError:
            break
        if not d:
            break
        out += d
    p.wait(timeout)
    os.close(mfd)
    return p.returncode, out.decode(errors="replace")


def progress_ok(notes, rid):
    """Notifications of one preparation, in order: None or what is wrong."""
    last_done = -1
    last_phase = -1
    ready = []
    for m in notes:
        if m.get("method") != "progress":
            continue  # clients ignore unknown notifications
        p = m.get("params", {})
        if p.get("request") != rid:
            return f"request {p.get('request')} is not {rid}: {m}"
        if p.get("total") != 4 or p.get("phase") not in PHASES:
            return f"bad total or phase: {m}"
        ph = PHASES.index(p["phase"])
        if ph < last_phase:
            return f"phase went back: {m}"
        last_phase = ph
        if p["done"] < last_done:
            return f"done went down: {m}"
        last_done = p["done"]
        if p["status"] == "ready":
            ready.append(p["phase"])
            if p["done"] != len(ready):
                return f"done {p['done']} after {len(ready)} ready: {m}"
        elif p["status"] not in ("building", "line", "failed"):
            return f"bad status: {m}"
    if ready != PHASES:
        return f"ready for {ready}, not each phase in order"
    return None


EXEC = {"identity": {"agent": "a", "peer": "p"}, "argv": ["echo", "hi"]}

try:
    print("1..29")
    # --- a server's first tool call prepares; prepare after it builds nothing ---
    h1 = os.path.join(RT, "h1")
    s1 = os.path.join(RT, "s1.sock")
    srv = start_serve(h1, s1)
    c = Conn(s1)
    m, notes, rid = c.call("exec", EXEC, timeout=120)
    res = m.get("result", {})
    ok(res.get("stdout") == "hi\n", "the first exec on an unprepared server runs", m)
    ok(isinstance(res.get("prepared"), list) and "template" in res["prepared"],
       "its result carries prepared with what it built", m)
    ok(notes and progress_ok(notes, rid) is None, "it got progress notifications for its own id, in order",
       progress_ok(notes, rid) if notes else "no notifications")
    m, notes, rid = c.call("exec", EXEC)
    ok("prepared" not in m.get("result", {}) and not notes, "a second exec carries no prepared, no notifications", m)
    m, notes, rid = c.call("prepare", timeout=60)
    res = m.get("result", {})
    ok(res.get("prepared") is True and res.get("built") == [], "prepare on a prepared server builds nothing", m)
    ok(progress_ok(notes, rid) is None, "prepare streams progress in order (phases, done, ready each)",
       progress_ok(notes, rid))
    ok(res.get("image", {}).get("name") == "base" and res["image"]["digest"].startswith("sha256:")
       and os.path.exists(res.get("kernel", "")) and os.path.exists(res.get("initramfs", ""))
       and res.get("template") is True and isinstance(res.get("duration_ms"), int),
       "prepare's result: kernel, initramfs, image, template, duration_ms", res)
    # Two at once, on two connections: both answered, each its notifications.
    outs = {}

    def one(k):
        cc = Conn(s1)
        outs[k] = cc.call("prepare", {}, timeout=60)
        cc.close()
    ts = [threading.Thread(target=one, args=(k,)) for k in range(2)]
    [t.start() for t in ts]
    [t.join(90) for t in ts]
    ok(len(outs) == 2 and all(o[0].get("result", {}).get("prepared") is True and progress_ok(o[1], o[2]) is None
                              for o in outs.values()), "two prepares at once: both answered, both streamed", outs)
    # capsule prepare asks the running server; one line per phase in a pipe.
    r = run(["prepare"], env_for(h1))
    lines = r.stderr.splitlines()
    ok(r.returncode == 0 and len(lines) == 4 and all(l.startswith(f"prepare: [{i + 1}/4] {PHASES[i]} ")
                                                    for i, l in enumerate(lines)),
       "capsule prepare (server running), in a pipe: one line per phase, exit 0", r.stderr)
    r = run(["prepare", "-q", "--json"], env_for(h1))
    ok(r.returncode == 0 and r.stderr == "" and json.loads(r.stdout).get("built") == [],
       "capsule prepare -q --json: silent, the result on stdout", r.stdout + r.stderr)
    c.close()
    stop(srv)

    # --- socket activation: a listening socket as descriptor 3 ---
    asock = os.path.join(RT, "act.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(asock)
    ls.listen(8)
    fd = ls.fileno()
    alog = open(os.path.join(RT, "act.log"), "w")
    act = subprocess.Popen(["sh", "-c", 'LISTEN_PID=$$ exec "$0" serve --socket "$1"', CAPSULE,
                            os.path.join(RT, "unused.sock")],
                           env=env_for(h1, LISTEN_FDS="1"), stdout=alog, stderr=alog, close_fds=False,
                           preexec_fn=lambda: os.set_inheritable(3, True) if fd == 3 else os.dup2(fd, 3))
    servers.append(act)
    ls.close()  # only the server holds it now
    time.sleep(0.2)
    try:
        ca = Conn(asock)
        m, notes, rid = ca.call("exec", EXEC, timeout=120)
        ok(m.get("result", {}).get("stdout") == "hi\n", "serve on an activated socket answers a call", m)
        m, _, _ = ca.call("info")
        ok(m.get("result", {}).get("pid") == act.pid, "it is the process started with LISTEN_PID", m)
        ca.close()
    except Exception as e:  # noqa: BLE001
        ok(False, "serve on an activated socket answers a call", e)
        ok(False, "it is the process started with LISTEN_PID", "")
    stop(act)
    log = open(alog.name).read()
    ok(f"listening on {asock} (passed by the service manager)" in log and
       not os.path.exists(os.path.join(RT, "unused.sock")),
       "it reports the socket's bound name and binds no other", log)
    ok(os.path.exists(asock), "the passed socket is not unlinked at exit (the manager's)", log)
    # LISTEN_PID of another process: not taken, serve binds its own.
    r = subprocess.run([CAPSULE, "serve", "--socket", os.path.join(RT, "x.sock"), "--help"],
                       env=env_for(h1, LISTEN_PID="1", LISTEN_FDS="1"), capture_output=True, text=True)
    ok(r.returncode == 0, "serve --help with another process's LISTEN_PID", r.stderr)

    # --- a failing image phase, retried after the image is there ---
    h2 = os.path.join(RT, "h2")
    s2 = os.path.join(RT, "s2.sock")
    srv = start_serve(h2, s2, "--image", "nosuch")
    c = Conn(s2)
    m, notes, rid = c.call("prepare")
    err = m.get("error", {})
    ok(err.get("code") == -32000 and err.get("data", {}).get("phase") == "image"
       and err["data"].get("retryable") is True and "nosuch" in err.get("message", ""),
       "prepare with a missing image fails in phase image, retryable, naming it", m)
    st = [(x["params"]["phase"], x["params"]["status"]) for x in notes if x.get("method") == "progress"]
    ok(("image", "failed") in st and ("kernel", "ready") in st and ("template", "building") not in st,
       "its notifications: kernel ready, image failed, no template", st)
    m, notes, rid = c.call("exec", EXEC)
    ok(m.get("error", {}).get("data", {}).get("phase") == "image",
       "a tool call on it fails with the same phase", m)
    tiny = os.path.join(RT, "tiny")
    os.makedirs(os.path.join(tiny, "etc"))
    open(os.path.join(tiny, "etc", "hello"), "w").write("hi\n")
    r = run(["image", "import", tiny, "--name", "nosuch"], env_for(h2))
    ok(r.returncode == 0, "capsule image import of a tiny directory as that name", r.stderr)
    m, notes, rid = c.call("prepare", timeout=120)
    ok(m.get("result", {}).get("prepared") is True and progress_ok(notes, rid) is None
       and m["result"]["image"]["name"] == "nosuch",
       "prepare again succeeds (retried from the image phase)", m)
    c.close()
    stop(srv)

    # --- the kernel phase, locally (no server), with fake builders ---
    h3 = os.path.join(RT, "h3")
    kdir = os.path.join(RT, "k")
    os.makedirs(kdir)
    missing = os.path.join(kdir, "vmlinux")
    bad = os.path.join(RT, "bad-builder.sh")
    open(bad, "w").write("#!/bin/sh\necho 'kernel: configuring'\necho 'kernel: error: no compiler' >&2\nexit 3\n")
    good = os.path.join(RT, "good-builder.sh")
    open(good, "w").write(f"#!/bin/sh\necho 'kernel: building'\nsleep 0.1\necho 'kernel: built'\n"
                          f"ln -s '{os.path.realpath(KERNEL)}' '{missing}'\n")
    os.chmod(bad, 0o755)
    os.chmod(good, 0o755)
    e3 = env_for(h3, CAPSULE_KERNEL=missing, CAPSULE_TEMPLATES="0")
    r = run(["prepare"], dict(e3, CAPSULE_KERNEL_BUILDER=os.path.join(RT, "nobuilder.sh")))
    ok(r.returncode == 125 and "kernel" in r.stderr and "make kernel" in r.stderr and missing in r.stderr,
       "without a builder the kernel phase fails saying how to get the kernel (exit 125)", r.stderr)
    r = run(["prepare", "--json"], dict(e3, CAPSULE_KERNEL_BUILDER=bad))
    j = json.loads(r.stdout or "{}")
    ok(r.returncode == 125 and j.get("phase") == "kernel" and j.get("retryable") is True
       and "no compiler" in r.stderr and not os.path.exists(missing),
       "a failing builder: phase kernel named with its last line, nothing taken for made", r.stdout + r.stderr)
    r = run(["prepare", "--json"], dict(e3, CAPSULE_KERNEL_BUILDER=good))
    j = json.loads(r.stdout or "{}")
    ok(r.returncode == 0 and j.get("built", [None])[0] == "kernel" and j.get("template") is False
       and os.path.exists(missing),
       "retried with a working builder: the kernel is built, templates off said", r.stdout + r.stderr)
    r = run(["prepare", "--json"], dict(e3, CAPSULE_KERNEL_BUILDER=bad))
    ok(r.returncode == 0 and json.loads(r.stdout).get("built") == [],
       "then prepare builds nothing (the builder is not run again)", r.stdout + r.stderr)
    # --- progress manners with a chatty builder (500 lines) ---
    missing2 = os.path.join(kdir, "vmlinux2")
    chatty = os.path.join(RT, "chatty-builder.sh")
    open(chatty, "w").write("#!/bin/sh\ni=0\nwhile [ $i -lt 500 ]; do echo \"  CC drivers/x$i.o\"; i=$((i+1)); done\n"
                            f"ln -s '{os.path.realpath(KERNEL)}' '{missing2}'\n")
    os.chmod(chatty, 0o755)
    e4 = env_for(h3, CAPSULE_KERNEL=missing2, CAPSULE_TEMPLATES="0", CAPSULE_KERNEL_BUILDER=chatty)
    r = run(["prepare"], e4)
    lines = r.stderr.splitlines()
    ok(r.returncode == 0 and len(lines) == 4 and all(l.startswith(f"prepare: [{i + 1}/4] {PHASES[i]} ")
                                                    for i, l in enumerate(lines)),
       "a kernel built in a pipe: one line per phase, none of the builder's 500", r.stderr[-3000:])
    os.unlink(missing2)
    rc, out = run_pty(["prepare"], dict(e4, TERM="dumb"))
    lines = out.replace("\r\n", "\n").splitlines()
    ok(rc == 0 and len(lines) == 4 and "\033" not in out and all(l.startswith(f"prepare: [{i + 1}/4] {PHASES[i]} ")
                                                                 for i, l in enumerate(lines)),
       "on a TERM=dumb terminal: one plain line per phase too", out[-3000:])
    os.unlink(missing2)
    rc, out = run_pty(["prepare"], dict(e4, TERM="xterm"))
    ok(rc == 0 and out.count("\n") <= 12 and "kernel: CC drivers/x499" in out and "kernel built now" in out,
       "on a terminal: the builder's lines rewrite one line (at most 12 lines in all)",
       f"{out.count(chr(10))} lines: " + out[-2000:])
    # The cache's lock cannot be taken: phase "lock", the path named.
    cache2 = os.path.join(RT, "cache2")
    os.makedirs(os.path.join(cache2, "prepare.lock"))
    r = run(["prepare", "--json"], dict(e4, CAPSULE_CACHE=cache2))
    j = json.loads(r.stdout or "{}")
    ok(r.returncode == 125 and j.get("phase") == "lock" and os.path.join(cache2, "prepare.lock") in j.get("error", "")
       and "preparing the kernel" not in j.get("error", ""),
       "a lock that cannot be taken fails as phase lock, naming its path", r.stdout + r.stderr)
    # A builder that ignores SIGTERM does not hold up serve's shutdown.
    stubborn = os.path.join(RT, "stubborn-builder.sh")
    open(stubborn, "w").write("#!/bin/sh\ntrap '' TERM\necho 'kernel: started'\nsleep 60\necho 'kernel: done'\n")
    os.chmod(stubborn, 0o755)
    h4 = os.path.join(RT, "h4")
    s4 = os.path.join(RT, "s4.sock")
    srv = start_serve(h4, s4, env=env_for(h4, CAPSULE_KERNEL=os.path.join(kdir, "vmlinux3"),
                                          CAPSULE_TEMPLATES="0", CAPSULE_KERNEL_BUILDER=stubborn))
    c = Conn(s4)
    c.s.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "prepare"}\n')
    c.s.settimeout(30)
    seen = ""
    while "kernel: started" not in seen:
        line = c.f.readline()
        if not line:
            break
        seen += line
    t0 = time.time()
    srv.terminate()
    try:
        srv.wait(20)
    except subprocess.TimeoutExpired:
        pass
    took = time.time() - t0
    ok(srv.poll() is not None and took < 12, f"serve's shutdown ends a builder that ignores SIGTERM ({took:.1f} s)",
       seen[-2000:])
    c.close()
finally:
    for p in servers:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(RT, ignore_errors=True)
sys.exit(1 if failed else 0)
