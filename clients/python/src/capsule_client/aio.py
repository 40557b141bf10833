"""AsyncClient: the asyncio client. Cancelling the task that awaits a call
sends `cancel` for it to the server."""

import asyncio
import inspect
import itertools
import json
import logging
from typing import Any, AsyncIterator, Callable, Dict, Optional

from ._methods import LINE_MAX, Methods, ProgressCallback, id_ok, progress_of, result_of
from .errors import CallTimeout, Cancelled, ConnectionLost, InvalidRequest
from .types import Progress

log = logging.getLogger("capsule_client")

CANCEL_GRACE = 30.0
READ_LIMIT = 64 * 1024 * 1024   # an answer line: a 16 MiB download in base64 fits


class _Pending:
    __slots__ = ("future", "on_progress")

    def __init__(self, future: "asyncio.Future[Dict[str, Any]]", on_progress: Optional[ProgressCallback]):
        self.future = future
        self.on_progress = on_progress


class AsyncClient(Methods):
    """A connection to `capsule serve`: `client = await
    AsyncClient.connect(path)` or `async with await AsyncClient.connect(path)
    as client` (or `async with AsyncClient(path)`). Every method of Methods
    is awaited: `r = await client.exec(who, ["echo", "hi"])`."""

    def __init__(self, socket_path: str, *, call_timeout: Optional[float] = None):
        self.socket_path = socket_path
        self.call_timeout = call_timeout
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._ids = itertools.count(1)
        self._pending: Dict[Any, _Pending] = {}
        self._send_lock: Optional[asyncio.Lock] = None
        self._closed: Optional[str] = None
        self._background: set = set()

    @classmethod
    async def connect(cls, socket_path: str, *, call_timeout: Optional[float] = None) -> "AsyncClient":
        self = cls(socket_path, call_timeout=call_timeout)
        await self._open()
        return self

    async def _open(self) -> None:
        if self._writer is not None:
            return
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(self.socket_path, limit=READ_LIMIT)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to capsule serve at {self.socket_path}: {e} "
                                 f"(is `capsule serve` running with this --socket?)") from e
        self._send_lock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    # -- the wire -------------------------------------------------------------

    async def _send(self, method: str, params: Optional[Dict[str, Any]],
                    on_progress: Optional[ProgressCallback]) -> "tuple[int, asyncio.Future[Dict[str, Any]]]":
        if self._writer is None:
            raise ConnectionLost("the AsyncClient is not connected: use await AsyncClient.connect(path)")
        if self._closed:
            raise ConnectionLost(self._closed)
        id = next(self._ids)
        msg: Dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        line = json.dumps(msg, ensure_ascii=False).encode() + b"\n"
        if len(line) - 1 > LINE_MAX:
            raise InvalidRequest(-32600, f"the {method} request is {len(line) - 1} bytes, over the server's "
                                 f"line limit of {LINE_MAX}", {"local": True})
        fut: "asyncio.Future[Dict[str, Any]]" = asyncio.get_running_loop().create_future()
        self._pending[id] = _Pending(fut, on_progress)
        written = False
        try:
            assert self._send_lock is not None
            async with self._send_lock:
                self._writer.write(line)
                written = True
                await self._writer.drain()
        except OSError as e:
            self._pending.pop(id, None)
            self._lost(f"sending {method} to {self.socket_path} failed: {e}")
            raise ConnectionLost(self._closed or str(e)) from e
        except asyncio.CancelledError:
            # Cancelled waiting for the lock: nothing went out. Cancelled
            # in drain(): the request is out (or will be), so the server
            # is told to cancel it; its answer then clears the entry.
            if written and method != "cancel":
                self._spawn(self._send_cancel(id))
            else:
                self._pending.pop(id, None)
            raise
        return id, fut

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None, *,
                   call_timeout: Optional[float] = None, cancel: Optional[asyncio.Event] = None,
                   on_progress: Optional[ProgressCallback] = None) -> Any:
        """Any method by name: its result (the JSON object), or its error raised."""
        timeout = call_timeout if call_timeout is not None else self.call_timeout
        id, fut = await self._send(method, params, on_progress)
        waiters = {fut}
        token = None
        if cancel is not None:
            token = asyncio.ensure_future(cancel.wait())
            waiters.add(token)
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The task was cancelled: so is the call, on the server too.
            self._spawn(self._send_cancel(id))
            raise
        finally:
            if token is not None:
                token.cancel()
        if fut in done:
            return result_of(fut.result())
        why = "timeout" if cancel is None or not cancel.is_set() else "cancelled"
        await self._send_cancel(id)
        try:
            response = await asyncio.wait_for(asyncio.shield(fut), CANCEL_GRACE)
        except asyncio.TimeoutError:
            self._pending.pop(id, None)
            cls = CallTimeout if why == "timeout" else Cancelled
            raise cls(None, f"{method} (request {id}) was {why}, and the server did not confirm its "
                      f"cancellation within {CANCEL_GRACE:.0f} s") from None
        try:
            return result_of(response)
        except Cancelled as e:
            if why == "timeout":
                raise CallTimeout(e.code, f"{method} (request {id}) gave no answer within {timeout} s "
                                  f"and was cancelled", e.data) from None
            raise

    async def _send_cancel(self, id: int) -> None:
        if id not in self._pending or self._closed:
            return
        try:
            await self._send("cancel", {"id": id}, None)   # its answer is dropped
        except ConnectionLost:
            pass

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    def _invoke(self, method: str, params: Optional[Dict[str, Any]], wrap: Callable[[Any], Any],
                **opts: Any) -> Any:
        async def run() -> Any:
            return wrap(await self.call(method, params, **opts))
        return run()

    def prepare_stream(self, **opts: Any) -> "PrepareStream":
        """prepare, as an async iterator of its Progress notifications:
        `s = client.prepare_stream(); async for p in s: ...; r = await s`."""
        return PrepareStream(self, opts)

    async def _read_loop(self) -> None:
        why = "capsule serve closed the connection"
        assert self._reader is not None
        drop = True
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                if line.strip():
                    self._dispatch(json.loads(line))
            drop = False
        except ValueError as e:     # not JSON, or a line over READ_LIMIT
            why = f"capsule serve sent a line that could not be read ({e}); the connection is dropped"
        except OSError as e:
            why = f"the connection to capsule serve failed: {e}"
        except asyncio.CancelledError:
            why = self._closed or "the client closed the connection"
            drop = False
        except Exception as e:      # e.g. RecursionError: a line nested too deep
            why = (f"capsule serve sent a line this client could not handle ({type(e).__name__}: {e}); "
                   f"the connection is dropped")
            log.exception("reading from capsule serve at %s", self.socket_path)
        finally:
            # Whatever ended the loop, no caller waits for ever.
            self._lost(why)
            if drop and self._writer is not None:
                self._writer.close()

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        if "id" not in msg:
            p = progress_of(msg)
            if p is None or not id_ok(p.request):
                return
            pend = self._pending.get(p.request)
            if pend is not None and pend.on_progress is not None:
                try:
                    r = pend.on_progress(p)
                    if inspect.isawaitable(r):
                        self._spawn(r)
                except Exception:
                    log.exception("on_progress callback of request %s raised", p.request)
            return
        if "method" in msg:
            return
        id = msg.get("id")
        if not id_ok(id):
            id = None           # not an id this client sends: as id null (JSON-RPC)
        if id is None and "error" in msg:
            pend_all = list(self._pending.values())
            self._pending.clear()
            for pe in pend_all:
                if not pe.future.done():
                    pe.future.set_result(msg)
            return
        if id is None:
            return
        pend = self._pending.pop(id, None)
        if pend is not None and not pend.future.done():
            pend.future.set_result(msg)

    def _lost(self, why: str) -> None:
        if not self._closed:
            self._closed = why
        pend_all = list(self._pending.values())
        self._pending.clear()
        for pe in pend_all:
            if not pe.future.done():
                pe.future.set_result({"__lost__": self._closed})

    # -- lifetime -------------------------------------------------------------

    async def close(self) -> None:
        if not self._closed:
            self._closed = "the client closed the connection"
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._lost(self._closed)

    async def __aenter__(self) -> "AsyncClient":
        await self._open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class PrepareStream:
    """A running prepare: async-iterate its Progress, then await its result."""

    def __init__(self, client: AsyncClient, opts: Dict[str, Any]):
        self._queue: "asyncio.Queue[Progress]" = asyncio.Queue()
        self._task = asyncio.ensure_future(client.prepare(on_progress=self._queue.put_nowait, **opts))

    def __aiter__(self) -> AsyncIterator[Progress]:
        return self

    async def __anext__(self) -> Progress:
        while True:
            if not self._queue.empty():
                return self._queue.get_nowait()
            if self._task.done():
                raise StopAsyncIteration
            getter = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    def __await__(self) -> Any:
        return self._task.__await__()

    def cancel(self) -> None:
        """Cancel the prepare (the server is told)."""
        self._task.cancel()
