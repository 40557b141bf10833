"""The wire, unadorned: one JSON-RPC 2.0 message per line on the unix
socket of `capsule serve`. For protocol tests and debugging; programs use
Client or AsyncClient.

Connection(path).call(method, params) returns the response as a dict
(with "result" or "error"); it raises socket.timeout when the server says
nothing for `timeout` seconds and EOFError when it closes the connection.
Notifications from the server (`progress`) are not responses: read()
skips them and keeps them, in order, in .notifications.

An error whose id is null answers a line the server could not read as a
request (not JSON, over 24 MiB): the client cannot tell which request that
was, so wait() and call() return it to whoever is waiting (the usual case:
one request in flight) instead of waiting forever for an answer that will
not come."""

import json
import socket
from typing import Any, Dict, List, Optional


class Connection:
    def __init__(self, path: str, timeout: Optional[float] = 120):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.buf = b""
        self.next_id = 1
        self.pending: Dict[Any, dict] = {}
        self.notifications: List[dict] = []

    def send(self, method: str, params: Any = None, id: Any = None) -> Any:
        """Send a request without waiting; returns its id."""
        if id is None:
            id = self.next_id
            self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        return id

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no id): the server must not answer it."""
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_message(self) -> dict:
        """The next message from the server, notifications included."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def read(self) -> dict:
        """The next response (notifications are kept in .notifications)."""
        while True:
            m = self.read_message()
            if "method" in m and "id" not in m:
                self.notifications.append(m)
                continue
            return m

    def wait(self, id: Any) -> dict:
        """The response to request id (others are kept for later), or an
        error with id null (see above) if one comes first."""
        while id not in self.pending:
            m = self.read()
            if m.get("id") is None and "error" in m:
                return m
            self.pending[m.get("id")] = m
        return self.pending.pop(id)

    def call(self, method: str, params: Any = None) -> dict:
        return self.wait(self.send(method, params))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
