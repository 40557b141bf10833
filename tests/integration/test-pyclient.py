#!/usr/bin/env python3
"""The Python client (clients/python, capsule_client) against a real
`capsule serve` started here on a private home: typed results, errors as
exceptions with their code and retryable, cancellation (a cancel token, a
call timeout, a Call handle, a cancelled asyncio task), calls from several
threads on one connection, the asyncio client, transfers both ways,
status/list/info/stop/remove, diff and merge, the CLI; and, against a fake
server on a socket of its own, what a real one cannot be made to do on
demand: progress notifications (prepare), an error with id null, a
-32000 prepare failure, a connection that drops mid-call, messages with
ids of the wrong type or nested too deep, a progress callback that calls
the client, an asyncio call cancelled while it is being sent. One identity's
VM serves every check. TAP output.

    python3 tests/integration/test-pyclient.py build/capsule"""
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT_SRC = os.path.join(TOP, "clients", "python", "src")
sys.path.insert(0, CLIENT_SRC)
import capsule_client as cc  # noqa: E402
from capsule_client import (AsyncClient, Busy, CallTimeout, CapsuleError, Cancelled, Client,  # noqa: E402
                            ConnectionLost, Identity, InvalidParams, MethodNotFound, ParseError,
                            SandboxFailed, ToolRefused)

CAPSULE = os.path.abspath(sys.argv[1])
RT = tempfile.mkdtemp(prefix="cpy.", dir="/tmp")
HOME = os.path.join(RT, "home")
XFER = os.path.join(RT, "xfer")
PROJ = os.path.join(RT, "proj")
SOCK = os.path.join(RT, "serve.sock")
LOG = os.path.join(RT, "serve.log")
ENV = dict(os.environ, CAPSULE_HOME=HOME, XDG_RUNTIME_DIR=RT)
WHO = Identity("py", "one")
OTHER = Identity("py", "two")
PLAN = 61

n = 0
failed = 0


def ok(cond, name, detail=""):
    global n, failed
    n += 1
    print(f"{'ok' if cond else 'not ok'} {n} - {name}", flush=True)
    if not cond:
        failed += 1
        for line in str(detail).splitlines()[:20]:
            print(f"# {line}", flush=True)


def raises(fn, cls):
    """The exception fn raised if it is a cls, else None (the other outcome
    is returned as the detail through the second element)."""
    try:
        r = fn()
    except cls as e:
        return e, None
    except Exception as e:  # the wrong exception: a failure, shown
        return None, repr(e)
    return None, f"no exception; returned {r!r}"


def start_server():
    log = open(LOG, "a")
    proc = subprocess.Popen([CAPSULE, "serve", "--socket", SOCK, "--capacity", "1",
                             "--transfer-dir", XFER, "--workspace", PROJ],
                            env=ENV, stdout=log, stderr=log)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"capsule serve exited with {proc.returncode}")
        try:
            cc.Connection(SOCK, timeout=5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("capsule serve did not start")


def stop_server(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # A QEMU that outlived a killed server: only ours (our home's path).
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if HOME.encode() + b"/" in cmd and b"qemu-system" in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


# -- a fake server: scripted answers on a socket of its own -----------------

class FakeServer:
    """Accepts one connection at a time; for each request calls
    script(method, params, id, send) which sends whatever lines it likes."""

    def __init__(self, script):
        self.path = os.path.join(RT, f"fake{id(self)}.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(4)
        self.script = script
        self.seen = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        f = conn.makefile("rb")

        def send(obj):
            conn.sendall((obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n")
        try:
            for line in f:
                m = json.loads(line)
                self.seen.append(m)
                if self.script(m.get("method"), m.get("params"), m.get("id"), send) == "close":
                    conn.shutdown(socket.SHUT_RDWR)
                    break
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.srv.close()


def progress(rid, phase, status, done, message=None):
    return {"jsonrpc": "2.0", "method": "progress",
            "params": {"request": rid, "phase": phase, "status": status, "done": done, "total": 4,
                       "message": message or f"{phase} {status}"}}


def fake_script(method, params, rid, send):
    if method == "prepare":
        send({"jsonrpc": "2.0", "method": "something/else", "params": {"request": rid}})
        for i, ph in enumerate(("kernel", "initramfs", "image", "template")):
            send(progress(rid, ph, "building", i))
            send(progress(rid, ph, "line", i, f"building the {ph}"))
            send(progress(rid + 1000, ph, "ready", i + 1))      # another call's: not ours
            send(progress(rid, ph, "ready", i + 1, "built now"))
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "prepared": True, "built": ["initramfs", "template"], "kernel": "/k", "initramfs": "/i",
            "image": {"name": "base", "digest": "sha256:00"}, "template": True, "duration_ms": 7}})
    elif method == "exec" and params.get("argv") == ["fail-prepare"]:
        send(progress(rid, "kernel", "building", 0))
        send(progress(rid, "kernel", "failed", 0, "guest/build-kernel.sh failed"))
        send({"jsonrpc": "2.0", "id": rid, "error": {
            "code": -32000, "message": "preparing the kernel failed: run capsule prepare",
            "data": {"phase": "kernel", "retryable": True}}})
    elif method == "exec" and params.get("argv") == ["garbled"]:
        send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
    elif method == "exec" and params.get("argv") == ["hang-up"]:
        return "close"
    elif method == "exec":
        send(progress(rid, "template", "building", 3))
        send(progress(rid, "template", "ready", 4))
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "sandbox": "v-0", "exit_code": 0, "signal": None, "timed_out": False, "truncated": False,
            "stdout": "x", "stderr": "", "duration_ms": 1, "prepared": ["template"], "future_field": 42}})
    return None


