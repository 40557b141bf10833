"""What the Python suites and benches that drive `capsule serve` share: a
private home and socket, serve started and stopped, a TAP counter, a call
that reports a silent server instead of raising, the QEMU processes of a
home, and a pool of workers over one socket each. Every wait is bounded."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
from capsule_client import Connection  # noqa: E402,F401  (the bare wire: these suites speak the protocol)


class Tap:
    """ok() numbers each check and prints it; a failed one prints detail."""

    def __init__(self):
        self.n = 0
        self.failed = 0
        self.start = time.time()

    def ok(self, cond, name, detail=""):
        self.n += 1
        if cond:
            print(f"ok {self.n} - {name}", flush=True)
        else:
            self.failed += 1
            print(f"not ok {self.n} - {name}", flush=True)
            for line in str(detail).splitlines()[:20]:
                print(f"# {line}", flush=True)

    def elapsed(self, what):
        print(f"# {what} after {time.time() - self.start:.1f} s", flush=True)


class Home:
    """A private run directory: home, socket, serve's log, the environment."""

    def __init__(self, prefix):
        self.rt = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        self.home = os.path.join(self.rt, "home")
        self.sock = os.path.join(self.rt, "serve.sock")
        self.log = os.path.join(self.rt, "serve.log")
        self.env = dict(os.environ, CAPSULE_HOME=self.home, XDG_RUNTIME_DIR=self.rt)
        # CAPSULE_TEST_TEMPLATES: a templates directory the suites share, as in lib.sh.
        shared = os.environ.get("CAPSULE_TEST_TEMPLATES")
        if shared:
            os.makedirs(self.home, exist_ok=True)
            os.makedirs(shared, exist_ok=True)
            os.symlink(shared, os.path.join(self.home, "templates"))

    def runtime_qemu(self, name):
        """The QEMU pid a running sandbox's runtime.json names, or None."""
        try:
            with open(os.path.join(self.home, "sandboxes", name, "runtime.json")) as f:
                return json.load(f).get("qemu_pid")
        except (OSError, ValueError):
            return None

    def qemu_pids(self):
        """Every QEMU process of this home, sorted."""
        out = subprocess.run(["pgrep", "-f", f"qemu-system.*{self.home}/"], capture_output=True, text=True).stdout
        return sorted(int(p) for p in out.split())

    def log_tail(self, lines=15):
        try:
            with open(self.log, errors="replace") as f:
                return "\n".join(f.read().splitlines()[-lines:])
        except OSError:
            return ""


class Server:
    """capsule serve on a Home's socket, with args; raises when it does
    not answer within 30 s."""

    def __init__(self, capsule, home, *args):
        self.home = home
        self.logf = open(home.log, "a")
        self.proc = subprocess.Popen([capsule, "serve", "--socket", home.sock, *args], env=home.env,
                                     stdout=self.logf, stderr=self.logf)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"capsule serve exited with {self.proc.returncode}: {home.log_tail()}")
            try:
                Connection(home.sock, timeout=5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("capsule serve did not start within 30 s")

    def term(self, timeout=60):
        """SIGTERM, then its exit code, or "hung" (then SIGKILL)."""
        self.proc.send_signal(signal.SIGTERM)
        return wait_or_kill(self.proc, timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_or_kill(proc, timeout):
    """proc's exit code within timeout s, else SIGKILL and "hung"."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "hung"


def call(c, method, params=None, timeout=None):
    """c.call that reports a silent or closed server as an answer
    {"exception": ...} instead of raising; timeout (s) for this call only."""
    old = c.sock.gettimeout()
    if timeout is not None:
        c.sock.settimeout(timeout)
    try:
        return c.call(method, params)
    except (OSError, EOFError, ValueError) as e:
        return {"exception": repr(e)}
    finally:
        c.sock.settimeout(old)


def run_workers(sock, jobs, fn, conc, timeout=120):
    """fn(connection, job) for every job, conc at a time, each worker on a
    connection of its own."""
    q = list(jobs)
    lock = threading.Lock()

    def worker():
        c = Connection(sock, timeout=timeout)
        while True:
            with lock:
                if not q:
                    break
                job = q.pop()
            fn(c, job)
        c.close()

    th = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
