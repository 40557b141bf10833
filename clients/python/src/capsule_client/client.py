"""Client: the synchronous client. One connection, a reader thread; any
number of threads may call at once, each answer goes to its caller by id."""

import itertools
import json
import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional

from ._methods import LINE_MAX, Methods, ProgressCallback, id_ok, progress_of, result_of
from .errors import CallTimeout, Cancelled, ConnectionLost, InvalidRequest

log = logging.getLogger("capsule_client")

# How long a cancelled call waits for the server to confirm (a transfer's
# worker lets go of its sandbox connection first).
CANCEL_GRACE = 30.0


class Call:
    """A request sent and not yet answered: result() waits for it,
    cancel() asks the server to cancel it (from any thread)."""

    def __init__(self, client: "Client", id: int, method: str, on_progress: Optional[ProgressCallback]):
        self.id = id
        self.method = method
        self.on_progress = on_progress
        self._client = client
        self._done = threading.Event()
        self._response: Optional[Dict[str, Any]] = None
        self._cancel_sent = False

    def _finish(self, response: Dict[str, Any]) -> None:
        if not self._done.is_set():
            self._response = response
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Send `cancel` for this call (once; nothing if it is answered).
        The call then answers Cancelled, or its result if it finished first."""
        if self._done.is_set() or self._cancel_sent:
            return
        self._cancel_sent = True
        try:
            self._client.submit("cancel", {"id": self.id})
        except ConnectionLost:
            pass

    def response(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The raw response (None if it did not come within timeout)."""
        self._client._not_on_reader(self.method)
        self._done.wait(timeout)
        return self._response

    def result(self, timeout: Optional[float] = None, cancel: Any = None) -> Any:
        """The call's result, or its error raised. With timeout (seconds) or
        cancel (anything with is_set(), e.g. a threading.Event), the call is
        cancelled when the time is up or the token is set: Cancelled (or
        CallTimeout) is raised once the server confirms.

        Not from an on_progress callback: those run on the client's reader
        thread, which delivers the answer waited for (RuntimeError)."""
        self._client._not_on_reader(self.method)
        deadline = None if timeout is None else time.monotonic() + timeout
        why = None
        while True:
            if cancel is not None and cancel.is_set():
                why = "cancelled"
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                why = "timeout"
                break
            step = 0.05 if cancel is not None else left
            if self._done.wait(step if step is None else min(step, 3600)):
                return result_of(self._response)
        self.cancel()
        if not self._done.wait(CANCEL_GRACE):
            self._client._forget(self.id)
            cls = CallTimeout if why == "timeout" else Cancelled
            raise cls(None, f"{self.method} (request {self.id}) was {why}, and the server did not confirm "
                      f"its cancellation within {CANCEL_GRACE:.0f} s")
        try:
            return result_of(self._response)
        except Cancelled as e:
            if why == "timeout":
                raise CallTimeout(e.code, f"{self.method} (request {self.id}) gave no answer within "
                                  f"{timeout} s and was cancelled", e.data) from None
            raise


