#!/usr/bin/env python3
"""`capsule serve` with one identity whose sandbox is paused when idle and
resumed by its next call, under KVM (issue 31), for tests/kvm/suite.sh. In
real time with a lowered --idle-pause, as tests/integration/test-serve.py's
real-clock case does; that suite keeps the rest of serve (identities,
capacity, the manual clock, cancellation, the protocol), which does not
depend on the accelerator. What does is the shim's QMP stop and cont of a
KVM guest: the VM stays resident (same QEMU, memory kept, no CPU used), and
the next call finds it with /work as it was. TAP output.

  tests/kvm/check-serve.py BUILD/capsule [--expect-kvm]

With --expect-kvm or CAPSULE_REQUIRE_KVM=1, an accelerator other than KVM
fails every check."""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from servelib import Connection, Home, Server, Tap, call  # noqa: E402

CAPSULE = os.path.abspath(sys.argv[1])
EXPECT = os.environ.get("CAPSULE_REQUIRE_KVM") == "1" or "--expect-kvm" in sys.argv[2:]
PLAN = 9
PAUSE = 3       # --idle-pause (s); --idle-stop stays far away: paused is where it waits
IDENT = {"agent": "a", "peer": "kvm"}


def state(c):
    return call(c, "status", {"identity": IDENT}, 30).get("result", {}).get("state")


def wait_state(c, want, seconds):
    deadline = time.time() + seconds
    s = state(c)
    while s != want and time.time() < deadline:
        time.sleep(0.1)
        s = state(c)
    return s


def exec_(c, script, timeout=120):
    return call(c, "exec", {"identity": IDENT, "argv": ["sh", "-c", script]}, timeout).get("result", {})


def runtime(home, name):
    try:
        with open(os.path.join(home.home, "sandboxes", name, "runtime.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def cpu_ticks(pid):
    """utime + stime of a process, in clock ticks (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid):
    return pid is not None and cpu_ticks(pid) is not None


def main():
    t = Tap()
    home = Home("kserve.")
    print(f"1..{PLAN}", flush=True)
    d = subprocess.run([CAPSULE, "doctor", "--json"], env=home.env, capture_output=True, text=True)
    try:
        a = json.loads(d.stdout)["accel"]
        accel = a.get("name") or "none"
        why = a.get("error") or a.get("reason")
    except (ValueError, KeyError, TypeError, AttributeError):
        accel, why = "unknown", d.stderr.strip()
    print(f"# accel: {accel}" + (f" ({why})" if accel != "kvm" and why else ""), flush=True)
    if EXPECT:
        t.ok(accel == "kvm", "the accelerator is kvm (doctor --json)", d.stderr)
        if accel != "kvm":
            while t.n < PLAN:
                t.ok(False, f"KVM serve checks: the accelerator is {accel}, not kvm")
            shutil.rmtree(home.rt, ignore_errors=True)
            return 1
    else:
        t.ok(True, f"the accelerator is {accel} (kvm not required: no --expect-kvm or CAPSULE_REQUIRE_KVM=1)")
    s = name = None
    try:
        b = subprocess.run([CAPSULE, "image", "build", "base"], env=home.env, capture_output=True, text=True)
        s = Server(CAPSULE, home, "--idle-pause", str(PAUSE), "--idle-stop", "600")
        c = Connection(home.sock, timeout=180)
        r = exec_(c, "echo kept > /work/f; sync; echo hello", 300)
        name = r.get("sandbox")
        t.ok(b.returncode == 0 and r.get("stdout") == "hello\n" and r.get("exit_code") == 0 and name,
             "the identity's first call creates its sandbox and answers", [b.stderr[-500:], r, home.log_tail()])
        t.elapsed("first call (the template built, or found shared)")
        qemu = home.runtime_qemu(name) if name else None
        try:
            args = open(f"/proc/{qemu}/cmdline", "rb").read().split(b"\0")
            accel_arg = args[args.index(b"-accel") + 1].decode()
        except (OSError, ValueError, IndexError, TypeError):
            accel_arg = None
        print(f"# its QEMU {qemu}: -accel {accel_arg}", flush=True)
        if accel == "kvm":
            t.ok(accel_arg == "kvm", "its QEMU runs with -accel kvm", accel_arg)
        else:
            print(f"ok {t.n + 1} - its QEMU runs with -accel kvm # SKIP the accelerator is {accel}", flush=True)
            t.n += 1

        t0 = time.time()
        got = wait_state(c, "paused", PAUSE + 30)
        took = time.time() - t0
        rt = {}
        deadline = time.time() + 5
        while time.time() < deadline and not (rt := runtime(home, name)).get("paused"):
            time.sleep(0.1)
        t.ok(got == "paused" and PAUSE - 0.5 <= took <= PAUSE + 10 and rt.get("paused") is True and alive(qemu),
             f"idle: paused after {took:.1f} s (--idle-pause {PAUSE}), by the shim (QMP stop), its QEMU still there",
             [got, rt])
        a = cpu_ticks(qemu)
        time.sleep(3)
        z = cpu_ticks(qemu)
        hz = os.sysconf("SC_CLK_TCK")
        used = (z - a) / hz / 3 if a is not None and z is not None else None
        print(f"# paused QEMU's CPU: {used if used is None else round(used * 100, 1)} % of a CPU over 3 s", flush=True)
        t.ok(used is not None and used < 0.2, "the paused VM's QEMU uses under 20 % of a CPU", used)
        time.sleep(2)   # paused for a while: the guest's clock must catch up on resume

        t0 = time.time()
        r = exec_(c, "cat /work/f; date +%s")
        took = time.time() - t0
        out = r.get("stdout", "").split("\n")
        t.ok(out[:1] == ["kept"] and r.get("exit_code") == 0 and state(c) == "running",
             f"the next call resumes it and answers with /work intact ({took * 1000:.0f} ms)", [r, home.log_tail()])
        t.ok(home.runtime_qemu(name) == qemu and alive(qemu),
             "resumed, not restarted: the same QEMU", [qemu, home.runtime_qemu(name)])
        try:
            skew = time.time() - int(out[1])
        except (IndexError, ValueError):
            skew = None
        print(f"# the guest's clock after the resume: {skew if skew is None else round(skew, 1)} s behind the host's",
              flush=True)
        t.ok(skew is not None and abs(skew) < 3, "the resumed guest's clock is the host's (within 3 s)", skew)
        c.close()
        rc = s.term()
        s = None
        t.ok(rc == 0 and not home.qemu_pids(), f"SIGTERM: serve exits 0 ({rc}), no QEMU left", home.qemu_pids())
    except Exception as e:  # noqa: BLE001  (a broken step fails the rest, never stalls)
        while t.n < PLAN:
            t.ok(False, f"KVM serve checks: {e!r}", home.log_tail())
    finally:
        if s is not None:
            s.kill()
        if name:
            subprocess.run(["pkill", "-KILL", "-f", f"capsule shim --ready-fd=3 {name}$"])
        subprocess.run(["pkill", "-KILL", "-f", f"qemu-system.*{home.home}/"])
        time.sleep(0.3)
        if t.failed:
            for line in home.log_tail(30).splitlines():
                print(f"# serve.log: {line}", flush=True)
        shutil.rmtree(home.rt, ignore_errors=True)
    t.elapsed("all done")
    if t.n != PLAN:
        print(f"# plan says {PLAN}, ran {t.n}", flush=True)
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