def fake_tests():
    fake = FakeServer(fake_script)
    try:
        with Client(fake.path, call_timeout=10) as c:
            seen = []
            r = c.prepare(on_progress=seen.append)
            ours = [(p.phase, p.status, p.done) for p in seen]
            ok(r.prepared is True and r.built == ["initramfs", "template"] and r.image["name"] == "base"
               and r.template is True and r.duration_ms == 7,
               "prepare: a typed PrepareResult", r)
            ok(len(seen) == 12 and all(p.request == 1 and p.total == 4 for p in seen) and
               ours[0] == ("kernel", "building", 0) and ours[-1] == ("template", "ready", 4) and
               [p.done for p in seen] == sorted(p.done for p in seen) and seen[1].message == "building the kernel",
               "prepare: its progress notifications reach its callback in order, only its own, "
               "unknown notifications ignored", ours)

            seen = []
            r = c.exec(WHO, ["echo"], on_progress=seen.append)
            ok(r.prepared == ["template"] and [p.status for p in seen] == ["building", "ready"] and
               r["future_field"] == 42 and r.get("absent", "d") == "d",
               "a tool call that prepared first: its progress and 'prepared'; new fields reachable", r)

            seen = []
            e, why = raises(lambda: c.exec(WHO, ["fail-prepare"], on_progress=seen.append), SandboxFailed)
            ok(e is not None and e.code == -32000 and e.retryable and e.phase == "kernel" and
               [p.status for p in seen] == ["building", "failed"],
               "a failed preparation: SandboxFailed -32000, retryable, naming its phase", why or repr(e))

            e, why = raises(lambda: c.exec(WHO, ["garbled"]), ParseError)
            ok(e is not None and e.code == -32700 and not e.retryable,
               "an error with id null reaches the waiting call as ParseError", why or repr(e))

        async def async_prepare():
            async with await AsyncClient.connect(fake.path) as ac:
                s = ac.prepare_stream(call_timeout=10)
                got = [p async for p in s]
                res = await s
                cb = []

                async def acb(p):
                    cb.append(p.status)
                await ac.exec(WHO, ["echo"], on_progress=acb)
                await asyncio.sleep(0.05)
                return got, res, cb
        got, res, cb = asyncio.run(async_prepare())
        ok(len(got) == 12 and got[-1].status == "ready" and res.prepared and cb == ["building", "ready"],
           "async: prepare_stream yields the progress, then its result; a coroutine callback runs",
           (len(got), res, cb))

        c = Client(fake.path)
        e, why = raises(lambda: c.exec(WHO, ["hang-up"]), ConnectionLost)
        e2, why2 = raises(lambda: c.status(WHO), ConnectionLost)
        ok(e is not None and e.code is None and e2 is not None,
           "a server that hangs up: the waiting call and later ones raise ConnectionLost", why or why2)
        c.close()
    finally:
        fake.close()

    e, why = raises(lambda: Client(os.path.join(RT, "nobody.sock")), ConnectionLost)
    ok(e is not None and "nobody.sock" in str(e), "no server at the path: ConnectionLost naming it", why or e)
    ok(cc.error_from({"code": -32001, "message": "busy"}).retryable and
       isinstance(cc.error_from({"code": -32001, "message": "b"}), Busy) and
       not cc.error_from({"code": -32000, "message": "m"}).retryable and
       cc.error_from({"code": -32000, "message": "m", "data": {"retryable": True}}).retryable and
       type(cc.error_from({"code": -1, "message": "m"})) is CapsuleError,
       "error classes: -32001 always retryable, -32000 when data.retryable says so, others plain")