class Client(Methods):
    """A connection to `capsule serve` at socket_path (docs/serve.md).

    call_timeout: the default for every call (None: wait as long as the
    server works). Use as a context manager, or close() it. The typed
    methods (exec, read_file, ... prepare) are documented in Methods."""

    def __init__(self, socket_path: str, *, call_timeout: Optional[float] = None,
                 connect_timeout: float = 10.0):
        self.socket_path = socket_path
        self.call_timeout = call_timeout
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout)
            self._sock.connect(socket_path)
            self._sock.settimeout(None)
        except OSError as e:
            self._sock.close()
            raise ConnectionLost(f"cannot connect to capsule serve at {socket_path}: {e} "
                                 f"(is `capsule serve` running with this --socket?)") from e
        self._ids = itertools.count(1)
        self._lock = threading.Lock()          # pending, closed
        self._send_lock = threading.Lock()     # one line at a time on the socket
        self._pending: Dict[Any, Call] = {}
        self._closed: Optional[str] = None
        self._reader = threading.Thread(target=self._read_loop, name="capsule-client-reader", daemon=True)
        self._reader.start()

    # -- the wire -------------------------------------------------------------

    def submit(self, method: str, params: Optional[Dict[str, Any]] = None,
               on_progress: Optional[ProgressCallback] = None) -> Call:
        """Send a request without waiting for it: a Call to wait on or cancel."""
        with self._lock:
            id = next(self._ids)
            call = Call(self, id, method, on_progress)
            if self._closed:
                raise ConnectionLost(self._closed)
            self._pending[id] = call
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        line = json.dumps(msg, ensure_ascii=False).encode() + b"\n"
        if len(line) - 1 > LINE_MAX:
            self._forget(id)
            raise InvalidRequest(-32600, f"the {method} request is {len(line) - 1} bytes, over the server's "
                                 f"line limit of {LINE_MAX}", {"local": True})
        try:
            with self._send_lock:
                self._sock.sendall(line)
        except OSError as e:
            self._forget(id)
            self._lost(f"sending {method} to {self.socket_path} failed: {e}")
            raise ConnectionLost(self._closed or str(e)) from e
        return call

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
             call_timeout: Optional[float] = None, cancel: Any = None,
             on_progress: Optional[ProgressCallback] = None) -> Any:
        """Any method by name: its result (the JSON object), or its error raised."""
        self._not_on_reader(method)
        c = self.submit(method, params, on_progress)
        return c.result(call_timeout if call_timeout is not None else self.call_timeout, cancel)

    def _invoke(self, method: str, params: Optional[Dict[str, Any]], wrap: Callable[[Any], Any],
                **opts: Any) -> Any:
        return wrap(self.call(method, params, **opts))

    def _not_on_reader(self, method: str) -> None:
        # The reader thread runs the on_progress callbacks; waiting there
        # for an answer would wait for ever, since that thread reads it.
        if threading.current_thread() is self._reader:
            raise RuntimeError(f"{method}: a progress callback runs on the client's reader thread and must not "
                               f"wait for an answer; hand the work to another thread (submit() without "
                               f"waiting is fine)")

    def _forget(self, id: Any) -> None:
        with self._lock:
            self._pending.pop(id, None)

    def _read_loop(self) -> None:
        buf = b""
        why = "capsule serve closed the connection"
        drop = True
        try:
            while True:
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line, buf = buf[:nl], buf[nl + 1:]
                    if line.strip():
                        self._dispatch(json.loads(line))
            drop = False
        except ValueError as e:
            why = f"capsule serve sent a line that is not JSON ({e}); the connection is dropped"
        except OSError as e:
            why = f"the connection to capsule serve failed: {e}"
        except Exception as e:      # e.g. RecursionError: a line nested too deep
            why = (f"capsule serve sent a line this client could not handle ({type(e).__name__}: {e}); "
                   f"the connection is dropped")
            log.exception("reading from capsule serve at %s", self.socket_path)
        finally:
            # Whatever ended the loop, no caller waits for ever.
            self._lost(why)
            if drop:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if "id" not in msg:
            p = progress_of(msg)
            if p is None or not id_ok(p.request):
                return          # a notification this client does not know, or not for a request
            with self._lock:
                call = self._pending.get(p.request)
            if call is not None and call.on_progress is not None:
                try:
                    call.on_progress(p)
                except Exception:       # a callback's bug must not kill the reader
                    log.exception("on_progress callback of request %s raised", p.request)
            return
        if "method" in msg:
            return              # the server sends no requests
        id = msg.get("id")
        if not id_ok(id):
            id = None           # not an id this client sends: as id null (JSON-RPC)
        if id is None and "error" in msg:
            # The server could not read one of our lines as a request and
            # cannot say which: every waiting call gets the error.
            with self._lock:
                calls = list(self._pending.values())
                self._pending.clear()
            for c in calls:
                c._finish(msg)
            return
        if id is None:
            return
        with self._lock:
            call = self._pending.pop(id, None)
        if call is not None:
            call._finish(msg)

    def _lost(self, why: str) -> None:
        with self._lock:
            if not self._closed:
                self._closed = why
            calls = list(self._pending.values())
            self._pending.clear()
        for c in calls:
            c._finish({"__lost__": self._closed})

    # -- lifetime -------------------------------------------------------------

    def close(self) -> None:
        """Close the connection: the server cancels this connection's calls
        still running; waiting callers get ConnectionLost."""
        with self._lock:
            if not self._closed:
                self._closed = "the client closed the connection"
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not threading.current_thread():
            self._reader.join(5)
        self._sock.close()
        self._lost(self._closed or "closed")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
