#!/usr/bin/env python3
"""Run a command in an identity's sandbox, then one that is cancelled.

    python3 examples/exec.py $CAPSULE_HOME/serve.sock
(with `capsule serve` running; PYTHONPATH=clients/python/src when the
package is not installed)."""
import sys
import threading

from capsule_client import Cancelled, CapsuleError, Client, Identity

sock = sys.argv[1]
who = Identity(agent="example", peer="alice")

with Client(sock) as c:
    r = c.exec(who, ["sh", "-c", "uname -a; echo hello from $(hostname)"], timeout=30)
    print(f"exit {r.exit_code} in {r.duration_ms} ms on {r.sandbox}:\n{r.stdout}", end="")

    # A long command, cancelled from another thread after a second: the
    # server kills its process group; the sandbox stays usable.
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    try:
        c.exec(who, ["sleep", "600"], cancel=stop)
    except Cancelled as e:
        print(f"cancelled: {e}")

    # A call that takes too long for us: cancelled too, CallTimeout raised.
    try:
        c.exec(who, ["sleep", "600"], call_timeout=2)
    except Cancelled as e:
        print(f"gave up: {e}")

    try:
        c.read_file(who, "../etc/shadow")
    except CapsuleError as e:
        print(f"refused: {type(e).__name__} {e.code}: {e.message} (retryable: {e.retryable})")

    print(c.status(who))