def bounded(fn, secs):
    """fn() run in a thread of its own for at most secs: {"value": ...} or
    {"error": ...}, or {} when it still waits (a hang, shown as such)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: B902 (reported to the caller)
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(secs)
    return dict(box)


def exec_answer(rid, out):
    return {"jsonrpc": "2.0", "id": rid, "result": {
        "sandbox": "v-0", "exit_code": 0, "signal": None, "timed_out": False, "truncated": False,
        "stdout": out, "stderr": "", "duration_ms": 1}}


def rough_script(method, params, rid, send):
    """A server that sends what a client must survive."""
    argv = params.get("argv") if isinstance(params, dict) else None
    if method == "cancel":
        send({"jsonrpc": "2.0", "id": params["id"], "error": {"code": -32800, "message": "cancelled"}})
        send({"jsonrpc": "2.0", "id": rid, "result": {"cancelled": True}})
    elif method == "prepare":
        send(progress(rid, "kernel", "building", 0))
        send(progress(rid, "kernel", "ready", 1))
        send({"jsonrpc": "2.0", "id": rid, "result": {"prepared": True, "built": []}})
    elif argv == ["bad-ids"]:
        for bad in ([rid], {"id": rid}, True, None):
            m = progress(rid, "kernel", "building", 0)
            m["params"]["request"] = bad
            send(m)
        send({"jsonrpc": "2.0", "id": [rid], "result": {"exit_code": 99}})
        send({"jsonrpc": "2.0", "id": {"id": rid}, "result": {"exit_code": 98}})
        send(progress(rid, "template", "ready", 4))
        send(exec_answer(rid, "fine"))
    elif argv == ["bad-id-error"]:
        send({"jsonrpc": "2.0", "id": [rid], "error": {"code": -32700, "message": "parse error"}})
    elif argv == ["deep"]:
        send(b"[" * 100000 + b"]" * 100000)
    elif argv == ["stall"]:
        time.sleep(0.6)         # not reading meanwhile: the client's writes back up
        send(exec_answer(rid, "stalled"))
    elif method == "write_file":
        send({"jsonrpc": "2.0", "id": rid, "result": {"path": "/work/big", "bytes": 1}})
    elif method == "status":
        send({"jsonrpc": "2.0", "id": rid, "result": {"state": "none"}})
    else:
        send(exec_answer(rid, "x"))


def durable_tests():
    """durable=: "durable": false is sent only when asked, a non-bool is
    refused before sending; the results read "durable" and "sync_ms"."""
    fake = FakeServer(rough_script)
    with Client(fake.path) as c:
        c.exec(WHO, ["default"])
        c.exec(WHO, ["fast"], durable=False)
        c.write_file(WHO, "w", "x", durable=False)
        c.upload(WHO, "u", b"1", durable=False)
        c.upload(WHO, "v", b"1", durable=True)
        e, why = raises(lambda: c.exec(WHO, ["x"], durable="no"), TypeError)
        sent = [(m["method"], m["params"].get("durable", "absent")) for m in fake.seen
                if m.get("method") in ("exec", "write_file", "upload")]
    fake.close()
    ok(sent == [("exec", "absent"), ("exec", False), ("write_file", False), ("upload", False),
                ("upload", "absent")] and e is not None,
       "durable=False sends \"durable\": false, the default sends nothing, a non-bool is refused", (sent, why))
    r = cc.ExecResult.from_json({"exit_code": 0, "durable": True, "sync_ms": 7})
    w = cc.WriteResult.from_json({"bytes": 1, "durable": False, "sync_ms": 0})
    u = cc.TransferResult.from_json({"files": 1})
    ok(r.durable is True and r.sync_ms == 7 and w.durable is False and u.durable is None,
       "results expose durable and sync_ms (None when the server does not say)", (r, w, u))


def rough_tests():
    fake = FakeServer(rough_script)
    quiet = logging.getLogger("capsule_client")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)    # the client logs the lines it drops, with a traceback
    try:
        # 1. ids of the wrong type: ignored (an error: as id null); too deep: dropped
        c = Client(fake.path)
        seen = []
        got = bounded(lambda: c.exec(WHO, ["bad-ids"], on_progress=seen.append), 5)
        r = got.get("value")
        ok(r is not None and r.stdout == "fine" and [(p.request, p.status) for p in seen] == [(1, "ready")],
           "progress with a list/object/bool/null request and answers with a list/object id are ignored; "
           "the call then gets its own answer", (got, seen))
        got = bounded(lambda: c.exec(WHO, ["bad-id-error"]), 5)
        ok(isinstance(got.get("error"), ParseError),
           "an error answer whose id is a list: treated as id null, the waiting call gets it", got)
        got = bounded(lambda: c.exec(WHO, ["deep"]), 5)
        got2 = bounded(lambda: c.status(WHO), 5)
        ok(isinstance(got.get("error"), ConnectionLost) and "RecursionError" in str(got["error"]) and
           isinstance(got2.get("error"), ConnectionLost),
           "a line nested too deep to read: the waiting call and later ones raise ConnectionLost, no hang",
           (got, got2))
        c.close()

        # 2. a progress callback that calls the client on its reader thread
        c = Client(fake.path)
        errs = []

        def cb(p):
            if p.status != "building":
                return
            for fn in (lambda: c.status(WHO), lambda: c.submit("status", {"identity": WHO.to_json()}).result(5)):
                try:
                    fn()
                    errs.append("no error")
                except RuntimeError as e:
                    errs.append(str(e))
                except Exception as e:  # the wrong error: shown
                    errs.append(repr(e))
        got = bounded(lambda: c.prepare(on_progress=cb), 5)
        r = got.get("value")
        ok(r is not None and r.prepared and len(errs) == 2 and
           all("reader thread" in e and "another thread" in e for e in errs),
           "an on_progress callback that waits on the same Client: RuntimeError (call and Call.result), "
           "no deadlock", (got, errs))
        got = bounded(lambda: c.status(WHO), 5)
        ok(got.get("value") is not None and got["value"].state == "none",
           "the client goes on answering after that callback", got)
        c.close()

        # 3. asyncio: bad ids, cancelled while sending
        async def arough():
            out = {}
            async with await AsyncClient.connect(fake.path) as ac:
                seen = []
                try:
                    r = await asyncio.wait_for(ac.exec(WHO, ["bad-ids"], on_progress=seen.append), 5)
                    out["bad"] = (r.stdout, [(p.request, p.status) for p in seen])
                except Exception as e:  # shown
                    out["bad"] = repr(e)

                # cancelled waiting for the send lock: nothing sent, nothing left
                await ac._send_lock.acquire()
                t = asyncio.ensure_future(ac.exec(WHO, ["locked-out"]))
                await asyncio.sleep(0.05)
                t.cancel()
                await asyncio.sleep(0)
                ac._send_lock.release()
                try:
                    await t
                    out["lock"] = "not cancelled"
                except asyncio.CancelledError:
                    out["lock"] = dict(ac._pending)
                out["after"] = (await asyncio.wait_for(ac.exec(WHO, ["echo"]), 5)).stdout

                # cancelled in drain(), the line already written: the server is sent cancel
                stall = asyncio.ensure_future(ac.exec(WHO, ["stall"]))
                await asyncio.sleep(0.05)
                big = asyncio.ensure_future(ac.call("write_file", {"identity": WHO.to_json(), "path": "big",
                                                                   "content": "x" * (4 << 20)}))
                await asyncio.sleep(0.15)
                out["blocked"] = not big.done()
                big.cancel()
                try:
                    await big
                    out["big"] = "not cancelled"
                except asyncio.CancelledError:
                    out["big"] = "cancelled"
                out["stall"] = (await asyncio.wait_for(stall, 5)).stdout
                for _ in range(100):
                    if any(m.get("method") == "cancel" for m in fake.seen) and not ac._pending:
                        break
                    await asyncio.sleep(0.05)
                wf = [m["id"] for m in fake.seen if m.get("method") == "write_file"]
                out["cancel"] = (wf, [m["params"]["id"] for m in fake.seen if m.get("method") == "cancel"],
                                 dict(ac._pending))
                try:
                    await asyncio.wait_for(ac.exec(WHO, ["deep"]), 5)
                    out["deep"] = "answered"
                except ConnectionLost as e:
                    out["deep"] = "lost" if "RecursionError" in str(e) else str(e)
                except Exception as e:  # shown
                    out["deep"] = repr(e)
            return out
        out = asyncio.run(arough())
        ok(out["bad"] == ("fine", [(1, "ready")]) and out["deep"] == "lost",
           "async: messages with ids of the wrong type ignored; a line nested too deep is ConnectionLost", out)
        ok(out["lock"] == {} and out["after"] == "x" and
           not any((m.get("params") or {}).get("argv") == ["locked-out"] for m in fake.seen),
           "async: a call cancelled while waiting to send: not sent, no entry left, the client goes on", out)
        wf, cancels, left = out["cancel"]
        ok(out["blocked"] and out["big"] == "cancelled" and out["stall"] == "stalled" and len(wf) == 1 and
           cancels == wf and left == {},
           "async: a call cancelled in drain() after its line was written: the server is sent cancel for it",
           out)
    finally:
        quiet.setLevel(level)
        fake.close()

    p = subprocess.run([sys.executable, "-m", "capsule_client", "--timeout", "abc", os.path.join(RT, "x.sock"),
                        "status"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=CLIENT_SRC),
                       timeout=30)
    ok(p.returncode == 2 and "'abc'" in p.stderr and "Traceback" not in p.stderr,
       "the CLI with --timeout abc: exit 2, the value named, no traceback", p.stdout + p.stderr)


# -- a real server --------------------------------------------------------------

def real_tests(c):
    # exec, typed
    r = c.exec(WHO, ["sh", "-c", "echo out; echo err >&2; exit 3"], env={"X": "1"}, timeout=20)
    ok(isinstance(r, cc.ExecResult) and r.exit_code == 3 and r.stdout == "out\n" and r.stderr == "err\n" and
       r.sandbox and r.sandbox.startswith("v-") and isinstance(r.duration_ms, int) and not r.timed_out and
       not r.ok and r["exit_code"] == 3,
       "exec: a typed ExecResult (exit code, stdout, stderr, sandbox, duration)", r)
    r = c.exec(WHO, ["sh", "-c", "echo $X; pwd; cat"], env={"X": "y"}, cwd="/tmp", stdin="in")
    ok(r.ok and r.stdout == "y\n/tmp\nin", "exec: env, cwd and stdin are sent", r)
    r = c.exec(WHO, ["sleep", "5"], timeout=1)
    ok(r.timed_out and r.exit_code is None, "exec: the command's own timeout comes back as timed_out", r)
    r = c.exec(WHO, ["sh", "-c", "echo kept > /work/durable.txt"])
    q = c.exec(WHO, ["sh", "-c", "echo quick > /work/quick.txt"], durable=False)
    w = c.write_file(WHO, "quick2.txt", "x", durable=False)
    ok(r.ok and r.durable is True and isinstance(r.sync_ms, int) and q.ok and q.durable is False and
       w.durable is False,
       "exec: durable by default (sync_ms given); durable=False answers durable false, as write_file's", (r, q, w))

    # errors as exceptions
    e, why = raises(lambda: c.read_file(WHO, "../etc/passwd"), InvalidParams)
    ok(e is not None and e.code == -32602 and not e.retryable and "climbs out" in e.message,
       "a bad path raises InvalidParams -32602, not retryable, with the server's message", why or repr(e))
    e, why = raises(lambda: c.call("no.such.method"), MethodNotFound)
    ok(e is not None and e.code == -32601, "an unknown method raises MethodNotFound -32601", why or repr(e))
    c.upload(WHO, "bin.dat", b"\x00\xff\x00binary")
    e, why = raises(lambda: c.read_file(WHO, "bin.dat", root="workspace"), ToolRefused)
    ok(e is not None and e.code == -32002 and isinstance(e, CapsuleError),
       "read_file of a binary file raises ToolRefused -32002", why or repr(e))
    e, why = raises(lambda: c.status(("py", ".hidden")), InvalidParams)
    ok(e is not None, "an identity the server refuses raises InvalidParams", why or repr(e))
    e, why = raises(lambda: c.exec(WHO, "echo hi"), TypeError)
    ok(e is not None, "argv given as a string is refused before sending (a list is needed)", why)

    # Busy: capacity 1, the one VM running a call; another identity's call.
    hold = c.submit("exec", {"identity": WHO.to_json(), "argv": ["sleep", "3"]})
    time.sleep(0.5)
    e, why = raises(lambda: c.exec(OTHER, ["true"]), Busy)
    ok(e is not None and e.code == -32001 and e.retryable,
       "every slot busy raises Busy -32001 with retryable true", why or repr(e))
    ok(hold.result(30)["exit_code"] == 0, "the call that held the slot answers through its Call handle")

    # files
    w = c.write_file(WHO, "notes/a.txt", "héllo\n") if c.exec(WHO, ["mkdir", "-p", "/work/notes"]).ok else None
    f = c.read_file(WHO, "notes/a.txt", root="workspace")
    ok(w is not None and w.bytes == 7 and f.kind == "file" and f.content == "héllo\n",
       "write_file and read_file: UTF-8 text both ways, typed", (w, f))
    d = c.list_directory(WHO, "notes", root="workspace")
    ok(d.kind == "directory" and [(x.name, x.type, x.size) for x in d.entries] == [("a.txt", "file", 7)]
       and not d.truncated, "list_directory: typed entries", d)

    # transfers
    blob = os.urandom(300000)
    u = c.upload(WHO, "blob.bin", blob, mode=0o700)
    g = c.download(WHO, "blob.bin")
    m = c.exec(WHO, ["stat", "-c", "%a", "/work/blob.bin"]).stdout.strip()
    ok(u.files == 1 and u.bytes == len(blob) and g.content == blob and g.bytes == len(blob) and m == "700" and
       u.durable is True,
       "upload bytes (durable) then download them: the same 300000 bytes, the mode kept", (u, g, m))
    src = os.path.join(XFER, "tree")
    os.makedirs(os.path.join(src, "sub"))
    with open(os.path.join(src, "sub", "f.txt"), "w") as fh:
        fh.write("tree file\n")
    u = c.upload(WHO, "tree", from_path=src)
    out = os.path.join(XFER, "back")
    g = c.download(WHO, "tree", to=out)
    ok(u.files == 1 and u.dirs >= 1 and g.to == os.path.realpath(out) and
       open(os.path.join(out, "sub", "f.txt")).read() == "tree file\n",
       "upload from_path and download to: a tree through the transfer directory", (u, g))
    e, why = raises(lambda: c.download(WHO, "tree", to="/tmp/elsewhere-not-allowed"), InvalidParams)
    ok(e is not None and e.data and "transfer_dirs" in e.data,
       "a download to a path outside the transfer directories: InvalidParams with its data", why or repr(e))
    e, why = raises(lambda: c.upload(WHO, "x", b"1", from_path=src), TypeError)
    ok(e is not None, "upload refuses both content and from_path", why)

    # diff and merge (the server's --workspace)
    c.exec(WHO, ["sh", "-c", "echo new > /workspace/new.txt"])
    df = c.diff(WHO)
    ok([(x["path"], x["change"]) for x in df.changes] == [("new.txt", "added")] and df.sandbox,
       "diff: the sandbox's change to /workspace, typed", df)
    dry = c.merge(WHO, dry_run=True)
    ok(dry.dry_run and dry.written == 1 and not os.path.exists(os.path.join(PROJ, "new.txt")),
       "merge with dry_run: what it would write, nothing written", dry)
    mg = c.merge(WHO)
    ok(mg.written == 1 and mg.removed == 0 and mg.into == os.path.realpath(PROJ) and
       open(os.path.join(PROJ, "new.txt")).read() == "new\n", "merge: the change reaches the host project", mg)

    # status, list, info
    st = c.status(WHO)
    ok(isinstance(st, cc.Status) and st.state == "running" and st.identity == WHO and st.sandbox == r.sandbox
       and st.active == 0, "status: typed, the identity's running sandbox", st)
    ok(c.status(OTHER).state == "none", "status of an identity with no sandbox: none (nothing created)")
    ls = c.list()
    ok(ls.capacity == 1 and [s.identity for s in ls.sandboxes] == [WHO] and ls.warm_pool["size"] == 0,
       "list: typed sandboxes and capacity", ls)
    info = c.info()
    ok(info.pid == SERVER.pid and info.home == HOME and info.transfer_dirs == [os.path.realpath(XFER)] and
       info.workspace == os.path.realpath(PROJ) and info.inline_max == 16 * 1024 * 1024 and
       info["capacity"] == 1, "info: typed controller settings", info)

    # cancellation, sync
    ev = threading.Event()
    threading.Timer(0.5, ev.set).start()
    t0 = time.time()
    e, why = raises(lambda: c.exec(WHO, ["sleep", "60"], cancel=ev), Cancelled)
    took = time.time() - t0
    ok(e is not None and e.code == -32800 and not isinstance(e, CallTimeout) and took < 10,
       f"a cancel token set: Cancelled -32800 ({took:.1f} s)", why or repr(e))
    t0 = time.time()
    e, why = raises(lambda: c.exec(WHO, ["sleep", "60"], call_timeout=0.5), CallTimeout)
    took = time.time() - t0
    ok(e is not None and e.code == -32800 and isinstance(e, Cancelled) and took < 10,
       f"call_timeout: CallTimeout (a Cancelled) once the server cancelled it ({took:.1f} s)", why or repr(e))
    call = c.submit("exec", {"identity": WHO.to_json(), "argv": ["sleep", "60"]})
    threading.Timer(0.5, call.cancel).start()
    e, why = raises(lambda: call.result(20), Cancelled)
    ok(e is not None and e.code == -32800, "Call.cancel() from another thread: Cancelled", why or repr(e))
    r = c.exec(WHO, ["sh", "-c", "pgrep -x sleep || echo none"])
    ok(r.stdout == "none\n" and c.status(WHO).active == 0,
       "after the cancellations the sandbox is usable and no sleep is left", r)

    # several threads on one connection: answers matched by id
    results = {}

    def worker(i):
        try:
            if i % 2:
                results[i] = c.exec(WHO, ["echo", str(i)]).stdout
            else:
                results[i] = c.status(WHO).state + str(i)
        except Exception as ex:  # shown in the detail
            results[i] = repr(ex)
    slow = c.submit("exec", {"identity": WHO.to_json(), "argv": ["sleep", "1"]})
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = {i: (f"{i}\n" if i % 2 else f"running{i}") for i in range(12)}
    ok(results == want and slow.result(30)["exit_code"] == 0,
       "12 threads on one Client, calls interleaved with a slow one: each gets its own answer", results)

    # the CLI
    p = subprocess.run([sys.executable, "-m", "capsule_client", SOCK, "status",
                        json.dumps({"identity": WHO.to_json()})], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=CLIENT_SRC), timeout=30)
    ok(p.returncode == 0 and json.loads(p.stdout)["state"] == "running",
       "python3 -m capsule_client SOCKET status JSON prints the result", p.stdout + p.stderr)
    p = subprocess.run([sys.executable, "-m", "capsule_client", SOCK, "no.such"], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=CLIENT_SRC), timeout=30)
    ok(p.returncode == 1 and json.loads(p.stdout)["code"] == -32601,
       "the CLI prints an error answer's error object and exits 1", p.stdout + p.stderr)


async def async_tests():
    async with await AsyncClient.connect(SOCK) as ac:
        r = await ac.exec(WHO, ["echo", "async"])
        ok(isinstance(r, cc.ExecResult) and r.stdout == "async\n", "async: exec, typed", r)
        rs = await asyncio.gather(ac.exec(WHO, ["echo", "1"]), ac.status(WHO), ac.info(), ac.exec(WHO, ["echo", "2"]))
        ok(rs[0].stdout == "1\n" and rs[1].state == "running" and rs[2].capacity == 1 and rs[3].stdout == "2\n",
           "async: gathered calls each get their own answer", rs)
        try:
            await ac.read_file(WHO, "/abs")
            e = None
        except InvalidParams as ex:
            e = ex
        ok(e is not None and e.code == -32602, "async: errors raise the same classes", e)

        task = asyncio.ensure_future(ac.exec(WHO, ["sh", "-c", "echo $$ > /work/apid; exec sleep 60"]))
        await asyncio.sleep(1.0)
        t0 = time.time()
        task.cancel()
        try:
            await task
            cancelled = False
        except asyncio.CancelledError:
            cancelled = True
        r = await ac.exec(WHO, ["sh", "-c", "kill -0 $(cat /work/apid) 2>/dev/null && echo alive || echo gone"],
                          call_timeout=20)
        took = time.time() - t0
        ok(cancelled and r.stdout == "gone\n" and took < 10,
           f"async: cancelling the task cancels the call on the server ({took:.1f} s)", (cancelled, r))
        try:
            await ac.exec(WHO, ["sleep", "60"], call_timeout=0.5)
            e = None
        except CallTimeout as ex:
            e = ex
        ok(e is not None and e.code == -32800, "async: call_timeout raises CallTimeout", e)
        ev = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, ev.set)
        try:
            await ac.exec(WHO, ["sleep", "60"], cancel=ev)
            e = None
        except Cancelled as ex:
            e = ex
        ok(e is not None and e.code == -32800 and not isinstance(e, CallTimeout),
           "async: an asyncio.Event cancel token", e)
        blob = os.urandom(100000)
        await ac.upload(WHO, "a.bin", blob)
        g = await ac.download(WHO, "a.bin")
        ok(g.content == blob, "async: upload and download round trip", g)


def real_prepare(c):
    """prepare on the real server (issue 17): every phase ends ready."""
    seen = []
    try:
        r = c.prepare(on_progress=seen.append, call_timeout=600)
    except MethodNotFound:
        ok(False, "the server answers prepare (-32601: not there yet)")
        return
    ready = [p.phase for p in seen if p.status == "ready"]
    dones = [p.done for p in seen]
    ok(r.prepared is True and ready == ["kernel", "initramfs", "image", "template"] and
       dones == sorted(dones) and dones[-1] == 4 and r.kernel and r.image and isinstance(r.built, list),
       "prepare on the real server: progress per phase in order, then a typed result", (r, seen))


SERVER = None
try:
    print(f"1..{PLAN}", flush=True)
    os.makedirs(XFER)
    os.makedirs(PROJ)
    with open(os.path.join(PROJ, "README.md"), "w") as fh:
        fh.write("# p\n")
    fake_tests()
    durable_tests()
    rough_tests()
    SERVER = start_server()
    with Client(SOCK, call_timeout=120) as client:
        real_tests(client)
        asyncio.run(async_tests())
        real_prepare(client)
        rm = client.stop(WHO)
        ok(rm.state == "stopped" and client.status(WHO).state == "stopped", "stop: the VM stops, its disks stay", rm)
        rm = client.remove(WHO)
        ok(rm.state == "removed" and client.status(WHO).state == "none", "remove: the sandbox is gone", rm)
except Exception as ex:  # a crash is a failure, counted by the runner
    print(f"# test-pyclient crashed: {ex!r}", flush=True)
    import traceback
    traceback.print_exc()
finally:
    stop_server(SERVER)
    if failed or n != PLAN:
        print(f"# serve log: {LOG}", flush=True)
        for line in open(LOG, errors="replace").read().splitlines()[-20:] if os.path.exists(LOG) else []:
            print(f"# {line}", flush=True)
    else:
        subprocess.run(["rm", "-rf", RT])
sys.exit(1 if failed or n != PLAN else 0)
