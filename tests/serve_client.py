#!/usr/bin/env python3
"""A small JSON-RPC 2.0 client for `capsule serve` (one message per line on
a unix socket). As a program:

    serve_client.py SOCKET METHOD '{"identity": {"agent": "a", "peer": "p1"}, ...}'

prints the response. As a module: Client(path).call(method, params) returns
the response (a dict with "result" or "error"); it raises socket.timeout
when the server says nothing for `timeout` seconds, EOFError when it closes
the connection.

An error whose id is null answers a line the server could not read as a
request (not JSON, over 24 MiB): the client cannot tell which request that
was, so wait() and call() return it to whoever is waiting (the usual case:
one request in flight) instead of waiting forever for an answer that will
not come."""
import json
import socket
import sys


class Client:
    def __init__(self, path, timeout=120):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.pending = {}

    def send(self, method, params=None, id=None):
        """Send a request without waiting; returns its id."""
        if id is None:
            id = self.next_id
            self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        return id

    def notify(self, method, params=None):
        """Send a notification (no id): the server must not answer it."""
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def send_raw(self, data):
        self.sock.sendall(data)

    def read(self):
        """The next message from the server."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def wait(self, id):
        """The response to request id (others are kept for later), or an
        error with id null (see above) if one comes first."""
        while id not in self.pending:
            m = self.read()
            if m.get("id") is None and "error" in m:
                return m
            self.pending[m.get("id")] = m
        return self.pending.pop(id)

    def call(self, method, params=None):
        return self.wait(self.send(method, params))

    def close(self):
        self.sock.close()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: serve_client.py SOCKET METHOD [JSON-PARAMS]")
    c = Client(sys.argv[1])
    params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(c.call(sys.argv[2], params)))
